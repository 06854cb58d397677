// Metrics snapshot, reset and report.
#include <chrono>
#include <cstdio>
#include <sstream>

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

Metrics metrics() {
  auto& c = detail::counters();
  Metrics m;
  m.compiles = c.compiles;
  m.cache_hits = c.cache_hits;
  m.executions = c.executions;
  m.ops_traced = c.ops_traced;
  m.syncs = c.syncs;
  m.sync_nodes = c.sync_nodes;
  m.cache_evictions = c.cache_evictions;
  m.cache_entries = runtime::compile_cache_size();
  m.pending_compactions = c.pending_compactions;
  m.host_scalars = c.host_scalars;
  m.donated_buffers = c.donated_buffers;
  m.bodies_traced = c.bodies_traced;
  m.pure_hits = c.pure_hits;
  m.trace_seconds = c.trace_ns * 1e-9;
  m.compile_seconds = c.compile_ns * 1e-9;
  m.execute_seconds = c.execute_ns * 1e-9;
  m.sync_seconds = c.sync_ns * 1e-9;
  m.recompiles = runtime::detail::recompile_count();
  m.disk_cache_hits = c.disk_hits;
  backend::DiskCacheStats d = backend::DiskCache::instance().stats();
  m.disk_cache_loads = d.hits;
  m.disk_cache_misses = d.misses;
  m.disk_cache_writes = d.writes;
  m.disk_cache_write_failures = d.write_failures;
  m.disk_cache_rejected = d.rejected;
  m.disk_cache_evictions = d.evictions;
  return m;
}

void reset_metrics() {
  auto& c = detail::counters();
  for (auto* a : {&c.compiles, &c.cache_hits, &c.executions, &c.ops_traced, &c.syncs, &c.sync_nodes,
                  &c.cache_evictions, &c.pending_compactions, &c.host_scalars, &c.donated_buffers,
                  &c.bodies_traced, &c.pure_hits, &c.disk_hits, &c.trace_ns, &c.compile_ns,
                  &c.execute_ns, &c.sync_ns})
    a->store(0);
  backend::DiskCache::instance().reset_stats();
  runtime::detail::reset_names();
}

std::string metrics_report() {
  Metrics m = metrics();
  char buf[2048];
  std::snprintf(buf, sizeof buf,
                "loom metrics (backend %s)\n"
                "  compiles            %lld\n"
                "  cache_hits          %lld\n"
                "  executions          %lld\n"
                "  syncs               %lld (%lld nodes cut)\n"
                "  ops_traced          %lld\n"
                "  host_scalars        %lld\n"
                "  donated_buffers     %lld\n"
                "  bodies_traced       %lld\n"
                "  pure_hits           %lld\n"
                "  cache_entries       %lld (%lld evicted)\n"
                "  pending_compactions %lld\n"
                "  trace_seconds       %.6f\n"
                "  sync_seconds        %.6f\n"
                "  compile_seconds     %.6f\n"
                "  execute_seconds     %.6f\n"
                "  recompiles          %lld\n",
                std::string(runtime::current_backend().name()).c_str(),
                static_cast<long long>(m.compiles), static_cast<long long>(m.cache_hits),
                static_cast<long long>(m.executions), static_cast<long long>(m.syncs),
                static_cast<long long>(m.sync_nodes), static_cast<long long>(m.ops_traced),
                static_cast<long long>(m.host_scalars), static_cast<long long>(m.donated_buffers),
                static_cast<long long>(m.bodies_traced), static_cast<long long>(m.pure_hits),
                static_cast<long long>(m.cache_entries), static_cast<long long>(m.cache_evictions),
                static_cast<long long>(m.pending_compactions), m.trace_seconds, m.sync_seconds,
                m.compile_seconds, m.execute_seconds, static_cast<long long>(m.recompiles));
  std::string out = buf;
  std::string dir = runtime::cache_dir();
  if (!dir.empty() || m.disk_cache_loads || m.disk_cache_writes || m.disk_cache_write_failures) {
    std::snprintf(
        buf, sizeof buf,
        "  disk cache          %s\n"
        "    graphs from disk  %lld\n"
        "    modules           %lld loaded, %lld missed, %lld written\n"
        "    recoveries        %lld rejected entries, %lld write failures, %lld evicted\n",
        dir.empty() ? "(off)" : dir.c_str(), static_cast<long long>(m.disk_cache_hits),
        static_cast<long long>(m.disk_cache_loads), static_cast<long long>(m.disk_cache_misses),
        static_cast<long long>(m.disk_cache_writes), static_cast<long long>(m.disk_cache_rejected),
        static_cast<long long>(m.disk_cache_write_failures),
        static_cast<long long>(m.disk_cache_evictions));
    out += buf;
  }
  return out + runtime::detail::names_report();
}

}  // namespace loom
