// Reference kernels of the collectives: they copy the operand, reorder it so that each rank's
// block is contiguous (all_gather and reduce_scatter along an inner axis), and call the
// current dist::Communicator. The CPU backend runs these as declared fallbacks.
#include <cstring>

#include "backend/ref/ref_impl.h"
#include "loom/core/communicator.h"
#include "loom/core/error.h"

namespace loom::detail::ref {

namespace {

using ir::OpKind;

dist::Communicator& comm_for(const ir::Node& node) {
  const char* op = ir::op_name(node.op).data();
  dist::Communicator& c = dist::require(op);
  if (c.size() != node.attrs.i)
    throw DistError(str_cat("[", ir::op_name(node.op), "] traced for ", node.attrs.i,
                            " ranks, but the current communicator (", c.kind(), ") has ", c.size(),
                            " (rank ", c.rank(), ")"));
  return c;
}

void copy_all(const Array& from, Array& to) {
  const size_t n = static_cast<size_t>(from.type.nbytes());
  if (n) std::memcpy(to.buf.data(), from.buf.data(), n);
}

// [outer, w * inner] blocks <-> [w, outer, inner]: moves block k of each outer row to place k.
// to_blocks: x of shape (.., w*m, ..) split along axis -> w contiguous blocks.
void reorder(const unsigned char* src, unsigned char* dst, int64_t outer, int64_t w,
             int64_t inner_bytes, bool to_blocks) {
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t k = 0; k < w; ++k) {
      const int64_t a = (o * w + k) * inner_bytes;      // interleaved position
      const int64_t b = (k * outer + o) * inner_bytes;  // blocked position
      if (to_blocks)
        std::memcpy(dst + b, src + a, static_cast<size_t>(inner_bytes));
      else
        std::memcpy(dst + a, src + b, static_cast<size_t>(inner_bytes));
    }
}

// Rows before the axis, and the bytes of one rank's slab after it (axis included).
void split_at(const Shape& s, int64_t axis, int64_t extent, DType dt, int64_t* outer,
              int64_t* inner_bytes) {
  *outer = 1;
  for (int64_t d = 0; d < axis; ++d) *outer *= s[static_cast<size_t>(d)];
  int64_t inner = extent;
  for (size_t d = static_cast<size_t>(axis) + 1; d < s.size(); ++d) inner *= s[d];
  *inner_bytes = inner * itemsize(dt);
}

void all_reduce_kernel(const ir::Node& node, std::span<const Array> in, Array& out) {
  dist::Communicator& c = comm_for(node);
  copy_all(in[0], out);
  const dist::ReduceOp op = node.op == OpKind::AllReduceSum   ? dist::ReduceOp::Sum
                            : node.op == OpKind::AllReduceMax ? dist::ReduceOp::Max
                                                              : dist::ReduceOp::Min;
  c.all_reduce(out.buf.data(), out.numel(), out.dtype(), op);
}

void all_gather_kernel(const ir::Node& node, std::span<const Array> in, Array& out) {
  dist::Communicator& c = comm_for(node);
  const Array& x = in[0];
  const int64_t axis = node.attrs.ints[0], w = node.attrs.i;
  int64_t outer, inner_bytes;
  split_at(x.shape(), axis, x.shape()[static_cast<size_t>(axis)], x.dtype(), &outer, &inner_bytes);
  const int64_t bytes = x.type.nbytes();
  auto* dst = static_cast<unsigned char*>(out.buf.data());
  if (outer == 1) {
    c.all_gather(x.buf.data(), dst, bytes);
    return;
  }
  std::vector<unsigned char> blocks(static_cast<size_t>(bytes * w));
  c.all_gather(x.buf.data(), blocks.data(), bytes);
  reorder(blocks.data(), dst, outer, w, inner_bytes, /*to_blocks=*/false);
}

void reduce_scatter_kernel(const ir::Node& node, std::span<const Array> in, Array& out) {
  dist::Communicator& c = comm_for(node);
  const Array& x = in[0];
  const int64_t axis = node.attrs.ints[0], w = node.attrs.i;
  int64_t outer, inner_bytes;
  split_at(x.shape(), axis, x.shape()[static_cast<size_t>(axis)] / w, x.dtype(), &outer,
           &inner_bytes);
  if (outer == 1) {
    c.reduce_scatter(x.buf.data(), out.buf.data(), out.numel(), x.dtype(), dist::ReduceOp::Sum);
    return;
  }
  std::vector<unsigned char> blocks(static_cast<size_t>(x.type.nbytes()));
  reorder(static_cast<const unsigned char*>(x.buf.data()), blocks.data(), outer, w, inner_bytes,
          /*to_blocks=*/true);
  c.reduce_scatter(blocks.data(), out.buf.data(), out.numel(), x.dtype(), dist::ReduceOp::Sum);
}

void broadcast_kernel(const ir::Node& node, std::span<const Array> in, Array& out) {
  dist::Communicator& c = comm_for(node);
  copy_all(in[0], out);
  c.broadcast(out.buf.data(), out.type.nbytes(), static_cast<int>(node.attrs.ints[0]));
}

void identity_kernel(const ir::Node&, std::span<const Array> in, Array& out) {
  copy_all(in[0], out);
}

}  // namespace

void register_collective_kernels(KernelTable& t) {
  t.set(OpKind::AllReduceSum, all_reduce_kernel);
  t.set(OpKind::AllReduceMax, all_reduce_kernel);
  t.set(OpKind::AllReduceMin, all_reduce_kernel);
  t.set(OpKind::AllGather, all_gather_kernel);
  t.set(OpKind::ReduceScatterSum, reduce_scatter_kernel);
  t.set(OpKind::DistBroadcast, broadcast_kernel);
  t.set(OpKind::GradAllReduce, identity_kernel);
}

}  // namespace loom::detail::ref
