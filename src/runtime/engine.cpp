// The engine: compile cache (bounded LRU behind a reader/writer lock) and graph execution.
#include "loom/runtime/engine.h"

#include <atomic>
#include <cstdio>
#include <list>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

#include "loom/backend/cpu_backend.h"
#include "loom/backend/ref_backend.h"
#include "loom/core/config.h"
#include "loom/core/error.h"
#include "loom/passes/pass.h"
#include "runtime/metrics_impl.h"

namespace loom::runtime {

namespace {

struct KeyHash {
  size_t operator()(const CacheKey& k) const {
    uint64_t h = hash_combine(k.fingerprint.lo, k.fingerprint.hi);
    h = hash_combine(h, k.signature);
    h = hash_combine(h, k.options);
    for (char c : k.backend) h = hash_combine(h, static_cast<unsigned char>(c));
    return hash_combine(h, static_cast<uint64_t>(k.format));
  }
};

struct Entry {
  CacheKey key;
  std::shared_ptr<const backend::Executable> exe;
#ifndef NDEBUG
  ir::Graph graph;  // for the structural-equality check on hits
#endif
};

class CompileCache {
 public:
  std::shared_ptr<const backend::Executable> find(const CacheKey& key, const ir::Graph& g) {
    std::unique_lock lock(mu_);  // a hit reorders the LRU list, so it writes
    auto it = map_.find(key);
    if (it == map_.end()) return nullptr;
    lru_.splice(lru_.begin(), lru_, it->second);
#ifndef NDEBUG
    LOOM_ASSERT(ir::structurally_equal(it->second->graph, g));
#endif
    return it->second->exe;
  }
  void insert(CacheKey key, std::shared_ptr<const backend::Executable> exe, const ir::Graph& g) {
    std::unique_lock lock(mu_);
    if (map_.count(key)) return;
#ifndef NDEBUG
    lru_.push_front(Entry{key, std::move(exe), g});
#else
    lru_.push_front(Entry{key, std::move(exe)});
#endif
    map_.emplace(std::move(key), lru_.begin());
    evict_locked();
  }
  void set_capacity(int64_t n) {
    std::unique_lock lock(mu_);
    capacity_ = std::max<int64_t>(1, n);
    evict_locked();
  }
  void clear() {
    std::unique_lock lock(mu_);
    map_.clear();
    lru_.clear();
  }
  int64_t size() {
    std::shared_lock lock(mu_);
    return static_cast<int64_t>(lru_.size());
  }

 private:
  void evict_locked() {
    while (static_cast<int64_t>(lru_.size()) > capacity_) {
      map_.erase(lru_.back().key);
      lru_.pop_back();
      loom::detail::counters().cache_evictions++;
    }
  }

  std::shared_mutex mu_;
  int64_t capacity_ = config().cache_size;
  std::list<Entry> lru_;
  std::unordered_map<CacheKey, std::list<Entry>::iterator, KeyHash> map_;
};

CompileCache& cache() {
  static CompileCache c;
  return c;
}

std::unique_ptr<backend::Backend> make_backend(std::string_view name) {
  if (name.empty() || name == "cpu") return backend::make_cpu_backend();
  if (name == "ref") return backend::make_ref_backend();
  throw Error(loom::detail::str_cat("[backend] unknown backend '", name,
                                    "'; expected one of: cpu, ref"));
}

std::mutex backend_mu;
std::atomic<uint64_t> generation{1};
std::unique_ptr<backend::Backend>& backend_slot() {
  static std::unique_ptr<backend::Backend> b = make_backend(config().backend);
  return b;
}

uint64_t signature_of(const ir::Graph& g) {
  uint64_t h = g.params().size();
  for (ir::NodeId p : g.params()) {
    const TensorType& t = g.node(p).type;
    h = hash_combine(h, static_cast<uint64_t>(t.dtype));
    for (int64_t d : t.shape) h = hash_combine(h, static_cast<uint64_t>(d));
  }
  return h;
}

}  // namespace

const backend::Backend& current_backend() {
  std::lock_guard lock(backend_mu);
  return *backend_slot();
}
void set_backend(std::string_view name) {
  auto b = make_backend(name);
  std::lock_guard lock(backend_mu);
  backend_slot() = std::move(b);
  generation++;
}

std::shared_ptr<const backend::Executable> compile_cached(const ir::Graph& g) {
  double t0 = loom::detail::now_seconds();
  const backend::Backend& be = current_backend();
  backend::CompileOptions options;
  CacheKey key{ir::fingerprint(g), signature_of(g), std::string(be.name()), options.hash()};
  auto& counters = loom::detail::counters();
  if (auto exe = cache().find(key, g)) {
    counters.cache_hits++;
    loom::detail::add_ns(counters.sync_ns, loom::detail::now_seconds() - t0);
    return exe;
  }
  ir::Graph optimized = g;
  passes::default_pipeline().run(optimized);
  auto exe = be.compile(optimized, options);
  double dt = loom::detail::now_seconds() - t0;
  counters.compiles++;
  loom::detail::add_ns(counters.compile_ns, dt);
  if (config().debug) {
    std::fprintf(stderr, "[loom] compile %s: %zu nodes (%zu after passes), %zu inputs, %.3f ms, %s\n",
                 key.fingerprint.hex().c_str(), g.size(), optimized.size(), g.params().size(),
                 dt * 1e3, key.backend.c_str());
  }
  cache().insert(std::move(key), exe, g);
  return exe;
}

std::vector<Buffer> run_executable(const backend::Executable& exe,
                                   std::span<const Buffer> inputs,
                                   std::span<const uint8_t> donated) {
  double t0 = loom::detail::now_seconds();
  std::vector<Buffer> out = donated.empty() ? exe.run(inputs) : exe.run(inputs, donated);
  auto& counters = loom::detail::counters();
  counters.executions++;
  loom::detail::add_ns(counters.execute_ns, loom::detail::now_seconds() - t0);
  return out;
}

std::vector<Buffer> run_graph(const ir::Graph& g, std::span<const Buffer> inputs) {
  return run_executable(*compile_cached(g), inputs);
}

void count_cache_hit() { loom::detail::counters().cache_hits++; }
uint64_t cache_generation() { return generation.load(std::memory_order_acquire); }

void clear_compile_cache() {
  cache().clear();
  generation++;
}
int64_t compile_cache_size() { return cache().size(); }
void set_compile_cache_capacity(int64_t entries) { cache().set_capacity(entries); }

}  // namespace loom::runtime
