// Polynomial transcendental functions for float32 and libm calls for float64.
#include "backend/cpu/math.h"

#include <cmath>

#include "llvm/IR/Intrinsics.h"

namespace loom::cpu {

using llvm::Value;

Value* Math::c(double v) { return llvm::ConstantFP::get(b_.getFloatTy(), v); }

// Horner: coeffs from the highest power down.
Value* Math::poly(Value* x, std::initializer_list<double> coeffs) {
  Value* r = nullptr;
  for (double k : coeffs) r = r ? fmuladd(r, x, c(k)) : c(k);
  return r;
}

// a * b + c as one fused multiply-add where the CPU has one: the fast code generator forms
// none from a multiply and an add itself.
Value* Math::fmuladd(Value* a, Value* b, Value* c) {
  return b_.CreateIntrinsic(llvm::Intrinsic::fmuladd, {a->getType()}, {a, b, c});
}

Value* Math::libm(const char* name, Value* x) {
  auto* d = b_.getDoubleTy();
  llvm::FunctionCallee f = m_.getOrInsertFunction(name, llvm::FunctionType::get(d, {d}, false));
  return b_.CreateCall(f, {x});
}

Value* Math::exp_f32(Value* x) {
  auto* f32 = b_.getFloatTy();
  auto* i32 = b_.getInt32Ty();
  // Clamped so that n stays in [-150, 128]; the two-factor scale below covers it exactly.
  Value* xc = b_.CreateMinNum(b_.CreateMaxNum(x, c(-104.0)), c(88.8));
  Value* n =
      b_.CreateUnaryIntrinsic(llvm::Intrinsic::rint, b_.CreateFMul(xc, c(1.44269504088896341)));
  Value* r = fmuladd(n, c(-0.693359375), xc);
  r = fmuladd(n, c(2.12194440e-4), r);
  Value* p = poly(r, {1.9875691500E-4, 1.3981999507E-3, 8.3334519073E-3, 4.1665795894E-2,
                      1.6666665459E-1, 5.0000001201E-1});
  Value* e = b_.CreateFAdd(fmuladd(b_.CreateFMul(p, r), r, r), c(1.0));
  Value* ni = b_.CreateFPToSI(n, i32);
  Value* h = b_.CreateAShr(ni, 1);
  auto pow2 = [&](Value* k) {  // 2^k for k in [-126, 127]
    return b_.CreateBitCast(b_.CreateShl(b_.CreateAdd(k, b_.getInt32(127)), 23), f32);
  };
  Value* res = b_.CreateFMul(b_.CreateFMul(e, pow2(h)), pow2(b_.CreateSub(ni, h)));
  return b_.CreateSelect(b_.CreateFCmpUNO(x, x), x, res);
}

Value* Math::exp(Value* x) {
  if (x->getType()->isDoubleTy()) return b_.CreateUnaryIntrinsic(llvm::Intrinsic::exp, x);
  return exp_f32(x);
}

Value* Math::log(Value* x) {
  if (x->getType()->isDoubleTy()) return b_.CreateUnaryIntrinsic(llvm::Intrinsic::log, x);
  auto* f32 = b_.getFloatTy();
  auto* i32 = b_.getInt32Ty();
  // Subnormals are scaled into the normal range first.
  Value* tiny = b_.CreateFCmpOLT(x, c(1.17549435e-38));
  Value* xs = b_.CreateSelect(tiny, b_.CreateFMul(x, c(8388608.0)), x);  // 2^23
  Value* bits = b_.CreateBitCast(xs, i32);
  Value* e = b_.CreateSub(b_.CreateLShr(bits, 23), b_.getInt32(126));  // m in [0.5, 1)
  e = b_.CreateSub(e, b_.CreateSelect(tiny, b_.getInt32(23), b_.getInt32(0)));
  Value* m = b_.CreateBitCast(
      b_.CreateOr(b_.CreateAnd(bits, b_.getInt32(0x007fffff)), b_.getInt32(0x3f000000)), f32);
  Value* small = b_.CreateFCmpOLT(m, c(0.707106781186547524));
  Value* ef = b_.CreateSIToFP(b_.CreateSub(e, b_.CreateZExt(small, i32)), f32);
  m = b_.CreateFSub(b_.CreateSelect(small, b_.CreateFAdd(m, m), m), c(1.0));
  Value* z = b_.CreateFMul(m, m);
  Value* y = poly(
      m, {7.0376836292E-2, -1.1514610310E-1, 1.1676998740E-1, -1.2420140846E-1, 1.4249322787E-1,
          -1.6668057665E-1, 2.0000714765E-1, -2.4999993993E-1, 3.3333331174E-1});
  y = b_.CreateFMul(b_.CreateFMul(y, m), z);
  y = fmuladd(ef, c(-2.12194440e-4), y);
  y = fmuladd(z, c(-0.5), y);
  Value* r = fmuladd(ef, c(0.693359375), b_.CreateFAdd(m, y));
  // log(0) = -inf, log(x < 0) = NaN, log(inf) = inf, log(NaN) = NaN.
  r = b_.CreateSelect(b_.CreateFCmpOEQ(x, c(0.0)), c(-INFINITY), r);
  r = b_.CreateSelect(b_.CreateFCmpOLT(x, c(0.0)), c(NAN), r);
  r = b_.CreateSelect(b_.CreateFCmpOEQ(x, c(INFINITY)), x, r);
  return b_.CreateSelect(b_.CreateFCmpUNO(x, x), x, r);
}

Value* Math::tanh(Value* x) {
  if (x->getType()->isDoubleTy()) return libm("tanh", x);
  Value* ax = b_.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, x);
  Value* z = b_.CreateFMul(x, x);
  Value* small = b_.CreateFAdd(
      b_.CreateFMul(b_.CreateFMul(poly(z, {-5.70498872745E-3, 2.06390887954E-2, -5.37397155531E-2,
                                           1.33314422036E-1, -3.33332819422E-1}),
                                  z),
                    x),
      x);
  Value* e = exp_f32(b_.CreateFMul(ax, c(2.0)));
  Value* big = b_.CreateFSub(c(1.0), b_.CreateFDiv(c(2.0), b_.CreateFAdd(e, c(1.0))));
  big = b_.CreateCopySign(big, x);
  Value* r = b_.CreateSelect(b_.CreateFCmpOLT(ax, c(0.625)), small, big);
  return b_.CreateSelect(b_.CreateFCmpUNO(x, x), x, r);
}

Value* Math::erf(Value* x) {
  if (x->getType()->isDoubleTy()) return libm("erf", x);
  Value* xc = b_.CreateMinNum(b_.CreateMaxNum(x, c(-4.0)), c(4.0));
  Value* x2 = b_.CreateFMul(xc, xc);
  Value* p = poly(x2, {-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
                       -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
                       -1.60960333262415e-02});
  Value* q = poly(x2, {-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
                       -7.37332916720468e-03, -1.42647390514189e-02});
  Value* r = b_.CreateFDiv(b_.CreateFMul(xc, p), q);
  return b_.CreateSelect(b_.CreateFCmpUNO(x, x), x, r);
}

}  // namespace loom::cpu
