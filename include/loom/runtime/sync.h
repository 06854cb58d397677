// The runtime's door for the trace room: compiled graphs as opaque handles, the sync fast
// path, sync sites, recompile causes and the trace counters. No backend header: the trace
// room sees executables only as an incomplete type it holds and hands back.
//
//   Hash128 key = ...;                         // the outputs' Merkle hashes
//   if (runtime::SyncHit hit = runtime::find_sync(key)) {
//     ... bind the inputs of hit.plan->slots ...
//     out = runtime::run_sync(hit, inputs, donated);   // counted as a compile-cache hit
//   } else {
//     hit = runtime::compile_sync(&key, cut, slot_ids, slot_types);
//     out = runtime::run_sync(hit, inputs, donated);
//   }
//
// Thread-safety: the sync index is per thread (no lock on a hit); the compile cache behind it
// takes a reader/writer lock; counters are atomics.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <source_location>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "loom/core/buffer.h"
#include "loom/core/hash.h"
#include "loom/ir/graph.h"
#include "loom/ir/sharding.h"
#include "loom/runtime/diagnostics.h"

namespace loom::backend {
class Executable;  // opaque outside the runtime and the backends
}

namespace loom::runtime {

// Creates the selected backend now, so that it prepares (its JIT) while the thread traces.
void prepare_backend();

// The cached executable for `g` (compiling it on a miss), without running it. A miss is
// explained (recompile_reasons) against the graphs compiled before under the same name, as
// `explain_as` when given (the annotated graph a partitioned one came from).
std::shared_ptr<const backend::Executable> compile_cached(const ir::Graph& g,
                                                          const ir::Graph* explain_as = nullptr);
// compile_cached for a graph that may hold shardings: such a graph is partitioned first
// (loom/passes/partition.h), and *info says how the executable's outputs are laid out (null
// when the graph held none).
std::shared_ptr<const backend::Executable> compile_partitioned(
    const ir::Graph& g, std::shared_ptr<const struct PartitionInfo>* info);
// Runs an executable that compile_cached returned, counting it in the metrics.
std::vector<Buffer> run_executable(const backend::Executable& exe, std::span<const Buffer> inputs,
                                   std::span<const uint8_t> donated = {});
// Changes whenever cached executables may no longer be valid for a graph (the cache was
// cleared or the backend replaced); callers that index executables include it in their keys.
uint64_t cache_generation();

// What a sync of some outputs compiled to: the data slots its inputs are bound from (input k
// is slot slots[k], of type slot_types[k]) and the cut's size.
// What the partitioner made of a graph with shardings (loom/passes/partition.h).
struct PartitionInfo {
  std::vector<std::optional<ir::Sharding>> outputs;  // per output; nullopt: replicated
  std::string report;  // every split value's layout and every inserted collective, by line
};

struct SyncPlan {
  std::vector<uint32_t> slots;
  std::vector<TensorType> slot_types;
  // A graph with shardings was partitioned (loom/passes/partition.h): how its outputs are
  // laid out and what it inserted. Null otherwise.
  std::shared_ptr<const PartitionInfo> partition;
  int64_t nodes = 0;
  // The graph calls host code (pure_callback, also in a loop body), which may raise mid-run:
  // its inputs are not donated, so a failed run leaves them, and what reads only them, intact.
  bool calls_host = false;
  Hash128 fingerprint;  // debug builds: checked against a fresh cut on a hit
  std::weak_ptr<const backend::Executable> exe;  // owned by the compile cache
};
// A plan found or made, with its executable held for the run.
struct SyncHit {
  const SyncPlan* plan = nullptr;
  std::shared_ptr<const backend::Executable> exe;
  bool found = false;  // by find_sync: the run counts as a compile-cache hit
  explicit operator bool() const { return plan != nullptr; }
};
// The sync fast path: the thread's index of plans by trace key (the outputs' Merkle hashes
// and cache_generation()). Empty when the key is unknown or its executable left the cache.
SyncHit find_sync(const Hash128& key);
// The miss path: compiles `g` through the compile cache and, when `key` is given, indexes the
// plan under it (the index is bounded: it is cleared when full).
SyncHit compile_sync(const Hash128* key, const ir::Graph& g, std::vector<uint32_t> slots,
                     std::vector<TensorType> slot_types);
// Runs a plan: counts a sync (and, for a plan found by find_sync, a compile-cache hit under
// the current graph name), the donated outputs, and the run.
std::vector<Buffer> run_sync(const SyncHit& hit, std::span<const Buffer> inputs,
                             std::span<const uint8_t> donated);

// The current graph name of the thread (GraphName, else the sync site, else "(unnamed)"), for
// error messages.
const std::string& current_graph_name();

// Names the graph a sync runs by its call site, unless a GraphName is active: the trace room
// creates one in sync(), item(), to_vector() and printing; nested sites keep the outermost.
// Also records the sync's profile spans (the trace span before it, the sync itself).
class SyncSite {
 public:
  explicit SyncSite(const CallSite& loc);
  // A fixed name ("print") for reads made on the user's behalf; an enclosing site wins.
  explicit SyncSite(std::string_view label);
  ~SyncSite();
  SyncSite(const SyncSite&) = delete;
  SyncSite& operator=(const SyncSite&) = delete;

 private:
  explicit SyncSite(void*);
  void* previous_;
  double start_us_ = -1;
};

// Notes why the next compile on this thread happens (assume_pure re-traced for a changed
// static argument or leaf type); the next compile-cache miss reports it, any sync drops it.
// `path` is the tree path of the changed argument leaf ("args[0]['x']"), when one changed.
void note_recompile_cause(RecompileReason::Kind kind, std::string message, std::string before,
                          std::string after, std::string path = {});

// The trace room's counters (loom::metrics()).
void count_traced(int64_t ops, int64_t host_scalars, double seconds);
void count_sync_seconds(double seconds);
void count_body_traced();
void count_pure_hit();
void count_compaction();

}  // namespace loom::runtime
