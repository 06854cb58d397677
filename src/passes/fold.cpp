// Scalar constant folding with the ops' one scalar definition (loom/ir/scalar.h), which the
// reference backend computes with too. Folding must never change a result, so it only adds
// guards: values the semantics leave to the backend (float -> int of NaN or out of range)
// and results a dtype cannot hold exactly are not folded.
#include <cmath>
#include <cstdint>
#include <limits>

#include "loom/core/half.h"
#include "loom/ir/scalar.h"
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
    const bool r = ir::has_trait(op, ir::kCompare)
                       ? ir::scalar_compare(op, xs[0], xs[1])
                       : ir::scalar_int(op, xs[0] != 0, xs[1] != 0) != 0;
    return r ? 1.0 : 0.0;
  }
  // Arithmetic: transcendentals fold in double and are rounded once, as the reference
  // computes them; integers are exact (constant_value) and wrap to the result dtype.
  const double b = xs.size() > 1 ? xs[1] : 0;
  if (is_floating(in)) return round_float(ir::scalar_float(op, xs[0], b), out);
  if (in == DType::Bool) return std::nullopt;
  return exact_double(
      wrap(ir::scalar_int(op, static_cast<int64_t>(xs[0]), static_cast<int64_t>(b)), out));
}

}  // namespace loom::passes::detail
