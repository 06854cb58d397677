// The emitter's value of one element: random numbers (Philox), constants, elementwise ops,
// conversions and the storage types of half-precision values.
#include <cmath>

#include "backend/cpu/emitter_impl.h"
#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/Intrinsics.h"
#include "loom/core/error.h"
#include "loom/core/philox.h"

namespace loom::cpu::detail {

using ir::OpKind;
using llvm::Value;

// ---- random numbers: Philox 4x32-10, bit for bit as core/philox.h -------------------
std::array<Value*, 4> Emitter::philox(std::array<Value*, 4> ctr, Value* k0, Value* k1) {
  auto* i64 = b_.getInt64Ty();
  auto* i32 = b_.getInt32Ty();
  for (int round = 0; round < 10; ++round) {
    Value* p0 = b_.CreateMul(b_.CreateZExt(ctr[0], i64), b_.getInt64(0xD2511F53u));
    Value* p1 = b_.CreateMul(b_.CreateZExt(ctr[2], i64), b_.getInt64(0xCD9E8D57u));
    Value* hi0 = b_.CreateTrunc(b_.CreateLShr(p0, 32), i32);
    Value* hi1 = b_.CreateTrunc(b_.CreateLShr(p1, 32), i32);
    ctr = {b_.CreateXor(b_.CreateXor(hi1, ctr[1]), k0), b_.CreateTrunc(p1, i32),
           b_.CreateXor(b_.CreateXor(hi0, ctr[3]), k1), b_.CreateTrunc(p0, i32)};
    k0 = b_.CreateAdd(k0, b_.getInt32(0x9E3779B9u));
    k1 = b_.CreateAdd(k1, b_.getInt32(0xBB67AE85u));
  }
  return ctr;
}

Value* Emitter::lane(const std::array<Value*, 4>& r, Value* which) {  // r[which], which in 0..3
  Value* v = r[0];
  for (int k = 1; k < 4; ++k) v = b_.CreateSelect(b_.CreateICmpEQ(which, b_.getInt64(k)), r[k], v);
  return v;
}

// philox_normal_from_words (core/philox.cpp), operation for operation: its log and cos are
// polynomials on integer-reduced arguments with explicit fused multiply-adds (llvm.fma, never
// contracted otherwise), so a kernel's normals are the reference's bits and vectorize
// (libm's scalar log and cos in float64 took 19 ms for 2^20 normals on 2 threads).
Value* Emitter::normal_from_words(Value* w1, Value* w2) {
  using K = loom::detail::NormalConstants;
  auto* i64 = b_.getInt64Ty();
  auto* f64 = b_.getDoubleTy();
  auto c = [&](double v) { return llvm::ConstantFP::get(f64, v); };
  // log u1 = (k - 24) ln 2 + log f, n = (w1 >> 8) + 1 = f 2^k.
  Value* n = b_.CreateAdd(b_.CreateLShr(w1, 8), b_.getInt32(1));
  Value* k = b_.CreateSub(b_.getInt32(31),
                          b_.CreateBinaryIntrinsic(llvm::Intrinsic::ctlz, n, b_.getTrue()));
  Value* scale = b_.CreateBitCast(
      b_.CreateShl(b_.CreateZExt(b_.CreateSub(b_.getInt32(1023), k), i64), 52), f64);
  Value* f = b_.CreateFMul(b_.CreateUIToFP(n, f64), scale);
  Value* log_u1 = math_.log_f64_reduced(f, b_.CreateSub(k, b_.getInt32(24)));
  Value* radius = b_.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, b_.CreateFMul(c(-2.0), log_u1));
  // cos(2 pi m 2^-24), m = w2 >> 8: quarter turn q, the rest folded to [0, pi/4].
  Value* m = b_.CreateLShr(w2, 8);
  Value* q = b_.CreateLShr(m, 22);
  Value* rest = b_.CreateAnd(m, b_.getInt32(0x3fffff));
  Value* fold = b_.CreateICmpUGT(rest, b_.getInt32(1 << 21));
  Value* folded = b_.CreateSelect(fold, b_.CreateSub(b_.getInt32(1 << 22), rest), rest);
  Value* x = b_.CreateFMul(b_.CreateUIToFP(folded, f64), c(K::kTurn));
  Value* sin_x = math_.sin_kernel(x);
  Value* cos_x = math_.cos_kernel(x);
  Value* odd = b_.CreateICmpNE(b_.CreateAnd(q, b_.getInt32(1)), b_.getInt32(0));
  Value* v = b_.CreateSelect(b_.CreateXor(odd, fold), sin_x, cos_x);
  Value* negative = b_.CreateICmpEQ(b_.CreateAnd(b_.CreateAdd(q, b_.getInt32(1)), b_.getInt32(2)),
                                    b_.getInt32(2));  // q is 1 or 2
  return b_.CreateFMul(radius, b_.CreateSelect(negative, b_.CreateFNeg(v), v));
}

Value* Emitter::random(const ir::Node& node, const Coords& c) {
  auto* i32 = b_.getInt32Ty();
  auto* f64 = b_.getDoubleTy();
  NodeId key = node.operands[0].node;
  Value* seed = eval(key, Coords{Affine{0, {}}});
  Value* offset = eval(key, Coords{Affine{1, {}}});
  Value* e = affine(linear(contiguous_strides(node.type.shape), c, 0));
  bool normal = node.op == OpKind::RandNormal;
  Value* block = b_.CreateLShr(e, normal ? 1 : 2);
  auto r = philox({b_.CreateTrunc(block, i32), b_.CreateTrunc(b_.CreateLShr(block, 32), i32),
                   b_.CreateTrunc(offset, i32), b_.CreateTrunc(b_.CreateLShr(offset, 32), i32)},
                  b_.CreateTrunc(seed, i32), b_.CreateTrunc(b_.CreateLShr(seed, 32), i32));
  auto to_unit = [&](Value* bits) {  // (bits >> 8) * 2^-24, exact in double
    Value* v = b_.CreateUIToFP(b_.CreateLShr(bits, 8), f64);
    return b_.CreateFMul(v, llvm::ConstantFP::get(f64, 1.0 / 16777216.0));
  };
  Value* x;
  if (!normal) {
    x = to_unit(lane(r, b_.CreateAnd(e, b_.getInt64(3))));
  } else {
    Value* first = b_.CreateShl(b_.CreateAnd(e, b_.getInt64(1)), 1);
    x = normal_from_words(lane(r, first), lane(r, b_.CreateAdd(first, b_.getInt64(1))));
  }
  return convert(x, DType::Float64, node.type.dtype);
}

Value* Emitter::constant(const ir::Node& node, DType dt) {
  double f = node.attrs.f;
  if (dt == DType::Bool) return b_.getInt1(f != 0);
  if (is_integral(dt))
    return llvm::ConstantInt::get(compute_type(dt), static_cast<uint64_t>(std::llround(f)), true);
  return round_to(llvm::ConstantFP::get(compute_type(dt), f), dt);
}

Value* Emitter::int_to(Value* i64v, DType dt) {
  if (dt == DType::Bool) return b_.CreateICmpNE(i64v, b_.getInt64(0));
  if (is_integral(dt)) return b_.CreateSExtOrTrunc(i64v, compute_type(dt));
  return round_to(b_.CreateSIToFP(i64v, compute_type(dt)), dt);
}

Value* Emitter::elementwise(OpKind op, DType in, const std::vector<Value*>& x) {
  bool fl = is_floating(in);
  switch (op) {
    case OpKind::Neg: return fl ? b_.CreateFNeg(x[0]) : b_.CreateNeg(x[0]);
    case OpKind::Abs:
      return fl ? b_.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, x[0])
                : b_.CreateBinaryIntrinsic(llvm::Intrinsic::abs, x[0], b_.getFalse());
    case OpKind::Exp: return math_.exp(x[0]);
    case OpKind::Log: return math_.log(x[0]);
    case OpKind::Sqrt: return b_.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, x[0]);
    case OpKind::Tanh: return math_.tanh(x[0]);
    case OpKind::Sin: return math_.sin(x[0]);
    case OpKind::Cos: return math_.cos(x[0]);
    case OpKind::Erf: return math_.erf(x[0]);
    case OpKind::Not: return b_.CreateNot(x[0]);
    case OpKind::Add: return fl ? fop(llvm::Instruction::FAdd, x) : b_.CreateAdd(x[0], x[1]);
    case OpKind::Sub: return fl ? fop(llvm::Instruction::FSub, x) : b_.CreateSub(x[0], x[1]);
    case OpKind::Mul: return fl ? fop(llvm::Instruction::FMul, x) : b_.CreateMul(x[0], x[1]);
    case OpKind::Div: return fl ? b_.CreateFDiv(x[0], x[1]) : int_div(x[0], x[1]);
    case OpKind::Pow: return math_.pow(x[0], x[1]);
    case OpKind::Rem: return fl ? b_.CreateFRem(x[0], x[1]) : int_rem(x[0], x[1]);
    case OpKind::Maximum:
    case OpKind::Minimum: {
      bool mx = op == OpKind::Maximum;
      if (in == DType::Bool) return mx ? b_.CreateOr(x[0], x[1]) : b_.CreateAnd(x[0], x[1]);
      if (fl) return float_extremum(mx, x[0], x[1]);
      return b_.CreateBinaryIntrinsic(mx ? llvm::Intrinsic::smax : llvm::Intrinsic::smin, x[0],
                                      x[1]);
    }
    case OpKind::And: return b_.CreateAnd(x[0], x[1]);
    case OpKind::Or: return b_.CreateOr(x[0], x[1]);
    case OpKind::Eq: return fl ? b_.CreateFCmpOEQ(x[0], x[1]) : b_.CreateICmpEQ(x[0], x[1]);
    case OpKind::Ne: return fl ? b_.CreateFCmpUNE(x[0], x[1]) : b_.CreateICmpNE(x[0], x[1]);
    case OpKind::Lt:
      return fl                  ? b_.CreateFCmpOLT(x[0], x[1])
             : in == DType::Bool ? b_.CreateICmpULT(x[0], x[1])
                                 : b_.CreateICmpSLT(x[0], x[1]);
    case OpKind::Le:
      return fl                  ? b_.CreateFCmpOLE(x[0], x[1])
             : in == DType::Bool ? b_.CreateICmpULE(x[0], x[1])
                                 : b_.CreateICmpSLE(x[0], x[1]);
    case OpKind::Gt:
      return fl                  ? b_.CreateFCmpOGT(x[0], x[1])
             : in == DType::Bool ? b_.CreateICmpUGT(x[0], x[1])
                                 : b_.CreateICmpSGT(x[0], x[1]);
    case OpKind::Ge:
      return fl                  ? b_.CreateFCmpOGE(x[0], x[1])
             : in == DType::Bool ? b_.CreateICmpUGE(x[0], x[1])
                                 : b_.CreateICmpSGE(x[0], x[1]);
    case OpKind::Where: return b_.CreateSelect(x[0], x[1], x[2]);
    default: break;
  }
  throw CompileError(loom::detail::str_cat("[cpu] no code generator for ", ir::op_name(op)));
}

Value* Emitter::fop(llvm::Instruction::BinaryOps op, const std::vector<Value*>& x) {
  llvm::IRBuilder<>::FastMathFlagGuard guard(b_);
  llvm::FastMathFlags f;
  f.setAllowContract();
  b_.setFastMathFlags(f);
  return b_.CreateBinOp(op, x[0], x[1]);
}

// Integer division truncates toward zero; by zero gives 0 and INT_MIN / -1 wraps (the
// reference interpreter's definition), without undefined behaviour.
// a % d; 0 where d is 0 or -1 (srem of INT_MIN by -1 is undefined).
Value* Emitter::int_rem(Value* a, Value* d) {
  auto* t = a->getType();
  Value* zero = llvm::ConstantInt::get(t, 0);
  Value* bad = b_.CreateOr(b_.CreateICmpEQ(d, zero),
                           b_.CreateICmpEQ(d, llvm::ConstantInt::getSigned(t, -1)));
  Value* r = b_.CreateSRem(a, b_.CreateSelect(bad, llvm::ConstantInt::get(t, 1), d));
  return b_.CreateSelect(bad, zero, r);
}

Value* Emitter::int_div(Value* a, Value* d) {
  auto* t = a->getType();
  Value* zero = llvm::ConstantInt::get(t, 0);
  Value* minus1 = llvm::ConstantInt::getSigned(t, -1);
  Value* is_zero = b_.CreateICmpEQ(d, zero);
  Value* is_m1 = b_.CreateICmpEQ(d, minus1);
  Value* safe = b_.CreateSelect(b_.CreateOr(is_zero, is_m1), llvm::ConstantInt::get(t, 1), d);
  Value* q = b_.CreateSDiv(a, safe);
  q = b_.CreateSelect(is_m1, b_.CreateNeg(a), q);
  return b_.CreateSelect(is_zero, zero, q);
}

Value* Emitter::convert(Value* v, DType from, DType to) {
  if (from == to) return v;
  llvm::Type* tt = compute_type(to);
  if (to == DType::Bool) {
    if (is_floating(from)) return b_.CreateFCmpUNE(v, llvm::ConstantFP::get(v->getType(), 0.0));
    return b_.CreateICmpNE(v, llvm::ConstantInt::get(v->getType(), 0));
  }
  if (from == DType::Bool) return is_floating(to) ? b_.CreateUIToFP(v, tt) : b_.CreateZExt(v, tt);
  if (is_integral(to)) {
    if (is_integral(from)) return b_.CreateSExtOrTrunc(v, tt);
    // Truncation toward zero, NaN -> 0, saturating: the reference's definition.
    return b_.CreateIntrinsic(llvm::Intrinsic::fptosi_sat, {tt, v->getType()}, {v});
  }
  if ((to == DType::Float16 || to == DType::BFloat16) && from != DType::Float32 &&
      from != DType::Float16 && from != DType::BFloat16) {
    Value* d = is_integral(from) ? b_.CreateSIToFP(v, b_.getDoubleTy()) : v;
    return double_to_half(d, to);
  }
  Value* r = is_integral(from) ? b_.CreateSIToFP(v, tt) : b_.CreateFPCast(v, tt);
  return round_to(r, to);
}

// double -> float16/bfloat16 with one rounding (through float it could round twice).
// float16: the hardware conversion rounds once. bfloat16: round to float by "round to
// odd" (truncate, then set the sticky bit when inexact), then to bfloat16 to nearest even.
Value* Emitter::double_to_half(Value* d, DType to) {
  if (to == DType::Float16)
    return b_.CreateFPExt(b_.CreateFPTrunc(d, b_.getHalfTy()), b_.getFloatTy());
  Value* f = b_.CreateFPTrunc(d, b_.getFloatTy());
  Value* back = b_.CreateFPExt(f, b_.getDoubleTy());
  Value* ad = b_.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, d);
  Value* aback = b_.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, back);
  Value* bits = b_.CreateBitCast(f, b_.getInt32Ty());
  Value* too_big = b_.CreateFCmpOGT(aback, ad);
  bits = b_.CreateSub(bits, b_.CreateZExt(too_big, b_.getInt32Ty()));
  Value* inexact = b_.CreateFCmpONE(back, d);
  bits = b_.CreateOr(bits, b_.CreateZExt(inexact, b_.getInt32Ty()));
  Value* odd = b_.CreateBitCast(bits, b_.getFloatTy());
  odd = b_.CreateSelect(b_.CreateFCmpUNO(d, d), f, odd);
  return round_to(odd, to);
}

// Values of 16-bit float dtypes compute in float32 but round to their dtype after each op,
// as the reference does.
Value* Emitter::round_to(Value* v, DType dt) {
  if (dt == DType::Float16) {
    return b_.CreateFPExt(b_.CreateFPTrunc(v, b_.getHalfTy()), b_.getFloatTy());
  }
  if (dt == DType::BFloat16) return from_storage(to_storage(v, dt), dt);
  return v;
}

llvm::Type* Emitter::compute_type(DType dt) {
  switch (dt) {
    case DType::Bool: return b_.getInt1Ty();
    case DType::Int32: return b_.getInt32Ty();
    case DType::Int64: return b_.getInt64Ty();
    case DType::Float64: return b_.getDoubleTy();
    default: return b_.getFloatTy();
  }
}

llvm::Type* Emitter::storage_type(DType dt) {
  switch (dt) {
    case DType::Bool: return b_.getInt8Ty();
    case DType::BFloat16: return b_.getInt16Ty();
    case DType::Float16: return b_.getHalfTy();
    default: return compute_type(dt);
  }
}

Value* Emitter::from_storage(Value* v, DType dt) {
  switch (dt) {
    case DType::Bool: return b_.CreateICmpNE(v, b_.getInt8(0));
    case DType::BFloat16:
      return b_.CreateBitCast(b_.CreateShl(b_.CreateZExt(v, b_.getInt32Ty()), 16), b_.getFloatTy());
    case DType::Float16: return b_.CreateFPExt(v, b_.getFloatTy());
    default: return v;
  }
}

Value* Emitter::to_storage(Value* v, DType dt) {
  switch (dt) {
    case DType::Bool: return b_.CreateZExt(v, b_.getInt8Ty());
    case DType::Float16: return b_.CreateFPTrunc(v, b_.getHalfTy());
    case DType::BFloat16: {  // round to nearest even; NaN stays a quiet NaN
      Value* u = b_.CreateBitCast(v, b_.getInt32Ty());
      Value* lsb = b_.CreateAnd(b_.CreateLShr(u, 16), b_.getInt32(1));
      Value* rounded = b_.CreateLShr(b_.CreateAdd(u, b_.CreateAdd(b_.getInt32(0x7fff), lsb)), 16);
      Value* nan = b_.CreateOr(b_.CreateLShr(u, 16), b_.getInt32(0x40));
      Value* is_nan = b_.CreateFCmpUNO(v, v);
      return b_.CreateTrunc(b_.CreateSelect(is_nan, nan, rounded), b_.getInt16Ty());
    }
    default: return v;
  }
}

}  // namespace loom::cpu::detail
