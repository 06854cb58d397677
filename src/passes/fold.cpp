// Scalar constant folding with the reference backend's arithmetic (ref_backend.h): folding
// must never change a result, so anything the semantics leave open is not folded.
#include <cmath>
#include <cstdint>
#include <limits>

#include "loom/core/half.h"
#include "passes/passes_impl.h"

namespace loom::passes::detail {

namespace {

using ir::OpKind;

double round_float(double v, DType dt) {
  switch (dt) {
    case DType::Float64: return v;
    case DType::Float32: return static_cast<float>(v);
    case DType::Float16: return f16_to_float(float_to_f16(static_cast<float>(v)));
    case DType::BFloat16: return bf16_to_float(float_to_bf16(static_cast<float>(v)));
    default: return v;
  }
}

// Two's-complement wrap of an int64 to the integer dtype.
int64_t wrap(int64_t v, DType dt) {
  return dt == DType::Int32 ? static_cast<int32_t>(static_cast<uint32_t>(v)) : v;
}

// The double holding int64 v exactly, if any (integer constants keep their value in f).
std::optional<double> exact_double(int64_t v) {
  double d = static_cast<double>(v);
  if (std::fabs(d) >= 9.2e18 || static_cast<int64_t>(d) != v) return std::nullopt;
  return d;
}

std::optional<double> fold_float(OpKind op, std::span<const double> x) {
  double a = x[0], b = x.size() > 1 ? x[1] : 0;
  switch (op) {
    case OpKind::Neg: return -a;
    case OpKind::Abs: return std::fabs(a);
    case OpKind::Exp: return std::exp(a);
    case OpKind::Log: return std::log(a);
    case OpKind::Sqrt: return std::sqrt(a);
    case OpKind::Tanh: return std::tanh(a);
    case OpKind::Sin: return std::sin(a);
    case OpKind::Cos: return std::cos(a);
    case OpKind::Erf: return std::erf(a);
    case OpKind::Add: return a + b;
    case OpKind::Sub: return a - b;
    case OpKind::Mul: return a * b;
    case OpKind::Div: return a / b;
    case OpKind::Pow: return std::pow(a, b);
    case OpKind::Maximum:
    case OpKind::Minimum:
      // NaN propagation and the order of signed zeros are the backend's choice.
      if (std::isnan(a) || std::isnan(b) || (a == b && std::signbit(a) != std::signbit(b)))
        return std::nullopt;
      return op == OpKind::Maximum ? std::fmax(a, b) : std::fmin(a, b);
    default: return std::nullopt;
  }
}

std::optional<int64_t> fold_int(OpKind op, std::span<const double> x) {
  auto a = static_cast<int64_t>(x[0]), b = x.size() > 1 ? static_cast<int64_t>(x[1]) : 0;
  auto ua = static_cast<uint64_t>(a), ub = static_cast<uint64_t>(b);
  switch (op) {
    case OpKind::Neg: return static_cast<int64_t>(0 - ua);
    case OpKind::Abs: return a < 0 ? static_cast<int64_t>(0 - ua) : a;
    case OpKind::Add: return static_cast<int64_t>(ua + ub);
    case OpKind::Sub: return static_cast<int64_t>(ua - ub);
    case OpKind::Mul: return static_cast<int64_t>(ua * ub);
    case OpKind::Div:
      if (b == 0) return 0;                              // int x / 0 -> 0 (docs/ir.md)
      if (b == -1) return static_cast<int64_t>(0 - ua);  // wraps for INT64_MIN / -1
      return a / b;                                      // truncates toward zero
    case OpKind::Maximum: return a > b ? a : b;
    case OpKind::Minimum: return a < b ? a : b;
    default: return std::nullopt;
  }
}

std::optional<bool> fold_compare(OpKind op, double a, double b) {
  switch (op) {
    case OpKind::Eq: return a == b;
    case OpKind::Ne: return a != b;
    case OpKind::Lt: return a < b;
    case OpKind::Le: return a <= b;
    case OpKind::Gt: return a > b;
    case OpKind::Ge: return a >= b;
    case OpKind::And: return a != 0 && b != 0;
    case OpKind::Or: return a != 0 || b != 0;
    default: return std::nullopt;
  }
}

std::optional<double> convert(double v, DType in, DType out) {
  if (out == DType::Bool) return v != 0 ? 1.0 : 0.0;  // ->bool is != 0 (NaN too)
  if (is_floating(out)) return round_float(v, out);
  if (is_floating(in)) {
    // float -> int truncates toward zero; NaN and out-of-range values are left to backends.
    double t = std::trunc(v);
    double lim = out == DType::Int32 ? 2147483648.0 : 9223372036854775808.0;
    if (std::isnan(t) || t >= lim || t < -lim) return std::nullopt;
    v = t;
  }
  return exact_double(wrap(static_cast<int64_t>(v), out));
}

}  // namespace

std::optional<double> constant_value(double f, DType dt) {
  if (is_floating(dt)) return round_float(f, dt);
  if (dt == DType::Bool) return f == 0 || f == 1 ? std::optional<double>(f) : std::nullopt;
  double lim = dt == DType::Int32 ? 2147483648.0 : 9223372036854775808.0;
  if (!(f == std::trunc(f)) || f >= lim || f < -lim) return std::nullopt;
  return f + 0.0;  // an integer has no negative zero
}

std::optional<double> fold_elementwise(OpKind op, std::span<const double> xs, DType in, DType out) {
  if (op == OpKind::Where) return xs[0] != 0 ? xs[1] : xs[2];
  if (op == OpKind::Convert) return convert(xs[0], in, out);
  if (op == OpKind::Not) return xs[0] != 0 ? 0.0 : 1.0;
  if (ir::has_trait(op, ir::kCompare) || op == OpKind::And || op == OpKind::Or) {
    if (in == DType::Bool && op != OpKind::Eq && op != OpKind::Ne && op != OpKind::And &&
        op != OpKind::Or)
      return std::nullopt;
    std::optional<bool> r = fold_compare(op, xs[0], xs[1]);
    if (!r) return std::nullopt;
    return *r ? 1.0 : 0.0;
  }
  if (is_floating(in)) {
    std::optional<double> r = fold_float(op, xs);
    if (!r) return std::nullopt;
    return round_float(*r, out);
  }
  if (in == DType::Bool) return std::nullopt;
  std::optional<int64_t> r = fold_int(op, xs);
  if (!r) return std::nullopt;
  return exact_double(wrap(*r, out));
}

}  // namespace loom::passes::detail
