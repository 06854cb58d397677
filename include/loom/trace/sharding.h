// Sharding annotations (GSPMD, torch_xla's mark_sharding): the program is written at global
// shapes; a few tensors say how they are laid out over a mesh of the ranks, and the
// partitioner (loom/passes/partition.h) propagates the layouts through each graph and inserts
// the collectives. loom/dist/dist.h includes this.
//
//   loom::dist::Mesh mesh({2}, {"model"});               // over the current communicator's ranks
//   loom::dist::mark_sharding(w, mesh, {{}, {"model"}}); // w [out, in]: in split over "model"
//   Tensor y = x.matmul(w.t());                          // partial sums, one all_reduce
//
// Materialized data is resharded at once (each rank keeps its block; the shape stays global);
// a pending tensor is annotated in place. Reads gather. Behaviour and errors: README, Sharding.
// Thread-safety: as every op (the thread's graph and communicator).
#pragma once

#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "loom/trace/tensor.h"

namespace loom::dist {

// A mesh over the ranks of the current communicator, in row-major order (rank r has
// coordinates unravel(r, shape)); its size must be the world size when it is used.
class Mesh {
 public:
  // names: one per axis, distinct ("" for unnamed axes: they are referred to by index).
  explicit Mesh(std::vector<int64_t> shape, std::vector<std::string> axis_names = {});
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<std::string>& axis_names() const { return names_; }
  int64_t size() const;
  // The index of a named axis; ShapeError naming the mesh's axes when there is none.
  int axis(const std::string& name) const;
  friend bool operator==(const Mesh& a, const Mesh& b) = default;

 private:
  std::vector<int64_t> shape_;
  std::vector<std::string> names_;
};

// One mesh axis, by name or index.
using MeshAxis = std::variant<int, std::string>;
// Per tensor dim: the mesh axes it is split over, in mesh order (empty: replicated).
using ShardSpec = std::vector<std::vector<MeshAxis>>;

// Lays t out over the mesh (in place): materialized data is resharded now, a pending value is
// annotated.
void mark_sharding(const Tensor& t, const Mesh& mesh, const ShardSpec& spec);

// How t is laid out: its data's layout once materialized, its annotation while pending
// (nullopt: replicated, or not known until its graph runs). As torch_xla's text:
// "mesh=[2] (None, 0)".
std::optional<std::string> sharding_of(const Tensor& t);
// t's whole value on every rank (an all_gather of its blocks; t itself when replicated).
Tensor full(const Tensor& t);
// The sharded tensor whose block on this rank is `piece` (DTensor's from_local): its global
// shape is piece's with each split dim multiplied by its block count. Every rank passes its
// own piece, of the same shape and dtype (DistError on every rank otherwise); the pieces of
// ranks that replicate a block are not compared (each rank's own block is used).
Tensor from_local(const Tensor& piece, const Mesh& mesh, const ShardSpec& spec);

// The partitioner's account of the last graph this thread ran with shardings: the layout of
// every value and every inserted collective with its bytes, one per line ("" when none ran).
std::string sharding_report();

}  // namespace loom::dist
