// The live metric counters (atomics), shared by runtime and trace.
#pragma once

#include <atomic>

#include "loom/runtime/metrics.h"

namespace loom::detail {

struct MetricCounters {
  std::atomic<int64_t> compiles{0}, cache_hits{0}, executions{0}, ops_traced{0}, syncs{0},
      sync_nodes{0}, cache_evictions{0}, pending_compactions{0}, host_scalars{0},
      donated_buffers{0}, bodies_traced{0}, pure_hits{0}, disk_hits{0};
  // Timers in nanoseconds.
  std::atomic<int64_t> trace_ns{0}, compile_ns{0}, execute_ns{0}, sync_ns{0};
};

inline void add_ns(std::atomic<int64_t>& t, double seconds) {
  t.fetch_add(static_cast<int64_t>(seconds * 1e9), std::memory_order_relaxed);
}

}  // namespace loom::detail
