// Type rules of reductions and the matrix product.
#include "ir/ops/infer_impl.h"

namespace loom::ir::detail {

TensorType infer_reduce(const Graph& g, OpKind op, std::span<const Value> xs, const Attrs& a) {
  const char* name = op_name(op).data();
  const TensorType& x = g.type(xs[0]);
  int64_t r = x.shape.rank();
  if (op == OpKind::ArgMax) {
    LOOM_CHECK_T(ShapeError, a.i >= 0 && a.i < std::max<int64_t>(r, 1), "[argmax] axis ", a.i,
                 " out of range for ", x, "; expected 0 <= axis < ", std::max<int64_t>(r, 1));
    LOOM_CHECK_T(DTypeError, x.dtype != DType::Bool, "[argmax] expected a numeric operand, got ",
                 x);
    if (r > 0)
      LOOM_CHECK_T(ShapeError, x.shape[a.i] > 0, "[argmax] cannot reduce the empty axis ", a.i,
                   " of ", x);
    Shape s;
    for (int64_t d = 0; d < r; ++d) {
      if (d != a.i)
        s.push_back(x.shape[d]);
      else if (a.flag)
        s.push_back(1);
    }
    return {DType::Int64, s};
  }
  LOOM_CHECK_T(DTypeError, op != OpKind::ReduceSum || x.dtype != DType::Bool, "[", name,
               "] expected a numeric operand, got ", x, "; convert bool to an integer type first");
  std::vector<bool> reduced(r, false);
  int64_t prev = -1;
  for (int64_t ax : a.ints) {
    LOOM_CHECK_T(ShapeError, ax > prev && ax < r, "[", name, "] axes ",
                 Shape(a.ints.begin(), a.ints.end()), " invalid for ", x,
                 "; expected sorted unique axes in [0, ", r, ")");
    reduced[ax] = true;
    prev = ax;
  }
  Shape s;
  for (int64_t d = 0; d < r; ++d) {
    if (!reduced[d])
      s.push_back(x.shape[d]);
    else if (a.flag)
      s.push_back(1);
  }
  return {x.dtype, s};
}

TensorType infer_linalg(const Graph& g, OpKind op, std::span<const Value> xs, const Attrs&) {
  const TensorType& a = g.type(xs[0]);
  const TensorType& b = g.type(xs[1]);
  LOOM_CHECK_T(DTypeError, a.dtype == b.dtype && a.dtype != DType::Bool,
               "[matmul] expected numeric operands of one dtype, got ", a, " and ", b);
  LOOM_CHECK_T(ShapeError, a.shape.rank() >= 2 && b.shape.rank() >= 2,
               "[matmul] expected operands of rank >= 2, got ", a, " and ", b);
  int64_t m = a.shape[a.shape.size() - 2], k = a.shape.back();
  int64_t k2 = b.shape[b.shape.size() - 2], n = b.shape.back();
  LOOM_CHECK_T(ShapeError, k == k2, "[matmul] inner dimensions differ: ", a, " x ", b,
               "; expected a[..., M, K] x b[..., K, N]");
  Shape ba(a.shape.begin(), a.shape.end() - 2), bb(b.shape.begin(), b.shape.end() - 2);
  Shape s = broadcast_shapes("matmul", ba, bb);
  s.push_back(m);
  s.push_back(n);
  return {a.dtype, s};
}

}  // namespace loom::ir::detail
