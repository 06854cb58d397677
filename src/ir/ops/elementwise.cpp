// Type rules of elementwise ops: one dtype across operands, numpy broadcasting of shapes.
#include "ir/ops/infer_impl.h"

namespace loom::ir {

Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b) {
  size_t r = std::max(a.size(), b.size());
  Shape out;
  out.resize(r);
  for (size_t i = 0; i < r; ++i) {
    int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    LOOM_CHECK_T(ShapeError, da == db || da == 1 || db == 1, "[", op,
                 "] shapes do not broadcast: ", a, " and ", b, " (dim ", i, ": ", da, " vs ", db,
                 "); expected equal extents or 1");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

namespace detail {

TensorType infer_elementwise(const Graph& g, OpKind op, std::span<const Value> xs,
                             const TensorType* given) {
  const char* name = op_name(op).data();
  if (op == OpKind::Convert) {
    LOOM_CHECK(given, "[convert] needs a target dtype");
    return {given->dtype, g.type(xs[0]).shape};
  }
  size_t first = op == OpKind::Where ? 1 : 0;
  if (op == OpKind::Where) {
    LOOM_CHECK_T(DTypeError, g.type(xs[0]).dtype == DType::Bool,
                 "[where] condition must be bool: got ", operand_types(g, xs));
  }
  DType dt = g.type(xs[first]).dtype;
  for (size_t i = first + 1; i < xs.size(); ++i) {
    LOOM_CHECK_T(DTypeError, g.type(xs[i]).dtype == dt, "[", name,
                 "] operands must have one dtype: got ", operand_types(g, xs),
                 "; convert one operand first");
  }
  uint32_t t = info(op).traits;
  LOOM_CHECK_T(DTypeError, !(t & kFloatOnly) || is_floating(dt), "[", name,
               "] expected a floating-point operand, got ", operand_types(g, xs));
  LOOM_CHECK_T(DTypeError, !(t & kBoolOnly) || dt == DType::Bool, "[", name,
               "] expected bool operands, got ", operand_types(g, xs));
  LOOM_CHECK_T(DTypeError, !(t & kNumeric) || dt != DType::Bool, "[", name,
               "] expected numeric operands, got ", operand_types(g, xs));
  LOOM_CHECK_T(DTypeError, !((op == OpKind::Neg || op == OpKind::Abs) && dt == DType::Bool), "[",
               name, "] expected a numeric operand, got ", operand_types(g, xs));
  Shape s = g.type(xs[0]).shape;
  for (size_t i = 1; i < xs.size(); ++i) {
    const Shape& o = g.type(xs[i]).shape;
    if (o == s || o.empty()) continue;  // a 0-d operand (a host number) broadcasts to s
    if (s.empty()) {
      s = o;
      continue;
    }
    try {
      s = broadcast_shapes(name, s, o);
    } catch (const ShapeError& e) {  // restate with the operands' dtypes, keep the dim
      const std::string_view what = e.what();
      const size_t at = what.find(" (dim "), end = what.find(')', at);
      const std::string_view dim =
          at == std::string_view::npos ? std::string_view() : what.substr(at, end + 1 - at);
      throw ShapeError(
          loom::detail::str_cat("[", name, "] shapes do not broadcast: ", operand_types(g, xs), dim,
                                "; expected equal extents or 1 in each dim "
                                "(aligned on the right)"));
    }
  }
  return {(t & kCompare) ? DType::Bool : dt, std::move(s)};
}

}  // namespace detail
}  // namespace loom::ir
