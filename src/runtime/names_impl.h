// Graph names (per-name metrics and compile history) and recompile explanations: the engine's
// side of loom/runtime/diagnostics.h. Private to the runtime room.
#pragma once

#include <array>
#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "loom/ir/graph.h"
#include "loom/runtime/diagnostics.h"

namespace loom::runtime::detail {

// A graph compiled under a name, kept to explain the name's later compiles.
struct GraphRecord {
  std::shared_ptr<const ir::Graph> graph;
  Hash128 fingerprint;
  std::vector<TensorType> params;
  std::array<int32_t, ir::kNumOps> ops{};  // nodes per op kind (a cheap distance)
};

// One graph name. Never freed (threads cache pointers to it); reset_metrics zeroes it.
struct NameStats {
  std::string name;
  std::atomic<int64_t> compiles{0}, hits{0}, disk_hits{0}, compile_ns{0}, execute_ns{0},
      bytes_in{0}, bytes_out{0};
  std::mutex mu;                    // guards history and compile_number
  std::deque<GraphRecord> history;  // the latest compiled graphs, newest last
  int64_t compile_number = 0;       // compiles (and disk hits) ever, for numbering
  std::atomic<bool> warned{false};  // recompile warning printed
};

// The calling thread's current graph name (GraphName, else the sync site, else "(unnamed)").
NameStats& current_name();
// On a compile-cache miss of `g`: explains it against the name's history when the name
// compiled before (records a RecompileReason, prints it under LOOM_EXPLAIN_RECOMPILES), then
// adds g to the history. Consumes the thread's noted causes.
void explain_and_remember(NameStats& name, const ir::Graph& g, const Hash128& fingerprint);
// Drops the thread's noted causes (a sync that did not compile).
void clear_noted_causes();
// Prints a one-time warning when the name recompiles more than once per two syncs (under
// LOOM_EXPLAIN_RECOMPILES or LOOM_DEBUG; metrics_report() always shows it).
void check_recompiling(NameStats& name);
bool is_recompiling(const NameStats& name);

// Metrics support.
void reset_names();
std::string names_report();
int64_t recompile_count();

}  // namespace loom::runtime::detail
