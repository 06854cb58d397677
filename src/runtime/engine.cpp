// The engine: compile cache (bounded LRU behind a reader/writer lock) and graph execution.
#include "loom/runtime/engine.h"

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <list>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

#include "loom/backend/cpu_backend.h"
#include "loom/backend/disk_cache.h"
#include "loom/backend/ref_backend.h"
#include "loom/core/config.h"
#include "loom/core/error.h"
#include "loom/core/fp_mode.h"
#include "loom/core/profile.h"
#include "loom/passes/partition.h"
#include "loom/passes/pass.h"
#include "loom/runtime/dist_check.h"
#include "runtime/metrics_impl.h"
#include "runtime/names_impl.h"

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
  throw Error(
      loom::detail::str_cat("[backend] unknown backend '", name, "'; expected one of: cpu, ref"));
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

namespace {

std::mutex dump_mu;
std::string& dump_dir() {
  static std::string d = config().dump_ir_dir;
  return d;
}
std::atomic<int64_t> dump_counter{0};

// LOOM_DUMP_IR: the prefix of this compile's files ("" when off).
std::string dump_prefix(const Hash128& fp, std::string* dir) {
  {
    std::lock_guard lock(dump_mu);
    *dir = dump_dir();
  }
  if (dir->empty()) return "";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04lld-%s", static_cast<long long>(dump_counter++),
                fp.hex().substr(0, 16).c_str());
  return buf;
}

void write_dump(const std::string& dir, const std::string& file, const std::string& text) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  std::filesystem::path path = std::filesystem::path(dir) / file;
  std::ofstream os(path);
  os << text;
  if (!os) std::fprintf(stderr, "loom: cannot write IR dump %s\n", path.string().c_str());
}

// A graph holding collectives: before each run, the ranks compare its fingerprint
// (dist_check.h), so that ranks running different graphs raise instead of hanging.
class CollectiveExecutable final : public backend::Executable {
 public:
  CollectiveExecutable(std::shared_ptr<const backend::Executable> inner, const CacheKey& key,
                       const ir::Graph& g)
      : inner_(std::move(inner)),
        tag_("graph " + key.fingerprint.hex() + "/" + std::to_string(key.signature)),
        ir_(ir::to_text(g)) {}

  std::vector<Buffer> run(std::span<const Buffer> inputs) const override {
    check();
    return inner_->run(inputs);
  }
  std::vector<Buffer> run(std::span<const Buffer> inputs,
                          std::span<const uint8_t> donated) const override {
    check();
    return inner_->run(inputs, donated);
  }
  int64_t num_kernels() const override { return inner_->num_kernels(); }
  int64_t num_library_calls() const override { return inner_->num_library_calls(); }
  backend::CodeInfo code_info() const override { return inner_->code_info(); }

 private:
  void check() const {
    dist::Communicator* c = dist::current();
    if (!c) return;  // the collectives themselves raise "no communicator"
    profile::Scope ps("dist", "cross-rank check");  // LOOM_PROFILE shows what the check waits
    check_sync_point(*c, {tag_, "'" + detail::current_name().name + "'", ir_});
  }

  std::shared_ptr<const backend::Executable> inner_;
  std::string tag_, ir_;
};

}  // namespace

std::shared_ptr<const backend::Executable> compile_cached(const ir::Graph& g,
                                                          const ir::Graph* explain_as) {
  double t0 = loom::detail::now_seconds();
  const backend::Backend& be = current_backend();
  backend::CompileOptions options;
  CacheKey key{ir::fingerprint(g), signature_of(g), std::string(be.name()), options.hash()};
  auto& counters = loom::detail::counters();
  detail::NameStats& name = detail::current_name();
  if (auto exe = cache().find(key, g)) {
    counters.cache_hits++;
    name.hits++;
    detail::clear_noted_causes();
    loom::detail::add_ns(counters.sync_ns, loom::detail::now_seconds() - t0);
    return exe;
  }
  profile::Scope ps("compile", [&] { return "compile " + name.name; });
  if (explain_as)  // a partitioned graph: its misses are told on the annotated graph
    detail::explain_and_remember(name, *explain_as, ir::fingerprint(*explain_as));
  else
    detail::explain_and_remember(name, g, key.fingerprint);
  std::string dir;
  const std::string prefix = dump_prefix(key.fingerprint, &dir);
  if (!prefix.empty()) {
    write_dump(dir, prefix + ".before.ir",
               "# loom graph '" + name.name + "' as cut, fingerprint " + key.fingerprint.hex() +
                   "\n" + ir::to_text(g));
    write_dump(dir, prefix + ".dot", ir::to_dot(g));
  }
  ir::Graph optimized = g;
  {
    profile::Scope pp("compile", "passes");
    passes::Pipeline pipeline = passes::default_pipeline();
    pipeline.set_dump(dir, prefix);
    pipeline.run(optimized);
  }
  if (!prefix.empty())
    write_dump(dir, prefix + ".after.ir",
               "# loom graph '" + name.name + "' after the passes\n" + ir::to_text(optimized));
  std::shared_ptr<const backend::Executable> exe;
  {
    profile::Scope pb("compile", "backend");
    exe = be.compile(optimized, options);
    if (has_collectives(g)) exe = std::make_shared<CollectiveExecutable>(exe, key, g);
  }
  double dt = loom::detail::now_seconds() - t0;
  backend::CodeInfo info = exe->code_info();
  const bool from_disk = info.modules_loaded > 0 && info.modules_compiled == 0;
  if (from_disk) {
    counters.disk_cache_hits++;
    name.disk_hits++;
  } else {
    counters.compiles++;
    name.compiles++;
  }
  loom::detail::add_ns(counters.compile_ns, dt);
  loom::detail::add_ns(name.compile_ns, dt);
  detail::check_recompiling(name);
  if (ps.active())
    ps.set_args("\"fingerprint\": \"" + key.fingerprint.hex() + "\", \"nodes\": " +
                std::to_string(g.size()) + ", \"from_disk\": " + (from_disk ? "true" : "false"));
  if (config().debug) {
    std::fprintf(
        stderr, "[loom] compile %s '%s': %zu nodes (%zu after passes), %zu inputs, %.3f ms, %s%s\n",
        key.fingerprint.hex().c_str(), name.name.c_str(), g.size(), optimized.size(),
        g.params().size(), dt * 1e3, key.backend.c_str(),
        from_disk ? ", code from the disk cache" : "");
  }
  cache().insert(std::move(key), exe, g);
  return exe;
}

std::vector<Buffer> run_executable(const backend::Executable& exe, std::span<const Buffer> inputs,
                                   std::span<const uint8_t> donated) {
  detail::NameStats& name = detail::current_name();
  profile::Scope ps("execute", [&] { return "execute " + name.name; });
  double t0 = loom::detail::now_seconds();
  std::vector<Buffer> out;
  {
    loom::detail::FpModeScope fp;  // denormals flushed or not (loom/core/fp_mode.h)
    out = donated.empty() ? exe.run(inputs) : exe.run(inputs, donated);
  }
  auto& counters = loom::detail::counters();
  counters.executions++;
  double dt = loom::detail::now_seconds() - t0;
  loom::detail::add_ns(counters.execute_ns, dt);
  loom::detail::add_ns(name.execute_ns, dt);
  int64_t in = 0, outb = 0;
  for (const Buffer& b : inputs) in += static_cast<int64_t>(b.nbytes());
  for (const Buffer& b : out) outb += static_cast<int64_t>(b.nbytes());
  name.bytes_in.fetch_add(in, std::memory_order_relaxed);
  name.bytes_out.fetch_add(outb, std::memory_order_relaxed);
  return out;
}

std::vector<Buffer> run_graph(const ir::Graph& g, std::span<const Buffer> inputs) {
  return run_executable(*compile_cached(g), inputs);
}

void prepare_backend() { current_backend(); }

namespace {

// The sync index of one thread: plans by trace key. A hit costs one probe and the weak
// executable's lock; the compile cache keeps ownership, so an eviction there is seen here.
struct SyncIndex {
  struct KeyHash {
    size_t operator()(const Hash128& h) const { return h.lo ^ h.hi; }
  };
  static constexpr size_t kEntries = 4096;
  std::unordered_map<Hash128, SyncPlan, KeyHash> plans;
  SyncPlan unkeyed;  // the plan of a sync that is not indexed (its key is not valid)
};
SyncIndex& sync_index() {
  thread_local SyncIndex index;
  return index;
}

}  // namespace

SyncHit find_sync(const Hash128& key) {
  SyncIndex& index = sync_index();
  auto it = index.plans.find(key);
  if (it == index.plans.end()) return {};
  SyncHit hit;
  hit.exe = it->second.exe.lock();
  if (!hit.exe) return {};  // evicted from the compile cache
  hit.plan = &it->second;
  hit.found = true;
  return hit;
}

std::shared_ptr<const backend::Executable> compile_partitioned(
    const ir::Graph& g, std::shared_ptr<const PartitionInfo>* info) {
  info->reset();
  if (!passes::has_shardings(g)) return compile_cached(g);
  passes::Partitioned p;
  {
    profile::Scope ps("compile", "partition");
    p = passes::partition(g);
  }
  auto made = std::make_shared<PartitionInfo>();
  made->outputs = std::move(p.outputs);
  made->report = passes::describe(p);
  if (config().debug >= 2)
    std::fprintf(stderr, "[loom] partitioned '%s' (mark_sharding):\n%s",
                 detail::current_name().name.c_str(), made->report.c_str());
  *info = std::move(made);
  return compile_cached(p.graph, &g);
}

namespace {
// Whether g, or a region of one of its nodes, calls host code (pure_callback).
bool calls_host(const ir::Graph& g) {
  for (ir::NodeId id = 0; id < g.size(); ++id) {
    const ir::Node& n = g.node(id);
    if (n.op == ir::OpKind::PureCallback) return true;
    for (const auto& r : n.regions)
      if (calls_host(*r)) return true;
  }
  return false;
}
}  // namespace

SyncHit compile_sync(const Hash128* key, const ir::Graph& g, std::vector<uint32_t> slots,
                     std::vector<TensorType> slot_types) {
  SyncHit hit;
  std::shared_ptr<const PartitionInfo> partition;
  hit.exe = compile_partitioned(g, &partition);
  SyncIndex& index = sync_index();
  if (key && index.plans.size() >= SyncIndex::kEntries) index.plans.clear();
  SyncPlan& plan = key ? index.plans[*key] : index.unkeyed;
  plan.exe = hit.exe;
  plan.slots = std::move(slots);
  plan.slot_types = std::move(slot_types);
  plan.partition = std::move(partition);
  plan.nodes = static_cast<int64_t>(g.size());
  plan.calls_host = calls_host(g);
#ifndef NDEBUG
  plan.fingerprint = ir::fingerprint(g);
#endif
  hit.plan = &plan;
  return hit;
}

std::vector<Buffer> run_sync(const SyncHit& hit, std::span<const Buffer> inputs,
                             std::span<const uint8_t> donated) {
  auto& counters = loom::detail::counters();
  if (hit.found) {
    counters.cache_hits++;
    detail::current_name().hits++;
    detail::clear_noted_causes();
  }
  counters.syncs++;
  counters.sync_nodes += hit.plan->nodes;
  std::vector<Buffer> out = run_executable(*hit.exe, inputs, donated);
  int64_t n = 0;
  for (size_t i = 0; i < donated.size(); ++i) {
    if (!donated[i]) continue;
    for (const Buffer& o : out) n += o.id() == inputs[i].id();
  }
  if (n) counters.donated_buffers += n;
  return out;
}

void count_traced(int64_t ops, int64_t host_scalars, double seconds) {
  auto& c = loom::detail::counters();
  if (ops) c.ops_traced += ops;
  if (host_scalars) c.host_scalars += host_scalars;
  if (seconds > 0) loom::detail::add_ns(c.trace_ns, seconds);
}
void count_sync_seconds(double seconds) {
  loom::detail::add_ns(loom::detail::counters().sync_ns, seconds);
}
void count_body_traced() { loom::detail::counters().bodies_traced++; }
void count_pure_hit() { loom::detail::counters().pure_hits++; }
void count_compaction() { loom::detail::counters().pending_compactions++; }

uint64_t cache_generation() { return generation.load(std::memory_order_acquire); }

void clear_compile_cache() {
  cache().clear();
  generation++;
}
int64_t compile_cache_size() { return cache().size(); }
void set_compile_cache_capacity(int64_t entries) { cache().set_capacity(entries); }

void set_cache_dir(const std::string& dir) { backend::DiskCache::instance().set_dir(dir); }
std::string cache_dir() { return backend::DiskCache::instance().dir(); }
void set_cache_dir_max_mb(int64_t mb) {
  LOOM_CHECK(mb >= 1, "[set_cache_dir_max_mb] expected at least 1 MiB, got ", mb);
  backend::DiskCache::instance().set_max_bytes(mb << 20);
}
void set_dump_ir_dir(const std::string& dir) {
  std::lock_guard lock(dump_mu);
  dump_dir() = dir;
}

}  // namespace loom::runtime
