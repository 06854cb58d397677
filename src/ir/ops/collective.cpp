// Type rules of the dist family: all_reduce_*, all_gather, reduce_scatter_sum, dist_broadcast,
// grad_all_reduce (ops.def, docs/ir.md).
#include "ir/ops/infer_impl.h"

namespace loom::ir::detail {

TensorType infer_collective(const Graph& g, OpKind op, std::span<const Value> xs, const Attrs& a) {
  const std::string_view name = op_name(op);
  const TensorType& x = g.type(xs[0]);
  constexpr int64_t kMaxWorld = int64_t{1} << 24;
  LOOM_CHECK(a.i >= 1 && a.i <= kMaxWorld, "[", name, "] world must be in [1, ", kMaxWorld,
             "], got ", a.i);
  switch (op) {
    case OpKind::AllGather:
    case OpKind::ReduceScatterSum: {
      LOOM_CHECK_T(ShapeError, a.ints.size() == 1 && a.ints[0] >= 0 && a.ints[0] < x.shape.rank(),
                   "[", name, "] axis must be one dim of the operand ", x, ", got ",
                   a.ints.size() == 1 ? std::to_string(a.ints[0]) : std::string("a list"));
      Shape s = x.shape;
      const size_t d = static_cast<size_t>(a.ints[0]);
      if (op == OpKind::AllGather) {
        int64_t gathered = 0;
        LOOM_CHECK_T(ShapeError, !__builtin_mul_overflow(s[d], a.i, &gathered), "[", name, "] dim ",
                     d, " of ", x, " gathered from ", a.i, " ranks overflows int64");
        s[d] = gathered;
      } else {
        LOOM_CHECK_T(ShapeError, s[d] % a.i == 0, "[", name, "] dim ", d, " of ", x,
                     " must split evenly across ", a.i, " ranks");
        s[d] /= a.i;
      }
      check_shape(name.data(), s);
      return {x.dtype, s};
    }
    case OpKind::DistBroadcast:
      LOOM_CHECK(a.ints.size() == 1 && a.ints[0] >= 0 && a.ints[0] < a.i, "[", name,
                 "] root must be a rank in [0, ", a.i, ")");
      return x;
    case OpKind::GradAllReduce:
      LOOM_CHECK_T(DTypeError, is_floating(x.dtype), "[", name,
                   "] expected a floating operand, got ", x);
      return x;
    default: return x;
  }
}

}  // namespace loom::ir::detail
