// The collectives of the public API: one dist-family node each (ops.def), world taken from
// the current communicator when traced.
#include "loom/trace/collective.h"

#include "trace/ops_impl.h"

namespace loom::dist {

namespace {

using ir::OpKind;
using loom::detail::OpRecord;
using loom::detail::str_cat;
using loom::detail::type_of;

int64_t world_for(const char* op) { return require(op).size(); }

Tensor record(OpKind op, const Tensor& t, ir::Attrs a) {
  OpRecord rec;
  ir::Value v = rec.ctx.value_of(t);
  return rec.ctx.wrap(rec.b().make(op, std::span<const ir::Value>(&v, 1), std::move(a)));
}

Tensor divide_by_world(const Tensor& t, int64_t world) {
  OpRecord rec;
  ir::Value v = rec.ctx.value_of(t);
  ir::Value w = rec.b().constant(static_cast<double>(world), t.dtype());
  return rec.ctx.wrap(rec.b().binary(OpKind::Div, v, w));
}

void check_mean(const char* op, const Tensor& t) {
  LOOM_CHECK_T(DTypeError, is_floating(type_of(t, op).dtype), "[", op,
               "] mean needs a floating dtype, got ", type_of(t, op),
               " (convert first, or use sum)");
}

int64_t dim_of(const char* op, const Tensor& t, int64_t dim) {
  const int64_t r = type_of(t, op).shape.rank();
  LOOM_CHECK_T(ShapeError, r >= 1, "[", op, "] needs a tensor with at least one dim, got ",
               type_of(t, op));
  LOOM_CHECK_T(ShapeError, dim >= -r && dim < r, "[", op, "] dim ", dim, " out of range for ",
               type_of(t, op));
  return dim < 0 ? dim + r : dim;
}

}  // namespace

Tensor all_reduce(const Tensor& t, ReduceOp op, bool replicated) {
  const char* name = "all_reduce";
  type_of(t, name);
  ir::Attrs a;
  a.i = world_for(name);
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Mean: {
      if (op == ReduceOp::Mean) check_mean(name, t);
      a.flag = replicated;
      Tensor s = record(OpKind::AllReduceSum, t, a);
      return op == ReduceOp::Mean ? divide_by_world(s, a.i) : s;
    }
    case ReduceOp::Max: return record(OpKind::AllReduceMax, t, a);
    case ReduceOp::Min: return record(OpKind::AllReduceMin, t, a);
  }
  return {};
}

Tensor all_gather(const Tensor& t, int64_t dim, bool replicated) {
  const char* name = "all_gather";
  ir::Attrs a;
  a.ints = {dim_of(name, t, dim)};
  a.i = world_for(name);
  a.flag = replicated;
  return record(OpKind::AllGather, t, a);
}

Tensor reduce_scatter(const Tensor& t, int64_t dim, ReduceOp op) {
  const char* name = "reduce_scatter";
  LOOM_CHECK(op == ReduceOp::Sum || op == ReduceOp::Mean, "[", name,
             "] supports sum and mean, got ", reduce_op_name(op));
  if (op == ReduceOp::Mean) check_mean(name, t);
  ir::Attrs a;
  a.ints = {dim_of(name, t, dim)};
  a.i = world_for(name);
  Tensor s = record(OpKind::ReduceScatterSum, t, a);
  return op == ReduceOp::Mean ? divide_by_world(s, a.i) : s;
}

Tensor broadcast(const Tensor& t, int root) {
  const char* name = "broadcast";
  type_of(t, name);
  ir::Attrs a;
  a.i = world_for(name);
  LOOM_CHECK(root >= 0 && root < a.i, "[", name, "] root ", root, " is not a rank of ", a.i);
  a.ints = {root};
  return record(OpKind::DistBroadcast, t, a);
}

Tensor grad_all_reduce(const Tensor& t) {
  const char* name = "grad_all_reduce";
  type_of(t, name);
  ir::Attrs a;
  a.i = world_for(name);
  return record(OpKind::GradAllReduce, t, a);
}

}  // namespace loom::dist
