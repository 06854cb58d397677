// Polynomial transcendental functions for float32, exp, log and tanh for float64 (float32's pow
// goes through them), libm calls for the other float64 ones.
#include "backend/cpu/math.h"

#include <array>
#include <cmath>
#include <cstdint>

#include "llvm/IR/Intrinsics.h"
#include "loom/core/philox.h"

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

// y 2^n for an integral float n whose halves each give a normal power of two (|n| up to twice
// the exponent range): two exact factors, so results reach the subnormals and overflow to inf.
Value* Math::scale_by_pow2(Value* y, Value* n) {
  const bool f64 = y->getType()->isDoubleTy();
  llvm::Type* it = f64 ? b_.getInt64Ty() : b_.getInt32Ty();
  Value* ni = b_.CreateFPToSI(n, it);
  Value* h = b_.CreateAShr(ni, 1);
  auto pow2 = [&](Value* k) {
    Value* biased = b_.CreateAdd(k, llvm::ConstantInt::get(it, f64 ? 1023 : 127));
    return b_.CreateBitCast(b_.CreateShl(biased, f64 ? 52 : 23), y->getType());
  };
  return b_.CreateFMul(b_.CreateFMul(y, pow2(h)), pow2(b_.CreateSub(ni, h)));
}

Value* Math::exp_f32(Value* x) {
  // Clamped so that n stays in [-150, 128]; scale_by_pow2 covers it exactly.
  Value* xc = b_.CreateMinNum(b_.CreateMaxNum(x, c(-104.0)), c(88.8));
  Value* n =
      b_.CreateUnaryIntrinsic(llvm::Intrinsic::rint, b_.CreateFMul(xc, c(1.44269504088896341)));
  Value* r = fmuladd(n, c(-0.693359375), xc);
  r = fmuladd(n, c(2.12194440e-4), r);
  Value* p = poly(r, {1.9875691500E-4, 1.3981999507E-3, 8.3334519073E-3, 4.1665795894E-2,
                      1.6666665459E-1, 5.0000001201E-1});
  Value* e = b_.CreateFAdd(fmuladd(b_.CreateFMul(p, r), r, r), c(1.0));
  return b_.CreateSelect(b_.CreateFCmpUNO(x, x), x, scale_by_pow2(e, n));
}

Value* Math::d(double v) { return llvm::ConstantFP::get(b_.getDoubleTy(), v); }

Value* Math::fma(Value* a, Value* x, Value* y) {
  return b_.CreateIntrinsic(llvm::Intrinsic::fma, {a->getType()}, {a, x, y});
}

Value* Math::horner(llvm::ArrayRef<double> coeffs, Value* z) {
  Value* r = d(coeffs.back());
  for (size_t i = coeffs.size() - 1; i-- > 0;) r = fma(r, z, d(coeffs[i]));
  return r;
}

// fdlibm's exp: k = rint(x / ln 2), r = x - k ln 2 in two parts, exp(r) = 1 + r + r c / (2 - c)
// with c = r - r^2 P(r^2) (minimax, error under 1 ulp), scaled by 2^k in two factors so that
// results reach the subnormal range and overflow to inf.
Value* Math::exp_f64(Value* x) {
  Value* xc = b_.CreateMinNum(b_.CreateMaxNum(x, d(-1000.0)), d(1000.0));
  Value* k = b_.CreateUnaryIntrinsic(llvm::Intrinsic::rint,
                                     b_.CreateFMul(xc, d(1.44269504088896338700e+00)));
  Value* hi = fmuladd(k, d(-6.93147180369123816490e-01), xc);  // k ln2_hi is exact
  Value* lo = b_.CreateFMul(k, d(1.90821492927058770002e-10));
  Value* r = b_.CreateFSub(hi, lo);
  Value* t = b_.CreateFMul(r, r);
  Value* c = b_.CreateFSub(
      r, b_.CreateFMul(t, horner({1.66666666666666019037e-01, -2.77777777770155933842e-03,
                                  6.61375632143793436117e-05, -1.65339022054652515390e-06,
                                  4.13813679705723846039e-08},
                                 t)));
  Value* y = b_.CreateFSub(
      d(1.0),
      b_.CreateFSub(b_.CreateFSub(lo, b_.CreateFDiv(b_.CreateFMul(r, c), b_.CreateFSub(d(2.0), c))),
                    hi));
  return b_.CreateSelect(b_.CreateFCmpUNO(x, x), x, scale_by_pow2(y, k));
}

// fdlibm's log of 2^e f for f in [1, 2) and an integer e: f is folded into (sqrt(1/2),
// sqrt(2)], g = f - 1, s = g / (2 + g), log f = g - (g^2/2 - s (g^2/2 + R(s^2))) (minimax,
// loom/core/philox.h's NormalConstants), plus e ln 2 in two parts, in fdlibm's order. Its
// polynomials use llvm.fma, never an optional fusion: core/philox.cpp repeats these operations
// for the normal map, bit for bit.
Value* Math::log_f64_reduced(Value* f, Value* e) {
  using K = loom::detail::NormalConstants;
  auto* f64 = b_.getDoubleTy();
  Value* big = b_.CreateFCmpOGT(f, d(K::kSqrt2));
  f = b_.CreateSelect(big, b_.CreateFMul(f, d(0.5)), f);
  e = b_.CreateSelect(big, b_.CreateAdd(e, llvm::ConstantInt::get(e->getType(), 1)), e);
  Value* g = b_.CreateFSub(f, d(1.0));
  Value* s = b_.CreateFDiv(g, b_.CreateFAdd(d(2.0), g));
  Value* z = b_.CreateFMul(s, s);
  Value* w = b_.CreateFMul(z, z);
  Value* r =
      b_.CreateFAdd(b_.CreateFMul(z, horner({K::kLog[0], K::kLog[2], K::kLog[4], K::kLog[6]}, w)),
                    b_.CreateFMul(w, horner({K::kLog[1], K::kLog[3], K::kLog[5]}, w)));
  // e ln2_hi - ((g^2/2 - (s (g^2/2 + R) + e ln2_lo)) - g)
  Value* hfsq = b_.CreateFMul(d(0.5), b_.CreateFMul(g, g));
  Value* ef = b_.CreateSIToFP(e, f64);
  Value* inner =
      b_.CreateFAdd(b_.CreateFMul(s, b_.CreateFAdd(hfsq, r)), b_.CreateFMul(ef, d(K::kLn2Lo)));
  return b_.CreateFSub(b_.CreateFMul(ef, d(K::kLn2Hi)),
                       b_.CreateFSub(b_.CreateFSub(hfsq, inner), g));
}

// Subnormals are scaled into the normal range first (under DAZ they compare equal to 0 and
// give -inf).
Value* Math::log_f64(Value* x) {
  auto* i64 = b_.getInt64Ty();
  auto* f64 = b_.getDoubleTy();
  Value* tiny = b_.CreateFCmpOLT(x, d(2.2250738585072014e-308));
  Value* xs = b_.CreateSelect(tiny, b_.CreateFMul(x, d(18014398509481984.0)), x);  // 2^54
  Value* bits = b_.CreateBitCast(xs, i64);
  Value* e = b_.CreateSub(b_.CreateLShr(bits, 52), b_.getInt64(1023));
  e = b_.CreateSub(e, b_.CreateSelect(tiny, b_.getInt64(54), b_.getInt64(0)));
  Value* f = b_.CreateBitCast(b_.CreateOr(b_.CreateAnd(bits, b_.getInt64(0x000fffffffffffffLL)),
                                          b_.getInt64(0x3ff0000000000000LL)),
                              f64);  // [1, 2)
  Value* res = log_f64_reduced(f, e);
  // log(0) = -inf, log(x < 0) = NaN, log(inf) = inf, log(NaN) = NaN.
  res = b_.CreateSelect(b_.CreateFCmpOEQ(x, d(0.0)), d(-INFINITY), res);
  res = b_.CreateSelect(b_.CreateFCmpOLT(x, d(0.0)), d(NAN), res);
  res = b_.CreateSelect(b_.CreateFCmpOEQ(x, d(INFINITY)), x, res);
  return b_.CreateSelect(b_.CreateFCmpUNO(x, x), x, res);
}

Value* Math::exp(Value* x) {
  if (x->getType()->isDoubleTy()) return exp_f64(x);
  return exp_f32(x);
}

// float32: |x|^y = exp(y log |x|) in float64 (its error, under 1e-13 relative where the result
// is a float32 number, vanishes in the rounding to float32), then C's special cases: y = 0 or
// x = 1 give 1; a negative finite x gives NaN unless y is an integer, and odd integers keep
// the sign of x (-0 and -inf included); x = -1 with y infinite gives 1. float64: libm.
Value* Math::pow(Value* x, Value* y) {
  if (x->getType()->isDoubleTy()) return b_.CreateBinaryIntrinsic(llvm::Intrinsic::pow, x, y);
  auto* f64 = b_.getDoubleTy();
  auto* i32 = b_.getInt32Ty();
  Value* ax = b_.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, x);
  Value* yd = b_.CreateFPExt(y, f64);
  Value* mag = b_.CreateFPTrunc(exp_f64(b_.CreateFMul(yd, log_f64(b_.CreateFPExt(ax, f64)))),
                                b_.getFloatTy());
  Value* ay = b_.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, y);
  Value* integer = b_.CreateFCmpOEQ(b_.CreateUnaryIntrinsic(llvm::Intrinsic::trunc, y), y);
  // Every float32 of magnitude 2^24 or more is even; below, the integer's low bit.
  Value* small = b_.CreateFCmpOLT(ay, c(16777216.0));
  Value* low_bit =
      b_.CreateAnd(b_.CreateFPToSI(b_.CreateSelect(small, y, c(0.0)), i32), b_.getInt32(1));
  Value* odd = b_.CreateAnd(b_.CreateAnd(integer, small), b_.CreateICmpNE(low_bit, b_.getInt32(0)));
  Value* negative = b_.CreateICmpSLT(b_.CreateBitCast(x, i32), b_.getInt32(0));  // sign bit
  Value* r = b_.CreateSelect(b_.CreateAnd(negative, odd), b_.CreateFNeg(mag), mag);
  Value* finite_negative =
      b_.CreateAnd(b_.CreateFCmpOLT(x, c(0.0)), b_.CreateFCmpONE(ax, c(INFINITY)));
  r = b_.CreateSelect(b_.CreateAnd(finite_negative, b_.CreateNot(integer)), c(NAN), r);
  Value* minus_one_inf =
      b_.CreateAnd(b_.CreateFCmpOEQ(x, c(-1.0)), b_.CreateFCmpOEQ(ay, c(INFINITY)));
  r = b_.CreateSelect(minus_one_inf, c(1.0), r);
  Value* one = b_.CreateOr(b_.CreateFCmpOEQ(y, c(0.0)), b_.CreateFCmpOEQ(x, c(1.0)));
  return b_.CreateSelect(one, c(1.0), r);
}

namespace {

// 2/pi's binary fraction, 288 bits (fdlibm's ipio2): bit j has weight 2^-(j+1).
constexpr uint32_t kTwoOverPi[9] = {0xa2f9836e, 0x4e441529, 0xfc2757d1, 0xf534ddc0, 0xdb629599,
                                    0x3c439041, 0xfe5163ab, 0xdebbc561, 0xb7246e3a};

uint64_t two_over_pi_bits(int first, int count) {
  uint64_t v = 0;
  for (int j = first; j < first + count; ++j)
    v = v << 1 | (kTwoOverPi[j / 32] >> (31 - j % 32) & 1);
  return v;
}

// A float32 of biased exponent b is m 2^E, m an integer under 2^24, E = max(b, 1) - 150. The
// bits of 2^E 2/pi of weight 4 and more add multiples of 4 to m 2^E 2/pi, nothing to its
// quadrant and fraction, so the table keeps the next 106: [b] the first 53 (from weight 2),
// [256 + b] the 53 after them.
std::array<double, 512> reduction_table() {
  std::array<double, 512> t{};
  for (int b = 0; b < 256; ++b) {
    const int e = std::max(b, 1) - 150;
    const int first = std::max(0, e - 2);  // bit e - 2 has weight 2^1
    t[b] = std::ldexp(static_cast<double>(two_over_pi_bits(first, 53)), e - first - 53);
    t[256 + b] = std::ldexp(static_cast<double>(two_over_pi_bits(first + 53, 53)), e - first - 106);
  }
  return t;
}

}  // namespace

Value* Math::sin_kernel(Value* x, int terms) {
  using K = loom::detail::NormalConstants;
  Value* z = b_.CreateFMul(x, x);
  return fma(b_.CreateFMul(x, z), horner({K::kSin, K::kSin + terms}, z), x);
}

Value* Math::cos_kernel(Value* x, int terms) {
  using K = loom::detail::NormalConstants;
  Value* z = b_.CreateFMul(x, x);
  return fma(b_.CreateFMul(z, z), horner({K::kCos, K::kCos + terms}, z),
             b_.CreateFSub(d(1.0), b_.CreateFMul(d(0.5), z)));
}

// The module's copy of reduction_table(), element `index`.
Value* Math::reduction_table_at(Value* index) {
  auto* f64 = b_.getDoubleTy();
  llvm::GlobalVariable* table = m_.getNamedGlobal("loom.reduction_table");
  if (!table) {
    const std::array<double, 512> t = reduction_table();
    table = new llvm::GlobalVariable(m_, llvm::ArrayType::get(f64, t.size()), /*isConstant=*/true,
                                     llvm::GlobalValue::PrivateLinkage,
                                     llvm::ConstantDataArray::get(m_.getContext(), t),
                                     "loom.reduction_table");
    table->setAlignment(llvm::Align(64));
  }
  llvm::LoadInst* v = b_.CreateLoad(f64, b_.CreateInBoundsGEP(f64, table, index));
  if (group_ && *group_) v->setMetadata(llvm::LLVMContext::MD_access_group, *group_);
  return v;
}

// |x| 2/pi = 4k + n + r for every float32 by Payne and Hanek's reduction (the table above), then
// sin and cos of |x| by four-term kernels at r pi/2 per quadrant; sin takes x's sign. Branch free,
// so the table loads vectorize as gathers (docs/architecture.md, "Measurements": sin_cos_f32).
Value* Math::sin_cos_f32(Value* x, bool cosine) {
  constexpr int kFloatTerms = 4;
  auto* i32 = b_.getInt32Ty();
  auto* f64 = b_.getDoubleTy();
  Value* bits = b_.CreateBitCast(x, i32);
  Value* biased = b_.CreateAnd(b_.CreateLShr(bits, 23), b_.getInt32(0xff));
  Value* frac = b_.CreateAnd(bits, b_.getInt32(0x7fffff));
  Value* m = b_.CreateSelect(b_.CreateICmpEQ(biased, b_.getInt32(0)), frac,
                             b_.CreateOr(frac, b_.getInt32(0x800000)));
  Value* md = b_.CreateUIToFP(m, f64);
  Value* at = b_.CreateZExt(biased, b_.getInt64Ty());
  Value* hi = reduction_table_at(at);
  Value* lo = reduction_table_at(b_.CreateAdd(at, b_.getInt64(256)));
  Value* p = b_.CreateFMul(md, hi);
  Value* err = fma(md, hi, b_.CreateFNeg(p));
  Value* floor4 = b_.CreateUnaryIntrinsic(llvm::Intrinsic::floor, b_.CreateFMul(p, d(0.25)));
  Value* y = b_.CreateFSub(p, b_.CreateFMul(floor4, d(4.0)));  // p mod 4, exact
  Value* n = b_.CreateUnaryIntrinsic(llvm::Intrinsic::rint, y);
  Value* r = b_.CreateFAdd(b_.CreateFSub(y, n), fma(md, lo, err));
  Value* a = b_.CreateFMul(r, d(1.57079632679489661923));
  Value* q = b_.CreateAnd(b_.CreateAdd(b_.CreateFPToSI(n, i32), b_.getInt32(cosine ? 1 : 0)),
                          b_.getInt32(3));
  Value* v = b_.CreateSelect(b_.CreateICmpNE(b_.CreateAnd(q, b_.getInt32(1)), b_.getInt32(0)),
                             cos_kernel(a, kFloatTerms), sin_kernel(a, kFloatTerms));
  v = b_.CreateSelect(b_.CreateICmpUGE(q, b_.getInt32(2)), b_.CreateFNeg(v), v);
  Value* res = b_.CreateFPTrunc(v, b_.getFloatTy());
  if (!cosine)
    res = b_.CreateSelect(b_.CreateICmpSLT(bits, b_.getInt32(0)), b_.CreateFNeg(res), res);
  // Infinities give NaN, NaN itself.
  return b_.CreateSelect(b_.CreateICmpEQ(biased, b_.getInt32(0xff)), b_.CreateFSub(x, x), res);
}

Value* Math::sin(Value* x) {
  if (x->getType()->isDoubleTy()) return b_.CreateUnaryIntrinsic(llvm::Intrinsic::sin, x);
  return sin_cos_f32(x, /*cosine=*/false);
}

Value* Math::cos(Value* x) {
  if (x->getType()->isDoubleTy()) return b_.CreateUnaryIntrinsic(llvm::Intrinsic::cos, x);
  return sin_cos_f32(x, /*cosine=*/true);
}

Value* Math::log(Value* x) {
  if (x->getType()->isDoubleTy()) return log_f64(x);
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

// fdlibm's expm1 for u in [-2, 0], so k = rint(u / ln 2) is 0, -1, -2 or -3: u = k ln 2 + x
// (x in two parts, x and its correction c), expm1(x) from a rational form in x^2/2 (Q1-Q5,
// minimax), and the result rebuilt for each k, every case computed and one selected.
Value* Math::expm1_f64_small(Value* u) {
  Value* k = b_.CreateUnaryIntrinsic(llvm::Intrinsic::rint,
                                     b_.CreateFMul(u, d(1.44269504088896338700e+00)));
  Value* hi = fmuladd(k, d(-6.93147180369123816490e-01), u);  // k ln2_hi is exact
  Value* lo = b_.CreateFMul(k, d(1.90821492927058770002e-10));
  Value* x = b_.CreateFSub(hi, lo);
  Value* c = b_.CreateFSub(b_.CreateFSub(hi, x), lo);
  Value* hfx = b_.CreateFMul(d(0.5), x);
  Value* hxs = b_.CreateFMul(x, hfx);
  Value* r1 = fma(
      hxs,
      horner({-3.33333333333331316428e-02, 1.58730158725481460165e-03, -7.93650757867487942473e-05,
              4.00821782732936239552e-06, -2.01099218183624371326e-07},
             hxs),
      d(1.0));
  Value* t = b_.CreateFSub(d(3.0), b_.CreateFMul(r1, hfx));
  Value* e = b_.CreateFMul(
      hxs, b_.CreateFDiv(b_.CreateFSub(r1, t), b_.CreateFSub(d(6.0), b_.CreateFMul(x, t))));
  Value* k0 = b_.CreateFSub(x, b_.CreateFSub(b_.CreateFMul(x, e), hxs));
  e = b_.CreateFSub(b_.CreateFSub(b_.CreateFMul(x, b_.CreateFSub(e, c)), c), hxs);
  Value* km1 = b_.CreateFSub(b_.CreateFMul(d(0.5), b_.CreateFSub(x, e)), d(0.5));
  Value* kle2 = b_.CreateFSub(scale_by_pow2(b_.CreateFSub(d(1.0), b_.CreateFSub(e, x)), k), d(1.0));
  Value* r = b_.CreateSelect(b_.CreateFCmpOEQ(k, d(-1.0)), km1, kle2);
  return b_.CreateSelect(b_.CreateFCmpOEQ(k, d(0.0)), k0, r);
}

// fdlibm's tanh: below |x| = 1, -t / (t + 2) with t = expm1(-2|x|); from 1 to 22,
// 1 - 2 / (exp(2|x|) + 1) (fdlibm's 1 - 2 / (expm1(2|x|) + 2)); from 22, 1; x's sign.
Value* Math::tanh_f64(Value* x) {
  Value* ax = b_.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, x);
  Value* t = expm1_f64_small(b_.CreateFMul(ax, d(-2.0)));
  Value* small = b_.CreateFDiv(b_.CreateFNeg(t), b_.CreateFAdd(t, d(2.0)));
  Value* big = b_.CreateFSub(
      d(1.0), b_.CreateFDiv(d(2.0), b_.CreateFAdd(exp_f64(b_.CreateFMul(ax, d(2.0))), d(1.0))));
  Value* z = b_.CreateSelect(b_.CreateFCmpOLT(ax, d(1.0)), small, big);
  z = b_.CreateSelect(b_.CreateFCmpOGE(ax, d(22.0)), d(1.0), z);
  return b_.CreateSelect(b_.CreateFCmpUNO(x, x), x, b_.CreateCopySign(z, x));
}

Value* Math::tanh(Value* x) {
  if (x->getType()->isDoubleTy()) return tanh_f64(x);
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
