// Metrics snapshot, reset and report.
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string_view>

#include "loom/backend/disk_cache.h"
#include "loom/runtime/engine.h"
#include "runtime/metrics_impl.h"
#include "runtime/names_impl.h"

namespace loom {

namespace detail {
MetricCounters& counters() {
  static MetricCounters c;
  return c;
}
double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}
}  // namespace detail

namespace {

// The metrics that live elsewhere (metrics.def: LOOM_METRIC_READ), read for a snapshot.
int64_t read_metric(const char* name, const backend::DiskCacheStats& d) {
  const std::string_view n = name;
  if (n == "cache_entries") return runtime::compile_cache_size();
  if (n == "recompiles") return runtime::detail::recompile_count();
  if (n == "disk_cache_loads") return d.hits;
  if (n == "disk_cache_misses") return d.misses;
  if (n == "disk_cache_writes") return d.writes;
  if (n == "disk_cache_write_failures") return d.write_failures;
  if (n == "disk_cache_rejected") return d.rejected;
  if (n == "disk_cache_evictions") return d.evictions;
  LOOM_ASSERT(false);
  return 0;
}

}  // namespace

Metrics metrics() {
  auto& c = detail::counters();
  const backend::DiskCacheStats d = backend::DiskCache::instance().stats();
  Metrics m;
#define LOOM_METRIC_COUNT(name, doc) m.name = c.name.load(std::memory_order_relaxed);
#define LOOM_METRIC_TIME(name, doc) m.name##_seconds = c.name##_ns * 1e-9;
#define LOOM_METRIC_READ(name, doc) m.name = read_metric(#name, d);
#include "loom/runtime/metrics.def"
#undef LOOM_METRIC_COUNT
#undef LOOM_METRIC_TIME
#undef LOOM_METRIC_READ
  return m;
}

void reset_metrics() {
  auto& c = detail::counters();
#define LOOM_METRIC_COUNT(name, doc) c.name.store(0);
#define LOOM_METRIC_TIME(name, doc) c.name##_ns.store(0);
#define LOOM_METRIC_READ(name, doc)
#include "loom/runtime/metrics.def"
#undef LOOM_METRIC_COUNT
#undef LOOM_METRIC_TIME
#undef LOOM_METRIC_READ
  backend::DiskCache::instance().reset_stats();
  runtime::detail::reset_names();
}

// Every metric of metrics.def, a line each; the persistent cache's only when it is on or was
// used.
std::string metrics_report() {
  const Metrics m = metrics();
  const std::string dir = runtime::cache_dir();
  const bool disk =
      !dir.empty() || m.disk_cache_loads || m.disk_cache_writes || m.disk_cache_write_failures;
  std::string out =
      detail::str_cat("loom metrics (backend ", runtime::current_backend().name(), ")\n");
  char buf[160];
  auto line = [&](const char* name, const std::string& value, const char* doc) {
    if (!disk && std::string_view(name).starts_with("disk_cache")) return;
    std::snprintf(buf, sizeof buf, "  %-26s %-12s %s\n", name, value.c_str(), doc);
    out += buf;
  };
  auto seconds = [](double s) {
    char b[32];
    std::snprintf(b, sizeof b, "%.6f", s);
    return std::string(b);
  };
#define LOOM_METRIC_COUNT(name, doc) line(#name, std::to_string(m.name), doc);
#define LOOM_METRIC_TIME(name, doc) line(#name "_seconds", seconds(m.name##_seconds), doc);
#define LOOM_METRIC_READ(name, doc) line(#name, std::to_string(m.name), doc);
#include "loom/runtime/metrics.def"
#undef LOOM_METRIC_COUNT
#undef LOOM_METRIC_TIME
#undef LOOM_METRIC_READ
  if (disk)
    out += detail::str_cat("  disk cache directory       ", dir.empty() ? "(off)" : dir, "\n");
  return out + runtime::detail::names_report();
}

}  // namespace loom
