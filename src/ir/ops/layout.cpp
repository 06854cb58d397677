// Type rules of layout ops (reshape, permute, expand, slice, concat) and indexing ops.
#include "ir/ops/infer_impl.h"

namespace loom::ir::detail {

namespace {
Shape ints_shape(const Attrs& a) { return Shape(a.ints.begin(), a.ints.end()); }

TensorType infer_permute(const TensorType& x, const Attrs& a) {
  int64_t r = x.shape.rank();
  std::vector<bool> seen(r, false);
  bool ok = static_cast<int64_t>(a.ints.size()) == r;
  for (size_t i = 0; ok && i < a.ints.size(); ++i) {
    int64_t p = a.ints[i];
    ok = p >= 0 && p < r && !seen[p];
    if (ok) seen[p] = true;
  }
  LOOM_CHECK_T(ShapeError, ok, "[permute] perm ", ints_shape(a), " is not a permutation of the ", r,
               " dims of ", x);
  Shape s;
  for (int64_t p : a.ints) s.push_back(x.shape[p]);
  return {x.dtype, s};
}

TensorType infer_expand(const TensorType& x, const Attrs& a) {
  Shape target = ints_shape(a);
  check_shape("expand", target);
  bool ok = target.size() >= x.shape.size();
  size_t off = ok ? target.size() - x.shape.size() : 0;
  for (size_t i = 0; ok && i < x.shape.size(); ++i)
    ok = x.shape[i] == target[off + i] || x.shape[i] == 1;
  LOOM_CHECK_T(ShapeError, ok, "[expand] cannot expand ", x, " to ", target,
               "; expected each dim equal or 1 (aligned on the right)");
  return {x.dtype, target};
}

TensorType infer_slice(const TensorType& x, const Attrs& a) {
  int64_t r = x.shape.rank();
  LOOM_CHECK_T(ShapeError, a.i >= 0 && a.i < r, "[slice] axis ", a.i, " out of range for ", x);
  LOOM_CHECK_T(ShapeError, a.ints.size() == 3, "[slice] expected range=[start,end,step], got ",
               a.ints.size(), " values");
  int64_t start = a.ints[0], end = a.ints[1], step = a.ints[2], dim = x.shape[a.i];
  LOOM_CHECK_T(ShapeError, 0 <= start && start <= end && end <= dim && step >= 1, "[slice] range [",
               start, ", ", end, ", step ", step, "] invalid for axis ", a.i, " of ", x,
               "; expected 0 <= start <= end <= ", dim, " and step >= 1");
  Shape s = x.shape;
  s[a.i] = end == start ? 0 : (end - start - 1) / step + 1;  // no overflow for huge steps
  return {x.dtype, s};
}

TensorType infer_concat(const Graph& g, std::span<const Value> xs, const Attrs& a) {
  LOOM_CHECK_T(ShapeError, !xs.empty(), "[concat] expected at least one operand");
  const TensorType& x0 = g.type(xs[0]);
  int64_t r = x0.shape.rank();
  LOOM_CHECK_T(ShapeError, a.i >= 0 && a.i < r, "[concat] axis ", a.i, " out of range for ", x0);
  Shape s = x0.shape;
  s[a.i] = 0;
  for (Value v : xs) {
    const TensorType& t = g.type(v);
    bool ok = t.dtype == x0.dtype && t.shape.rank() == r;
    for (int64_t d = 0; ok && d < r; ++d) ok = d == a.i || t.shape[d] == x0.shape[d];
    LOOM_CHECK_T(ShapeError, ok, "[concat] operands ", operand_types(g, xs),
                 " differ outside axis ", a.i, "; expected one dtype and equal other dims");
    s[a.i] += t.shape[a.i];
    check_shape("concat", s);
  }
  return {x0.dtype, s};
}
}  // namespace

TensorType infer_layout(const Graph& g, OpKind op, std::span<const Value> xs, const Attrs& a) {
  if (op == OpKind::Concat) return infer_concat(g, xs, a);
  const TensorType& x = g.type(xs[0]);
  switch (op) {
    case OpKind::Reshape: {
      Shape s = ints_shape(a);
      check_shape("reshape", s);
      LOOM_CHECK_T(ShapeError, s.numel() == x.numel(), "[reshape] cannot reshape ", x, " (",
                   x.numel(), " elements) to ", s, " (", s.numel(), " elements)");
      return {x.dtype, s};
    }
    case OpKind::Permute: return infer_permute(x, a);
    case OpKind::Expand: return infer_expand(x, a);
    case OpKind::Slice: return infer_slice(x, a);
    default: break;
  }
  LOOM_ASSERT(false);
  return {};
}

TensorType infer_index(const Graph& g, OpKind op, std::span<const Value> xs, const Attrs& a) {
  const char* name = op_name(op).data();
  const TensorType& x = g.type(xs[0]);
  int64_t r = x.shape.rank();
  if (op == OpKind::ArgSort) {
    LOOM_CHECK_T(ShapeError, a.i >= 0 && a.i < std::max<int64_t>(r, 1), "[argsort] axis ", a.i,
                 " out of range for ", x, "; expected 0 <= axis < ", std::max<int64_t>(r, 1));
    LOOM_CHECK_T(DTypeError, x.dtype != DType::Bool, "[argsort] expected a numeric operand, got ",
                 x);
    return {DType::Int64, x.shape};
  }
  const TensorType& idx = g.type(xs[1]);
  LOOM_CHECK_T(DTypeError, is_integral(idx.dtype), "[", name,
               "] index must be int32 or int64, got ", operand_types(g, xs));
  LOOM_CHECK_T(ShapeError, a.i >= 0 && a.i < r, "[", name, "] axis ", a.i, " out of range for ", x);
  if (op == OpKind::IndexSelect || op == OpKind::IndexAdd) {
    LOOM_CHECK_T(ShapeError, idx.shape.rank() == 1, "[", name, "] index must be 1-d, got ", idx);
    Shape s = x.shape;
    s[a.i] = idx.shape[0];
    if (op == OpKind::IndexSelect) return {x.dtype, s};
    const TensorType& src = g.type(xs[2]);
    LOOM_CHECK_T(DTypeError, src.dtype == x.dtype,
                 "[index_add] source and base must have one dtype, got ", operand_types(g, xs));
    LOOM_CHECK_T(ShapeError, src.shape == s, "[index_add] source ", src, " does not fit base ", x,
                 " and index ", idx, " along axis ", a.i, "; expected shape ", s);
    return x;
  }
  bool ok = idx.shape.rank() == r;
  for (int64_t d = 0; ok && d < r; ++d) ok = d == a.i || idx.shape[d] <= x.shape[d];
  LOOM_CHECK_T(ShapeError, ok, "[gather] index ", idx, " does not fit ", x, " along axis ", a.i,
               "; expected the same rank and index dims <= input dims off the axis");
  return {x.dtype, idx.shape};
}

}  // namespace loom::ir::detail
