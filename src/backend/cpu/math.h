// Transcendental functions for generated code. float32 uses branch-free polynomial forms
// that the loop vectorizer turns into AVX-512 code (libm calls would keep loops scalar):
// exp and log after Cephes (max rel. error ~1e-7 measured), tanh from a polynomial below
// |x| = 0.625 and from exp above, erf as Eigen's rational form on [-4, 4] (abs. error
// 3.7e-7), sin and cos by an exact reduction modulo pi/2 in float64 (a table of 2^e 2/pi mod
// 4 per exponent) and fdlibm's float64 kernels (within 1 ulp for every float32). float64 exp,
// log and tanh are fdlibm's forms (under 1 ulp, tanh 2), float32 pow goes through exp and log;
// float64 erf, sin, cos and pow call libm. NaN and infinities behave as in C.
#pragma once

#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/Module.h"

namespace loom::cpu {

class Math {
 public:
  // `group`, where given, points at the access group of the loop being emitted (null outside
  // parallel loops): the table loads of sin and cos join it, or the vectorizer would need
  // bounds for them.
  Math(llvm::IRBuilder<>& b, llvm::Module& m, llvm::MDNode* const* group = nullptr)
      : b_(b), m_(m), group_(group) {}
  llvm::Value* exp(llvm::Value* x);
  llvm::Value* log(llvm::Value* x);
  llvm::Value* tanh(llvm::Value* x);
  llvm::Value* erf(llvm::Value* x);
  llvm::Value* pow(llvm::Value* x, llvm::Value* y);
  llvm::Value* sin(llvm::Value* x);
  llvm::Value* cos(llvm::Value* x);
  // a * x + y rounded once (llvm.fma: always fused, unlike fmuladd), and a float64 polynomial
  // by Horner's rule in such steps, coefficients from the lowest power.
  llvm::Value* fma(llvm::Value* a, llvm::Value* x, llvm::Value* y);
  llvm::Value* horner(llvm::ArrayRef<double> coeffs, llvm::Value* z);
  // log(f 2^e) in float64 for f in [1, 2), e an integer value (see math.cpp).
  llvm::Value* log_f64_reduced(llvm::Value* f, llvm::Value* e);
  // sin and cos of a float64 x in [-pi/4, pi/4]: fdlibm's kernels (philox.h's NormalConstants),
  // all six terms of their polynomials (under 1 float64 ulp) or the first `terms`.
  llvm::Value* sin_kernel(llvm::Value* x, int terms = 6);
  llvm::Value* cos_kernel(llvm::Value* x, int terms = 6);

 private:
  llvm::Value* c(double v);
  llvm::Value* fmuladd(llvm::Value* a, llvm::Value* b, llvm::Value* c);
  llvm::Value* poly(llvm::Value* x, std::initializer_list<double> coeffs);
  llvm::Value* libm(const char* name, llvm::Value* x);
  llvm::Value* exp_f32(llvm::Value* x);
  llvm::Value* scale_by_pow2(llvm::Value* y, llvm::Value* n);
  llvm::Value* d(double v);
  llvm::Value* exp_f64(llvm::Value* x);
  llvm::Value* log_f64(llvm::Value* x);
  llvm::Value* expm1_f64_small(llvm::Value* u);
  llvm::Value* tanh_f64(llvm::Value* x);
  llvm::Value* sin_cos_f32(llvm::Value* x, bool cosine);
  llvm::Value* reduction_table_at(llvm::Value* index);

  llvm::IRBuilder<>& b_;
  llvm::Module& m_;
  llvm::MDNode* const* group_;
};

}  // namespace loom::cpu
