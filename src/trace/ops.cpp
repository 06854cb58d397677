// Primitive ops of the public API: type promotion, then one builder call each.
#include "loom/trace/ops.h"

#include <algorithm>
#include <cmath>

#include "trace/ops_impl.h"

namespace loom {

using detail::OpRecord;
using ir::OpKind;

namespace detail {

namespace {
int category(DType d) { return d == DType::Bool ? 0 : is_integral(d) ? 1 : 2; }
}  // namespace

void undefined_operand(const char* op) {
  throw Error(str_cat("[", op, "] an operand is an undefined (default-constructed) Tensor"));
}

DType result_type(const TensorType& a, const TensorType& b) {
  bool da = a.shape.rank() > 0, db = b.shape.rank() > 0;
  if (da == db) return promote_types(a.dtype, b.dtype);
  DType dimmed = da ? a.dtype : b.dtype, zero_dim = da ? b.dtype : a.dtype;
  // A 0-d tensor only matters when it is of a higher category (bool < int < float).
  return category(zero_dim) > category(dimmed) ? zero_dim : dimmed;
}

DType result_type(const Tensor& a, const Tensor& b) {
  return result_type(type_of(a, "promote"), type_of(b, "promote"));
}

DType result_type(const Tensor& a, const Scalar& s) {
  return loom::result_type(type_of(a, "promote").dtype, s);
}

std::vector<int64_t> reduce_dims(const char* op, const Tensor& x, std::vector<int64_t> dims) {
  int64_t r = x.dim();
  if (dims.empty()) {
    for (int64_t d = 0; d < r; ++d) dims.push_back(d);
    return dims;
  }
  for (int64_t& d : dims) d = normalize_axis(op, d, r);
  std::sort(dims.begin(), dims.end());
  LOOM_CHECK_T(ShapeError, std::adjacent_find(dims.begin(), dims.end()) == dims.end(), "[", op,
               "] dim appears more than once in the reduction dims of ",
               TensorType{x.dtype(), x.shape()});
  if (r == 0) dims.clear();  // a 0-d tensor reduces over nothing
  return dims;
}

}  // namespace detail

namespace {

// torch's bool arithmetic: bool + bool is logical or, bool * bool logical and (the result stays
// bool); subtraction with a bool operand and bool ** bool are refused.
OpKind bool_op(OpKind op, DType dt, const std::string& operands) {
  LOOM_CHECK_T(DTypeError, op != OpKind::Sub, "[sub] subtraction with a bool ",
               "operand is not supported (as in torch), got ", operands,
               "; use logical_not() to invert a mask, or != for exclusive or");
  if (dt != DType::Bool) return op;
  switch (op) {
    case OpKind::Add: return OpKind::Or;
    case OpKind::Mul: return OpKind::And;
    default: break;
  }
  LOOM_CHECK_T(DTypeError, op != OpKind::Pow, "[pow] expected numeric operands, got ", operands,
               " (torch refuses bool ** bool too); convert with to() first");
  return op;
}

// torch refuses an integer tensor raised to a negative integer host number.
void check_int_pow(OpKind op, DType dt, const Tensor& a, const Scalar& s) {
  LOOM_CHECK_T(DTypeError,
               !(op == OpKind::Pow && !is_floating(dt) && s.is_int && !s.is_bool && s.ivalue < 0),
               "[pow] integer tensor ", TensorType{a.dtype(), a.shape()},
               " to the negative integer power ", s.ivalue,
               ": integers to negative integer powers are not allowed (as in torch); use a "
               "floating-point exponent or convert the tensor with to() first");
}

std::string types_text(const Tensor& a, const Tensor& b) {
  return detail::str_cat(TensorType{a.dtype(), a.shape()}, " and ",
                         TensorType{b.dtype(), b.shape()});
}

Tensor binary(OpKind op, const Tensor& a, const Tensor& b, bool true_div = false) {
  OpRecord rec;
  const TensorType& ta = detail::type_of(a, ir::op_name(op).data());
  const TensorType& tb = detail::type_of(b, ir::op_name(op).data());
  DType dt = detail::result_type(ta, tb);
  if (true_div && !is_floating(dt)) dt = DType::Float32;
  const bool has_bool = ta.dtype == DType::Bool || tb.dtype == DType::Bool;
  if (has_bool) op = bool_op(op, dt, types_text(a, b));
  ir::Value va = rec.b().convert(rec.ctx.value_of(a), dt);
  ir::Value vb = rec.b().convert(rec.ctx.value_of(b), dt);
  return rec.ctx.wrap(rec.b().binary(op, va, vb));
}

Tensor binary(OpKind op, const Tensor& a, const Scalar& s, bool scalar_first,
              bool true_div = false) {
  OpRecord rec;
  DType dt = detail::result_type(a, s);
  if (true_div && !is_floating(dt)) dt = DType::Float32;
  if (a.impl()->type.dtype == DType::Bool || s.is_bool) {  // a is defined: result_type checked
    std::string operands = detail::str_cat(
        TensorType{a.dtype(), a.shape()}, " and the host ", s.is_bool ? "bool " : "number ",
        s.is_bool ? (s.ivalue ? "true" : "false") : detail::str_cat(s.value));
    op = bool_op(op, dt, operands);
  }
  if (!scalar_first) check_int_pow(op, dt, a, s);
  ir::Value va = rec.b().convert(rec.ctx.value_of(a), dt);
  ir::Value vs = rec.ctx.scalar(s, dt);
  return rec.ctx.wrap(scalar_first ? rec.b().binary(op, vs, va) : rec.b().binary(op, va, vs));
}

// Float-only unary ops promote integer and bool inputs to float32, like PyTorch.
Tensor unary(OpKind op, const Tensor& x) {
  OpRecord rec;
  ir::Value v = rec.ctx.value_of(x);
  if (ir::has_trait(op, ir::kFloatOnly) && !is_floating(x.dtype()))
    v = rec.b().convert(v, DType::Float32);
  return rec.ctx.wrap(rec.b().unary(op, v));
}

}  // namespace

DType result_type(DType t, const Scalar& s) {
  const int cs = s.is_bool ? 0 : s.is_int ? 1 : 2;
  if (cs > detail::category(t)) return cs == 1 ? DType::Int64 : DType::Float32;
  return t;
}

Tensor add(const Tensor& a, const Tensor& b) { return binary(OpKind::Add, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary(OpKind::Sub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary(OpKind::Mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary(OpKind::Div, a, b, true); }
Tensor pow(const Tensor& a, const Tensor& b) { return binary(OpKind::Pow, a, b); }
Tensor pow(const Tensor& a, Scalar b) { return binary(OpKind::Pow, a, b, false); }
Tensor maximum(const Tensor& a, const Tensor& b) { return binary(OpKind::Maximum, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return binary(OpKind::Minimum, a, b); }

Tensor neg(const Tensor& x) {
  LOOM_CHECK_T(DTypeError, x.dtype() != DType::Bool, "[neg] negation of a bool tensor ",
               TensorType{x.dtype(), x.shape()},
               " is not supported (as in torch); use logical_not() to invert a mask");
  return unary(OpKind::Neg, x);
}
Tensor abs(const Tensor& x) { return unary(OpKind::Abs, x); }
Tensor exp(const Tensor& x) { return unary(OpKind::Exp, x); }
Tensor log(const Tensor& x) { return unary(OpKind::Log, x); }
Tensor sqrt(const Tensor& x) { return unary(OpKind::Sqrt, x); }
Tensor tanh(const Tensor& x) { return unary(OpKind::Tanh, x); }
Tensor sin(const Tensor& x) { return unary(OpKind::Sin, x); }
Tensor cos(const Tensor& x) { return unary(OpKind::Cos, x); }
Tensor erf(const Tensor& x) { return unary(OpKind::Erf, x); }
Tensor logical_not(const Tensor& x) {
  OpRecord rec;
  ir::Value v = rec.b().convert(rec.ctx.value_of(x), DType::Bool);
  return rec.ctx.wrap(rec.b().unary(OpKind::Not, v));
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  OpRecord rec;
  LOOM_CHECK_T(DTypeError, cond.dtype() == DType::Bool, "[where] condition must be bool, got ",
               TensorType{cond.dtype(), cond.shape()});
  DType dt = detail::result_type(a, b);
  ir::Value vc = rec.ctx.value_of(cond);
  ir::Value va = rec.b().convert(rec.ctx.value_of(a), dt);
  ir::Value vb = rec.b().convert(rec.ctx.value_of(b), dt);
  return rec.ctx.wrap(rec.b().where(vc, va, vb));
}

Tensor to(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;  // as torch: the same tensor, no op recorded
  OpRecord rec;
  return rec.ctx.wrap(rec.b().convert(rec.ctx.value_of(x), dtype));
}

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, Scalar b) { return binary(OpKind::Add, a, b, false); }
Tensor operator-(const Tensor& a, Scalar b) { return binary(OpKind::Sub, a, b, false); }
Tensor operator*(const Tensor& a, Scalar b) { return binary(OpKind::Mul, a, b, false); }
Tensor operator/(const Tensor& a, Scalar b) { return binary(OpKind::Div, a, b, false, true); }
Tensor operator+(Scalar a, const Tensor& b) { return binary(OpKind::Add, b, a, true); }
Tensor operator-(Scalar a, const Tensor& b) { return binary(OpKind::Sub, b, a, true); }
Tensor operator*(Scalar a, const Tensor& b) { return binary(OpKind::Mul, b, a, true); }
Tensor operator/(Scalar a, const Tensor& b) { return binary(OpKind::Div, b, a, true, true); }
Tensor operator-(const Tensor& x) { return neg(x); }
Tensor operator<(const Tensor& a, const Tensor& b) { return binary(OpKind::Lt, a, b); }
Tensor operator<=(const Tensor& a, const Tensor& b) { return binary(OpKind::Le, a, b); }
Tensor operator>(const Tensor& a, const Tensor& b) { return binary(OpKind::Gt, a, b); }
Tensor operator>=(const Tensor& a, const Tensor& b) { return binary(OpKind::Ge, a, b); }
Tensor operator==(const Tensor& a, const Tensor& b) { return binary(OpKind::Eq, a, b); }
Tensor operator!=(const Tensor& a, const Tensor& b) { return binary(OpKind::Ne, a, b); }
Tensor operator<(const Tensor& a, Scalar b) { return binary(OpKind::Lt, a, b, false); }
Tensor operator<=(const Tensor& a, Scalar b) { return binary(OpKind::Le, a, b, false); }
Tensor operator>(const Tensor& a, Scalar b) { return binary(OpKind::Gt, a, b, false); }
Tensor operator>=(const Tensor& a, Scalar b) { return binary(OpKind::Ge, a, b, false); }
Tensor operator==(const Tensor& a, Scalar b) { return binary(OpKind::Eq, a, b, false); }
Tensor operator!=(const Tensor& a, Scalar b) { return binary(OpKind::Ne, a, b, false); }

// ---- reductions ------------------------------------------------------------------------

namespace {
Tensor reduce(OpKind op, const char* name, const Tensor& x, std::vector<int64_t> dims,
              bool keepdim) {
  OpRecord rec;
  dims = detail::reduce_dims(name, x, std::move(dims));
  ir::Value v = rec.ctx.value_of(x);
  if (op == OpKind::ReduceSum && !is_floating(x.dtype())) v = rec.b().convert(v, DType::Int64);
  if (op != OpKind::ReduceSum) {
    for (int64_t d : dims)
      LOOM_CHECK_T(ShapeError, x.shape()[d] > 0, "[", name, "] cannot reduce the empty dim ", d,
                   " of ", TensorType{x.dtype(), x.shape()}, ": the result has no identity");
  }
  return rec.ctx.wrap(rec.b().reduce(op, v, std::move(dims), keepdim));
}
}  // namespace

Tensor sum(const Tensor& x) { return sum(x, {}, false); }
Tensor sum(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  return reduce(OpKind::ReduceSum, "sum", x, std::move(dims), keepdim);
}
Tensor max(const Tensor& x) { return max(x, {}, false); }
Tensor max(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  return reduce(OpKind::ReduceMax, "max", x, std::move(dims), keepdim);
}
Tensor min(const Tensor& x) { return min(x, {}, false); }
Tensor min(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  return reduce(OpKind::ReduceMin, "min", x, std::move(dims), keepdim);
}

Tensor argmax(const Tensor& x) {
  LOOM_CHECK_T(ShapeError, x.numel() > 0, "[argmax] expected a non-empty tensor, got ",
               TensorType{x.dtype(), x.shape()});
  return argmax(reshape(x, {x.numel()}), 0, false);
}
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  OpRecord rec;
  int64_t d = normalize_axis("argmax", dim, x.dim());
  ir::Value v = rec.ctx.value_of(x);
  if (x.dim() == 0) v = rec.b().reshape(v, Shape{1});
  ir::Value r = rec.b().argmax(v, d, keepdim && x.dim() > 0);
  return rec.ctx.wrap(r);
}

Tensor argsort(const Tensor& x, int64_t dim, bool descending) {
  if (x.dtype() == DType::Bool) return argsort(to(x, DType::Int32), dim, descending);
  OpRecord rec;
  int64_t d = normalize_axis("argsort", dim, x.dim());
  ir::Value v = rec.ctx.value_of(x);
  if (x.dim() == 0) v = rec.b().reshape(v, Shape{1});
  ir::Value r = rec.b().argsort(v, d, descending);
  if (x.dim() == 0) r = rec.b().reshape(r, Shape{});
  return rec.ctx.wrap(r);
}

}  // namespace loom
