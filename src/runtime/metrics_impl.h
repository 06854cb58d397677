// The live metric counters (atomics), shared by runtime and trace.
#pragma once

#include <atomic>

#include "loom/runtime/metrics.h"

namespace loom::detail {

// One atomic per counter of metrics.def; timers in nanoseconds.
struct MetricCounters {
#define LOOM_METRIC_COUNT(name, doc) std::atomic<int64_t> name{0};
#define LOOM_METRIC_TIME(name, doc) std::atomic<int64_t> name##_ns{0};
#define LOOM_METRIC_READ(name, doc)
#include "loom/runtime/metrics.def"
#undef LOOM_METRIC_COUNT
#undef LOOM_METRIC_TIME
#undef LOOM_METRIC_READ
};

inline void add_ns(std::atomic<int64_t>& t, double seconds) {
  t.fetch_add(static_cast<int64_t>(seconds * 1e9), std::memory_order_relaxed);
}

}  // namespace loom::detail
