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
#define LOOM_METRIC_COUNT(name, doc) int64_t name = 0;
#define LOOM_METRIC_TIME(name, doc) double name##_seconds = 0;
#define LOOM_METRIC_READ(name, doc) int64_t name = 0;
#include "loom/runtime/metrics.def"
#undef LOOM_METRIC_COUNT
#undef LOOM_METRIC_TIME
#undef LOOM_METRIC_READ
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
