// Reference kernels of the collectives: they copy the operand, reorder it so that each rank's
// block is contiguous (all_gather and reduce_scatter along an inner axis), and call the
// current dist::Communicator. The CPU backend runs these as declared fallbacks.
#include <cstring>

#include "backend/ref/ref_impl.h"
#include "loom/core/communicator.h"
#include "loom/core/error.h"
#include "loom/ir/sharding.h"

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

// The partitioner's group collectives: the mesh and the group's axes, from node.attrs.
struct Group {
  std::vector<int64_t> mesh;
  uint32_t axes = 0;
  int64_t dim = 0;
  dist::Communicator* comm = nullptr;
  std::vector<int64_t> ranks;  // the calling rank's group, in block order
  int64_t index = 0;           // the calling rank's block
};

Group group_of(const ir::Node& node) {
  Group g;
  g.dim = node.attrs.ints[0];
  g.mesh.assign(node.attrs.ints.begin() + static_cast<std::ptrdiff_t>(ir::mesh_dims(node.op)),
                node.attrs.ints.end());
  g.axes = static_cast<uint32_t>(node.attrs.i);
  g.comm = &dist::require(ir::op_name(node.op).data());
  const int64_t world = ir::group_size(g.mesh, ~0u);
  if (g.comm->size() != world)
    throw DistError(str_cat("[", ir::op_name(node.op), "] partitioned for a mesh of ", world,
                            " ranks, but the current communicator (", g.comm->kind(), ") has ",
                            g.comm->size(), " (rank ", g.comm->rank(), ")"));
  g.ranks = ir::group_ranks(g.mesh, g.axes, g.comm->rank());
  g.index = ir::group_index(g.mesh, g.axes, g.comm->rank());
  return g;
}

// Block `index` of w along an axis: per outer row, the index-th slab of inner_bytes.
void take_block(const unsigned char* src, unsigned char* dst, int64_t outer, int64_t w,
                int64_t index, int64_t inner_bytes) {
  for (int64_t o = 0; o < outer; ++o)
    std::memcpy(dst + o * inner_bytes, src + (o * w + index) * inner_bytes,
                static_cast<size_t>(inner_bytes));
}

// out = the sum of the parts, in their (block) order, so every member of a group gets the same
// bits; bool sums are logical or.
void sum_in_order(const std::vector<Array>& parts, Array& out) {
  const int64_t n = out.numel();
  for (int64_t i = 0; i < n; ++i) {
    double f = 0;
    int64_t k = 0;
    for (const Array& part : parts) {
      if (is_floating(out.dtype()))
        f += part.get_f(i);
      else
        k += part.get_i(i);
    }
    if (is_floating(out.dtype()))
      out.set_f(i, f);
    else
      out.set_i(i, out.dtype() == DType::Bool ? k != 0 : k);
  }
}

// Every rank's x (world * bytes): a group that is not the whole world reads its members' out
// of the world's all_gather, so the communicators need no subgroups.
std::vector<unsigned char> gather_world(const Group& g, const Array& x) {
  std::vector<unsigned char> all(static_cast<size_t>(x.type.nbytes() * g.comm->size()));
  g.comm->all_gather(x.buf.data(), all.data(), x.type.nbytes());
  return all;
}

void mesh_all_reduce_kernel(const ir::Node& node, std::span<const Array> in, Array& out) {
  const Group g = group_of(node);
  copy_all(in[0], out);
  if (static_cast<int64_t>(g.ranks.size()) == g.comm->size()) {
    g.comm->all_reduce(out.buf.data(), out.numel(), out.dtype(),
                       out.dtype() == DType::Bool ? dist::ReduceOp::Max : dist::ReduceOp::Sum);
    return;
  }
  const std::vector<unsigned char> all = gather_world(g, in[0]);
  const int64_t bytes = out.type.nbytes();
  std::vector<Array> parts;
  for (int64_t r : g.ranks) {
    parts.push_back({out.type, Buffer::allocate(static_cast<size_t>(bytes))});
    if (bytes)
      std::memcpy(parts.back().buf.data(), all.data() + r * bytes, static_cast<size_t>(bytes));
  }
  sum_in_order(parts, out);
}

void mesh_all_gather_kernel(const ir::Node& node, std::span<const Array> in, Array& out) {
  const Group g = group_of(node);
  const Array& x = in[0];
  int64_t outer, inner_bytes;
  split_at(x.shape(), g.dim, x.shape()[static_cast<size_t>(g.dim)], x.dtype(), &outer,
           &inner_bytes);
  const std::vector<unsigned char> all = gather_world(g, x);
  const int64_t bytes = x.type.nbytes(), w = static_cast<int64_t>(g.ranks.size());
  auto* dst = static_cast<unsigned char*>(out.buf.data());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t k = 0; k < w; ++k)
      std::memcpy(dst + (o * w + k) * inner_bytes,
                  all.data() + g.ranks[k] * bytes + o * inner_bytes,
                  static_cast<size_t>(inner_bytes));
}

void mesh_reduce_scatter_kernel(const ir::Node& node, std::span<const Array> in, Array& out) {
  const Group g = group_of(node);
  const Array& x = in[0];
  const int64_t w = static_cast<int64_t>(g.ranks.size());
  int64_t outer, inner_bytes;
  split_at(x.shape(), g.dim, x.shape()[static_cast<size_t>(g.dim)] / w, x.dtype(), &outer,
           &inner_bytes);
  if (w == g.comm->size() && out.dtype() != DType::Bool) {  // the whole world: its own call
    const auto* src = static_cast<const unsigned char*>(x.buf.data());
    std::vector<unsigned char> blocks(static_cast<size_t>(x.type.nbytes()));
    if (outer == 1 && x.type.nbytes())
      std::memcpy(blocks.data(), src, blocks.size());
    else
      reorder(src, blocks.data(), outer, w, inner_bytes, /*to_blocks=*/true);
    g.comm->reduce_scatter(blocks.data(), out.buf.data(), out.numel(), x.dtype(),
                           dist::ReduceOp::Sum);
    return;
  }
  // A subgroup: every member's block `index` out of the world's all_gather, summed in block
  // order (the same bits on every member).
  const std::vector<unsigned char> all = gather_world(g, x);
  const int64_t bytes = x.type.nbytes();
  std::vector<Array> parts;
  for (int64_t r : g.ranks) {
    parts.push_back({out.type, Buffer::allocate(static_cast<size_t>(out.type.nbytes()))});
    take_block(all.data() + r * bytes, static_cast<unsigned char*>(parts.back().buf.data()), outer,
               w, g.index, inner_bytes);
  }
  sum_in_order(parts, out);
}

void mesh_slice_kernel(const ir::Node& node, std::span<const Array> in, Array& out) {
  const Group g = group_of(node);
  const Array& x = in[0];
  const int64_t w = static_cast<int64_t>(g.ranks.size());
  int64_t outer, inner_bytes;
  split_at(x.shape(), g.dim, x.shape()[static_cast<size_t>(g.dim)] / w, x.dtype(), &outer,
           &inner_bytes);
  take_block(static_cast<const unsigned char*>(x.buf.data()),
             static_cast<unsigned char*>(out.buf.data()), outer, w, g.index, inner_bytes);
}

// One world all_to_all: member k of the group gets this rank's block k along split; ranks of
// other groups get a zero block of the same size (the communicators have no subgroups).
void mesh_all_to_all_kernel(const ir::Node& node, std::span<const Array> in, Array& out) {
  const Group g = group_of(node);
  const Array& x = in[0];
  const int64_t concat = node.attrs.ints[1], w = static_cast<int64_t>(g.ranks.size());
  const int64_t world = g.comm->size();
  int64_t outer, inner_bytes;
  split_at(x.shape(), g.dim, x.shape()[static_cast<size_t>(g.dim)] / w, x.dtype(), &outer,
           &inner_bytes);
  const int64_t block = outer * inner_bytes;
  std::vector<unsigned char> send(static_cast<size_t>(block * world), 0), recv(send.size());
  for (int64_t k = 0; k < w; ++k)
    take_block(static_cast<const unsigned char*>(x.buf.data()), send.data() + g.ranks[k] * block,
               outer, w, k, inner_bytes);
  g.comm->all_to_all(send.data(), recv.data(), block);
  // Member k's block goes to place k along concat: [w, outer', inner'] -> [outer', w * inner'].
  Shape bs = x.shape();
  bs[static_cast<size_t>(g.dim)] /= w;
  split_at(bs, concat, bs[static_cast<size_t>(concat)], x.dtype(), &outer, &inner_bytes);
  std::vector<unsigned char> members(static_cast<size_t>(block * w));
  for (int64_t k = 0; k < w; ++k)
    if (block)
      std::memcpy(members.data() + k * block, recv.data() + g.ranks[k] * block,
                  static_cast<size_t>(block));
  reorder(members.data(), static_cast<unsigned char*>(out.buf.data()), outer, w, inner_bytes,
          /*to_blocks=*/false);
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
  t.set(OpKind::Shard, identity_kernel);  // the unpartitioned program's meaning
  t.set(OpKind::MeshAllReduce, mesh_all_reduce_kernel);
  t.set(OpKind::MeshAllGather, mesh_all_gather_kernel);
  t.set(OpKind::MeshSlice, mesh_slice_kernel);
  t.set(OpKind::MeshReduceScatter, mesh_reduce_scatter_kernel);
  t.set(OpKind::MeshAllToAll, mesh_all_to_all_kernel);
}

}  // namespace loom::detail::ref
