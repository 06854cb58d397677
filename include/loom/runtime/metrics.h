// Metrics: counters and timers of the runtime, after PyTorch/XLA's metrics report.
//
//   loom::reset_metrics();  ...  std::cout << loom::metrics_report();
// `compiles` counts graphs compiled (cache misses that generated code), `disk_cache_hits`
// cache misses whose code all came from the persistent cache (LOOM_CACHE_DIR), `cache_hits`
// graphs found compiled in memory, `executions` executable runs; `trace_seconds` covers recording
// ops, `compile_seconds` passes, code generation and linking, `execute_seconds` running
// executables. Counters are process-wide and thread-safe (atomics).
#pragma once

#include <cstdint>
#include <string>

namespace loom {

struct Metrics {
  int64_t compiles = 0, cache_hits = 0, executions = 0;
  double trace_seconds = 0, compile_seconds = 0, execute_seconds = 0;
  int64_t ops_traced = 0;           // nodes requested from the tracer (hash-consed ones included)
  int64_t syncs = 0;                // graph cuts that ran something
  int64_t sync_nodes = 0;           // nodes of all graphs cut so far
  int64_t cache_evictions = 0;      // LRU evictions from the compile cache
  int64_t cache_entries = 0;        // entries in the compile cache now
  int64_t pending_compactions = 0;  // garbage collections of the pending graph
  int64_t host_scalars = 0;         // host scalars passed as graph inputs (not constants)
  int64_t donated_buffers = 0;      // outputs written into the memory of dead input tensors
  int64_t bodies_traced = 0;        // loop bodies and assume_pure functions traced
  int64_t pure_hits = 0;            // assume_pure calls answered from its cache (fn not run)
  double sync_seconds = 0;          // cutting, fingerprinting and cache lookup (no compile/run)
  int64_t recompiles = 0;           // compiles of a graph name that compiled before (explained)
  // The persistent cache (counted per LLVM module, i.e. per compiled graph or loop body):
  int64_t disk_cache_hits = 0;            // graphs whose code was all loaded from disk
  int64_t disk_cache_loads = 0;           // modules loaded
  int64_t disk_cache_misses = 0;          // modules not found (then compiled and written)
  int64_t disk_cache_writes = 0;          // modules written
  int64_t disk_cache_write_failures = 0;  // modules that could not be written
  int64_t disk_cache_rejected = 0;        // corrupt, truncated, foreign or stale entries removed
  int64_t disk_cache_evictions = 0;       // entries removed to keep the directory bounded
};

Metrics metrics();
void reset_metrics();
// A readable multi-line report of every counter and timer, then per graph name (see
// loom/runtime/diagnostics.h) and the recompile explanations, with a warning for names that
// compile again and again.
std::string metrics_report();

namespace detail {
// The live counters; runtime and trace add to them.
struct MetricCounters;
MetricCounters& counters();
// Monotonic seconds, cheap enough to call per sync (not per op).
double now_seconds();
}  // namespace detail

}  // namespace loom
