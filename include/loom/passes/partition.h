// The partitioner: a graph written at global shapes, with `shard` annotations (mark_sharding),
// becomes the graph every rank runs on its own blocks, with the collectives inserted.
//
//   if (passes::has_shardings(g)) {
//     passes::Partitioned p = passes::partition(g);   // p.graph: local shapes, same outputs
//     ... run p.graph; output k is laid out as p.outputs[k] (nullopt: replicated)
//   }
//
// The rules per op are in docs/architecture.md (Sharding); an op without one runs on
// replicated operands, so every graph partitions correctly. The result does not depend on
// the rank: the mesh ops choose blocks when they run.
// Thread-safety: a pure function of the graph.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "loom/ir/graph.h"
#include "loom/ir/sharding.h"

namespace loom::passes {

struct InsertedCollective {
  ir::OpKind op;        // mesh_all_reduce, mesh_all_gather or mesh_slice
  uint32_t group = 0;   // the mesh axes it runs over
  int64_t bytes = 0;    // the rank's bytes in (all_reduce, slice) or out (all_gather)
  ir::NodeId node = 0;  // the global node whose operand it reshards (or the output's node)
};

struct Partitioned {
  ir::Graph graph;  // parameters of local types, the same outputs in the same order
  std::vector<std::optional<ir::Sharding>> outputs;  // nullopt: replicated
  std::vector<InsertedCollective> collectives;
  // The layout of each global node's result 0 (for reports); empty when replicated.
  std::vector<std::optional<ir::Sharding>> values;
};

// True when g holds a shard node (in a body too).
bool has_shardings(const ir::Graph& g);
// Throws ShapeError for a split that does not divide a dim, Error for two meshes in a graph.
Partitioned partition(const ir::Graph& g);
// The layout of every split value ("%12: mesh=[2] (0, None)") and every inserted
// collective with its bytes, one per line.
std::string describe(const Partitioned& p);

}  // namespace loom::passes
