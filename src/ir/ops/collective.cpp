// Type rules of the dist family: all_reduce_*, all_gather, reduce_scatter_sum, dist_broadcast,
// grad_all_reduce, and the partitioner's shard and mesh_* collectives (ops.def, docs/ir.md).
#include "ir/ops/infer_impl.h"
#include "loom/ir/sharding.h"

namespace loom::ir::detail {

namespace {

TensorType infer_mesh(OpKind op, const TensorType& x, const Attrs& a) {
  const std::string_view name = op_name(op);
  if (op == OpKind::Shard) {
    const Sharding s = decode_sharding(a, x.shape.rank());
    for (size_t d = 0; d < s.dims.size(); ++d)
      LOOM_CHECK_T(ShapeError, x.shape[d] % s.shards(d) == 0, "[shard] dim ", d, " of ", x,
                   " does not split evenly into ", s.shards(d), " blocks (", to_string(s), ")");
    return x;
  }
  const size_t lead = mesh_dims(op);
  LOOM_CHECK(a.ints.size() >= lead + 1 && a.ints.size() <= lead + 16, "[", name, "] expected ",
             lead == 2 ? "dims_mesh = [split, concat, " : "mesh = [dim, ", "mesh extents...]");
  std::vector<int64_t> mesh(a.ints.begin() + static_cast<std::ptrdiff_t>(lead), a.ints.end());
  check_mesh(name.data(), mesh);
  LOOM_CHECK(a.i >= 1 && a.i < (int64_t{1} << mesh.size()), "[", name,
             "] group must be a non-empty mask of the mesh's ", mesh.size(), " axes, got ", a.i);
  if (op == OpKind::MeshAllReduce) return x;
  const int64_t dim = a.ints[0], n = group_size(mesh, static_cast<uint32_t>(a.i));
  LOOM_CHECK_T(ShapeError, dim >= 0 && dim < x.shape.rank(), "[", name,
               "] dim must be one dim of the operand ", x, ", got ", dim);
  Shape s = x.shape;
  const size_t d = static_cast<size_t>(dim);
  if (op == OpKind::MeshAllToAll) {
    const int64_t concat = a.ints[1];
    LOOM_CHECK_T(ShapeError, concat >= 0 && concat < x.shape.rank() && concat != dim, "[", name,
                 "] concat must be a dim of the operand ", x, " other than split ", dim, ", got ",
                 concat);
    LOOM_CHECK_T(ShapeError, s[d] % n == 0, "[", name, "] dim ", d, " of ", x,
                 " must split evenly into ", n, " blocks");
    s[d] /= n;
    const size_t c = static_cast<size_t>(concat);
    LOOM_CHECK_T(ShapeError, !__builtin_mul_overflow(s[c], n, &s[c]), "[", name, "] dim ", c,
                 " of ", x, " gathered from ", n, " ranks overflows int64");
  } else if (op == OpKind::MeshAllGather) {
    LOOM_CHECK_T(ShapeError, !__builtin_mul_overflow(s[d], n, &s[d]), "[", name, "] dim ", d,
                 " of ", x, " gathered from ", n, " ranks overflows int64");
  } else {
    LOOM_CHECK_T(ShapeError, s[d] % n == 0, "[", name, "] dim ", d, " of ", x,
                 " must split evenly into ", n, " blocks");
    s[d] /= n;
  }
  check_shape(name.data(), s);
  return {x.dtype, s};
}

}  // namespace

TensorType infer_collective(const Graph& g, OpKind op, std::span<const Value> xs, const Attrs& a) {
  const std::string_view name = op_name(op);
  const TensorType& x = g.type(xs[0]);
  if (op == OpKind::Shard || op == OpKind::MeshAllReduce || op == OpKind::MeshAllGather ||
      op == OpKind::MeshSlice || op == OpKind::MeshReduceScatter || op == OpKind::MeshAllToAll)
    return infer_mesh(op, x, a);
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
