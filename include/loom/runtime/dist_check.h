// The cross-rank check that keeps collectives from hanging: before a graph that holds
// collectives runs (every run), and at every barrier, the ranks compare a short tag (the
// graph's fingerprint, or "barrier") in one small all_reduce of its digest. When the tags
// differ, every rank raises the same DistError naming the ranks and, for graphs, the first
// differing op as IR text (tags and IR text are exchanged only then). A rank that does not
// come within the timeout makes the others raise a DistError naming it (the communicator's
// all_reduce does). Thread-safety: per rank.
#pragma once

#include <string>
#include <string_view>

#include "loom/core/communicator.h"
#include "loom/core/hash.h"
#include "loom/ir/graph.h"

namespace loom::runtime {

// What this rank is about to do, for the check: `tag` must be equal on every rank; `detail`
// (a graph's name and IR text, or a description) is exchanged only on a mismatch.
struct SyncPoint {
  std::string tag;
  std::string name;  // the graph's name or "barrier()"
  std::string ir;    // IR text of a graph; empty for a barrier
};

// Throws DistError on every rank when the ranks' sync points differ (or one does not come).
void check_sync_point(dist::Communicator& c, const SyncPoint& mine);

// True when the graph (or a region in it) holds a collective op.
bool has_collectives(const ir::Graph& g);

}  // namespace loom::runtime
