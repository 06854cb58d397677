// How a value is laid out over a mesh of ranks (GSPMD's sharding, torch_xla's spec form),
// and its encoding in the attributes of a `shard` node (ops.def).
//
// Ranks sit in row-major order over the mesh; a dim split over several axes ravels the rank's
// coordinates in ascending axis order. `partial`: the partitioner's state of a sum of parts.
//
//   Sharding s{{2, 2}, {0b10, 0}};   // dim 0 split over mesh axis 1, dim 1 replicated
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/ir/graph.h"

namespace loom::ir {

struct Sharding {
  std::vector<int64_t> mesh;   // the mesh's shape
  std::vector<uint32_t> dims;  // per tensor dim: the mask of mesh axes it is split over
  uint32_t partial = 0;        // mesh axes over which the value is a sum of the ranks' parts

  // Replicated: no dim split and nothing partial.
  bool replicated() const;
  // The number of blocks along `dim` (the product of its axes' extents).
  int64_t shards(size_t dim) const;
  // The ranks of the mesh.
  int64_t size() const;
  friend bool operator==(const Sharding& a, const Sharding& b) = default;
};

// How many of a mesh collective's leading ints are dims before its mesh extents: [split,
// concat] for mesh_all_to_all, [dim] for the others.
inline size_t mesh_dims(OpKind op) { return op == OpKind::MeshAllToAll ? 2 : 1; }

// The blocks of a group of axes: their number, and this rank's index (`rank` in row-major
// order of `mesh`).
int64_t group_size(const std::vector<int64_t>& mesh, uint32_t axes);
int64_t group_index(const std::vector<int64_t>& mesh, uint32_t axes, int64_t rank);
// The ranks of the group of `rank` over `axes` (the same coordinates on every other axis), in
// block order.
std::vector<int64_t> group_ranks(const std::vector<int64_t>& mesh, uint32_t axes, int64_t rank);

// Error naming `op` unless every extent is >= 1 and the mesh holds at most 2^24 ranks (checked
// without overflow: call before group_size on attributes from outside).
void check_mesh(const char* op, const std::vector<int64_t>& mesh);
// A `shard` node's attributes: ints = [mesh rank, mesh..., dims...], flag = stored.
Attrs encode_sharding(const Sharding& s, bool stored);
Sharding decode_sharding(const Attrs& a, int64_t rank);
// The local shape of a value of global shape `global` laid out by s.
Shape local_shape(const Shape& global, const Sharding& s);
// torch_xla's spelling: "{devices=[2,1] mesh=[2,2] ({1}, None)}" style text for messages.
std::string to_string(const Sharding& s);

}  // namespace loom::ir
