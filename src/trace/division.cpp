// torch's floor, floor_divide and remainder (Python's signs) and the logical and/or, composed
// from loom's ops so that C++ and Python share one definition.
//
// Both divisions start from the `rem` op (C's fmod, exact; integer `%`), as torch's CPU
// kernels do: floats follow div_floor_floating in torch's opmath (float32 for the half
// types, so 7.7 // 0.1 is torch's 76, not the half-rounded 77), integers correct the
// truncated quotient by one where the remainder's sign differs from the divisor's. Integer
// division by zero gives 0 (as numpy; torch raises at run time, which a lazy graph cannot): a
// divisor known to be 0 when the op is traced (a host number, a materialized one-element
// tensor) raises here instead.
#include <cmath>

#include "loom/trace/ops.h"
#include "trace/context.h"
#include "trace/ops_impl.h"

namespace loom {

namespace {

// An IR op over operands of one dtype (broadcast by the builder).
Tensor raw(ir::OpKind op, const Tensor& a, const Tensor& b) {
  detail::OpRecord rec;
  return rec.ctx.wrap(rec.b().binary(op, rec.ctx.value_of(a), rec.ctx.value_of(b)));
}

Tensor zero_of(DType dt) { return zeros(Shape{}, dt); }
Tensor both(const Tensor& a, const Tensor& b) { return where(a, b, zero_of(DType::Bool)); }
Tensor differ(const Tensor& a, const Tensor& b) { return where(a, logical_not(b), b); }

// The dtype both operands are computed in, and the result's dtype.
struct DivTypes {
  DType out, compute;
};

DivTypes division_types(const Tensor& a, const Tensor& b, const char* op) {
  DType dt = promote_types(a.dtype(), b.dtype());
  LOOM_CHECK_T(DTypeError, dt != DType::Bool, "[", op, "] expected numeric operands, got ",
               name(a.dtype()), " and ", name(b.dtype()), " (torch refuses bool too)");
  DType compute = dt == DType::Float16 || dt == DType::BFloat16 ? DType::Float32 : dt;
  return {dt, compute};
}

// A divisor known now to be zero (a host number or a materialized one-element tensor).
void check_integer_divisor(const Tensor& b, const char* op) {
  const detail::TensorImpl* impl = b.impl();
  if (!impl || impl->pending() || impl->type.shape.numel() != 1 || !impl->buffer.defined()) return;
  int64_t v = 0;
  if (impl->type.dtype == DType::Int32)
    v = *impl->buffer.as<int32_t>();
  else if (impl->type.dtype == DType::Int64)
    v = *impl->buffer.as<int64_t>();
  else if (impl->type.dtype == DType::Bool)
    v = *impl->buffer.as<uint8_t>();
  else
    return;
  LOOM_CHECK(v != 0, "[", op, "] integer division by zero (a divisor of ", name(b.dtype()),
             " 0); torch raises ZeroDivisionError here. A divisor tensor whose zeros are known "
             "only when the graph runs gives 0 there, as numpy");
}

// The remainder's sign differs from the divisor's: the truncated quotient is one too big.
Tensor off_by_one(const Tensor& mod, const Tensor& b) {
  return both(mod != Scalar(0), differ(b < Scalar(0), mod < Scalar(0)));
}

}  // namespace

Tensor fmod(const Tensor& a, const Tensor& b) {
  DivTypes t = division_types(a, b, "fmod");
  if (!is_floating(t.out)) check_integer_divisor(b, "fmod");
  return raw(ir::OpKind::Rem, to(a, t.out), to(b, t.out));
}

Tensor floor(const Tensor& x) {
  if (!is_floating(x.dtype())) return x;
  // |x| >= 2^(mantissa bits) is integral already (and NaN and Inf stay themselves)
  const double bound = x.dtype() == DType::BFloat16  ? 128.0
                       : x.dtype() == DType::Float16 ? 1024.0
                       : x.dtype() == DType::Float32 ? 8388608.0
                                                     : 4503599627370496.0;
  Tensor ok = abs(x) < Scalar(bound);
  Tensor t = to(to(where(ok, x, zero_of(x.dtype())), int64), x.dtype());
  t = where(t > x, t - Scalar(1.0), t);
  return where(ok, t, x);
}

Tensor floor_divide(const Tensor& a, const Tensor& b) {
  DivTypes t = division_types(a, b, "floor_divide");
  Tensor a2 = to(a, t.compute), b2 = to(b, t.compute);
  if (!is_floating(t.out)) {
    check_integer_divisor(b, "floor_divide");
    Tensor q = raw(ir::OpKind::Div, a2, b2);
    return where(off_by_one(raw(ir::OpKind::Rem, a2, b2), b2), q - Scalar(1), q);
  }
  Tensor mod = raw(ir::OpKind::Rem, a2, b2);
  Tensor div = (a2 - mod) / b2;
  div = where(off_by_one(mod, b2), div - Scalar(1.0), div);
  Tensor fl = floor(div);
  Tensor q = where(div - fl > Scalar(0.5), fl + Scalar(1.0), fl);
  Tensor quotient = a2 / b2;
  q = where(div == Scalar(0.0), quotient * Scalar(0.0), q);  // a signed zero: copysign(0, a/b)
  q = where(b2 == Scalar(0.0), quotient, q);
  return to(q, t.out);
}

Tensor remainder(const Tensor& a, const Tensor& b) {
  DivTypes t = division_types(a, b, "remainder");
  if (!is_floating(t.out)) check_integer_divisor(b, "remainder");
  Tensor a2 = to(a, t.compute), b2 = to(b, t.compute);
  Tensor mod = raw(ir::OpKind::Rem, a2, b2);
  return to(where(off_by_one(mod, b2), mod + b2, mod), t.out);
}

Tensor logical_and(const Tensor& a, const Tensor& b) {
  LOOM_CHECK_T(DTypeError, a.dtype() == DType::Bool && b.dtype() == DType::Bool,
               "[logical_and] operator & needs bool tensors, got ", name(a.dtype()), " and ",
               name(b.dtype()));
  return where(a, b, zero_of(DType::Bool));
}

Tensor logical_or(const Tensor& a, const Tensor& b) {
  LOOM_CHECK_T(DTypeError, a.dtype() == DType::Bool && b.dtype() == DType::Bool,
               "[logical_or] operator | needs bool tensors, got ", name(a.dtype()), " and ",
               name(b.dtype()));
  return where(a, ones(Shape{}, DType::Bool), b);
}

}  // namespace loom
