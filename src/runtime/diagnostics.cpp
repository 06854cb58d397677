// Graph names, per-name metrics, and recompile explanations (closest earlier graph, then
// what differs: an input type, a noted assume_pure cause, or the first differing op).
#include <algorithm>
#include <cstdio>
#include <map>
#include <unordered_map>

#include "loom/core/config.h"
#include "loom/core/error.h"
#include "loom/core/profile.h"
#include "loom/runtime/engine.h"
#include "runtime/names_impl.h"

namespace loom {

namespace runtime::detail {

namespace {

constexpr size_t kHistory = 8;     // graphs kept per name to explain its next compile
constexpr size_t kReasons = 1000;  // explanations kept for recompile_reasons()

struct Registry {
  std::mutex mu;
  std::map<std::string, std::unique_ptr<NameStats>> names;  // sorted: reports are stable
  std::deque<RecompileReason> reasons;
  std::atomic<int64_t> recompiles{0};
  std::atomic<bool> explain{config().explain_recompiles};
};

Registry& registry() {
  static Registry r;
  return r;
}

NameStats* intern(const std::string& name) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  auto& slot = r.names[name];
  if (!slot) {
    slot = std::make_unique<NameStats>();
    slot->name = name;
  }
  return slot.get();
}

struct SiteKey {
  const char* file;
  uint32_t line;
  bool operator==(const SiteKey& o) const { return file == o.file && line == o.line; }
};
struct SiteKeyHash {
  size_t operator()(const SiteKey& k) const {
    return std::hash<const void*>()(k.file) ^ (size_t{k.line} * 0x9e3779b97f4a7c15ULL);
  }
};

struct LabelHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
};

struct Note {
  RecompileReason::Kind kind;
  std::string message, before, after, path;
};

// Per thread: the innermost GraphName, the current sync site, the site cache, noted causes.
struct ThreadNames {
  NameStats* explicit_name = nullptr;
  NameStats* site = nullptr;
  int site_depth = 0;
  std::unordered_map<SiteKey, NameStats*, SiteKeyHash> sites;
  std::unordered_map<std::string, NameStats*, LabelHash, std::equal_to<>> labels;
  std::vector<Note> notes;
  double last_sync_end_us = -1;
};
ThreadNames& thread_names() {
  thread_local ThreadNames t;
  return t;
}

// The name `label` (GraphName, a SyncSite label), interned once per thread: a compiled step
// names two graphs on every call.
NameStats* label_name(std::string_view label) {
  ThreadNames& t = thread_names();
  auto it = t.labels.find(label);
  if (it != t.labels.end()) return it->second;
  NameStats* n = intern(std::string(label));
  t.labels.emplace(std::string(label), n);
  return n;
}

NameStats* site_name(const CallSite& loc) {
  ThreadNames& t = thread_names();
  SiteKey key{loc.file, loc.line};
  auto it = t.sites.find(key);
  if (it != t.sites.end()) return it->second;
  NameStats* n = intern(loom::detail::file_line(loc));
  t.sites.emplace(key, n);
  return n;
}

GraphRecord make_record(const ir::Graph& g, const Hash128& fingerprint) {
  GraphRecord r;
  r.fingerprint = fingerprint;
  r.graph = std::make_shared<const ir::Graph>(g);
  for (ir::NodeId p : g.params()) r.params.push_back(g.node(p).type);
  for (const ir::Node& n : g.nodes()) r.ops[static_cast<size_t>(n.op)]++;
  return r;
}

// Distance between two graphs: op-count differences weigh most, then inputs.
int64_t distance(const GraphRecord& a, const GraphRecord& b) {
  int64_t d = 0;
  for (int k = 0; k < ir::kNumOps; ++k) d += 4 * std::abs(a.ops[k] - b.ops[k]);
  if (a.params.size() != b.params.size()) {
    d += 16 * static_cast<int64_t>(std::max(a.params.size(), b.params.size()) -
                                   std::min(a.params.size(), b.params.size()));
  } else {
    for (size_t k = 0; k < a.params.size(); ++k) d += !(a.params[k] == b.params[k]);
  }
  return d;
}

RecompileReason explain(const GraphRecord& before, const GraphRecord& now,
                        std::vector<Note> notes) {
  RecompileReason r;
  if (before.fingerprint == now.fingerprint) {
    r.kind = RecompileReason::Kind::Evicted;
    r.message =
        "the same graph compiled before and left the compile cache (LRU eviction, "
        "clear_compile_cache, or another backend)";
    return r;
  }
  if (!notes.empty()) {  // assume_pure said why it re-traced: the most precise cause
    r.kind = notes.front().kind;
    r.before = notes.front().before;
    r.after = notes.front().after;
    r.path = notes.front().path;
    for (size_t k = 0; k < notes.size(); ++k) r.message += (k ? "; " : "") + notes[k].message;
    return r;
  }
  bool same_ops = before.ops == now.ops;
  if (before.params.size() == now.params.size()) {
    std::vector<std::string> changes;
    for (size_t k = 0; k < now.params.size(); ++k) {
      if (before.params[k] == now.params[k]) continue;
      if (r.input < 0) {
        r.input = static_cast<int64_t>(k);
        r.before = before.params[k].str();
        r.after = now.params[k].str();
      }
      if (changes.size() < 4)
        changes.push_back(
            loom::detail::str_cat("input ", k, " ", type_change(before.params[k], now.params[k])));
    }
    if (!changes.empty()) {
      r.kind = RecompileReason::Kind::InputType;
      for (size_t k = 0; k < changes.size(); ++k) r.message += (k ? "; " : "") + changes[k];
      if (!same_ops) {
        r.message +=
            "; the ops differ too, first: " + ir::first_difference(*before.graph, *now.graph).str();
      }
      return r;
    }
  }
  r.kind = RecompileReason::Kind::Graph;
  ir::GraphDifference diff = ir::first_difference(*before.graph, *now.graph);
  r.before = diff.before;
  r.after = diff.after;
  r.message = "the graph changed";
  if (before.params.size() != now.params.size())
    r.message +=
        loom::detail::str_cat(" (", before.params.size(), " inputs -> ", now.params.size(), ")");
  switch (diff.kind) {
    case ir::GraphDifference::Kind::None: r.message += ": same text, different structure"; break;
    case ir::GraphDifference::Kind::Parameter:
      r.input = diff.index;
      r.message += loom::detail::str_cat(": first differing input ", diff.index, " ", diff.str());
      break;
    case ir::GraphDifference::Kind::Node:
      if (diff.before.find("shard(") != std::string::npos ||
          diff.after.find("shard(") != std::string::npos)
        r.message = "a sharding changed (mark_sharding)";
      r.message += ": first differing op " + diff.str();
      break;
    case ir::GraphDifference::Kind::Outputs:
      r.message += ": first differing outputs " + diff.str();
      break;
  }
  return r;
}

}  // namespace

NameStats& current_name() {
  ThreadNames& t = thread_names();
  if (t.explicit_name) return *t.explicit_name;
  if (t.site) return *t.site;
  static NameStats* unnamed = intern("(unnamed)");
  return *unnamed;
}

void clear_noted_causes() {
  ThreadNames& t = thread_names();
  if (!t.notes.empty()) t.notes.clear();
}

void explain_and_remember(NameStats& name, const ir::Graph& g, const Hash128& fingerprint) {
  GraphRecord now = make_record(g, fingerprint);
  std::vector<Note> notes;
  notes.swap(thread_names().notes);
  std::unique_lock lock(name.mu);
  int64_t number = ++name.compile_number;
  if (!name.history.empty()) {
    const GraphRecord* best = nullptr;
    int64_t best_d = 0;
    for (auto it = name.history.rbegin(); it != name.history.rend(); ++it) {
      int64_t d = it->fingerprint == now.fingerprint ? -1 : distance(*it, now);
      if (!best || d < best_d) best = &*it, best_d = d;
    }
    RecompileReason r = explain(*best, now, std::move(notes));
    r.graph = name.name;
    r.compile = number;
    Registry& reg = registry();
    reg.recompiles++;
    if (reg.explain.load(std::memory_order_relaxed))
      std::fprintf(stderr, "[loom] recompiling '%s' (compile %lld): %s\n", r.graph.c_str(),
                   static_cast<long long>(number), r.message.c_str());
    std::lock_guard rl(reg.mu);
    reg.reasons.push_back(std::move(r));
    if (reg.reasons.size() > kReasons) reg.reasons.pop_front();
  }
  name.history.push_back(std::move(now));
  if (name.history.size() > kHistory) name.history.pop_front();
}

bool is_recompiling(const NameStats& n) {
  int64_t misses = n.compiles + n.disk_hits, syncs = misses + n.hits;
  return syncs >= 10 && 2 * misses > syncs;
}

void check_recompiling(NameStats& name) {
  if (!registry().explain.load(std::memory_order_relaxed) && !config().debug) return;
  if (!is_recompiling(name) || name.warned.exchange(true)) return;
  std::fprintf(stderr,
               "[loom] warning: graph '%s' compiled %lld times in %lld syncs; see "
               "loom::recompile_reasons() or LOOM_EXPLAIN_RECOMPILES=1\n",
               name.name.c_str(), static_cast<long long>(name.compiles + name.disk_hits),
               static_cast<long long>(name.compiles + name.disk_hits + name.hits));
}

void reset_names() {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  for (auto& [_, n] : r.names)
    for (auto* a : {&n->compiles, &n->hits, &n->disk_hits, &n->compile_ns, &n->execute_ns,
                    &n->bytes_in, &n->bytes_out})
      a->store(0);
  r.reasons.clear();
  r.recompiles = 0;
}

int64_t recompile_count() { return registry().recompiles.load(); }

std::string names_report() {
  std::vector<GraphMetrics> gs = graph_metrics();
  if (gs.empty()) return "";
  std::string out =
      "  per graph name                 syncs compiles disk_hits    hits  compile_s  execute_s"
      "      MB_in     MB_out\n";
  char buf[512];
  for (const GraphMetrics& g : gs) {
    std::snprintf(
        buf, sizeof buf, "    %-28s %7lld %8lld %9lld %7lld %10.4f %10.4f %10.2f %10.2f\n",
        g.name.c_str(), static_cast<long long>(g.syncs), static_cast<long long>(g.compiles),
        static_cast<long long>(g.disk_hits), static_cast<long long>(g.cache_hits),
        g.compile_seconds, g.execute_seconds, g.bytes_in / 1048576.0, g.bytes_out / 1048576.0);
    out += buf;
  }
  std::vector<RecompileReason> rs = recompile_reasons();
  if (!rs.empty()) {
    std::map<std::string, std::map<std::string, int64_t>> by_name;
    for (const auto& r : rs) by_name[r.graph][to_string(r.kind)]++;
    out += "  recompiles (" + std::to_string(rs.size()) + "), latest per name:\n";
    for (const auto& [name, kinds] : by_name) {
      out += "    " + name + ":";
      for (const auto& [k, c] : kinds) out += " " + std::to_string(c) + " " + k;
      for (auto it = rs.rbegin(); it != rs.rend(); ++it)
        if (it->graph == name) {
          out += "; latest: " + it->message.substr(0, 300);
          break;
        }
      out += "\n";
    }
  }
  for (const GraphMetrics& g : gs)
    if (g.recompiling)
      out += "  WARNING: graph '" + g.name + "' compiled " +
             std::to_string(g.compiles + g.disk_hits) + " times in " + std::to_string(g.syncs) +
             " syncs (more than once per 2 syncs): see the recompiles above\n";
  return out;
}

}  // namespace runtime::detail

// ---- public API ---------------------------------------------------------------------------

GraphName::GraphName(std::string_view name) {
  LOOM_CHECK(!name.empty(), "[GraphName] expected a non-empty graph name");
  auto& t = runtime::detail::thread_names();
  previous_ = t.explicit_name;
  t.explicit_name = runtime::detail::label_name(name);
}

GraphName::~GraphName() {
  runtime::detail::thread_names().explicit_name =
      static_cast<runtime::detail::NameStats*>(previous_);
}

const char* to_string(RecompileReason::Kind kind) {
  switch (kind) {
    case RecompileReason::Kind::InputType: return "input type";
    case RecompileReason::Kind::StaticArgument: return "static argument";
    case RecompileReason::Kind::Graph: return "graph";
    case RecompileReason::Kind::Evicted: return "evicted";
  }
  return "?";
}

std::vector<RecompileReason> recompile_reasons() {
  auto& r = runtime::detail::registry();
  std::lock_guard lock(r.mu);
  return {r.reasons.begin(), r.reasons.end()};
}

std::vector<GraphMetrics> graph_metrics() {
  auto& r = runtime::detail::registry();
  std::vector<GraphMetrics> out;
  std::lock_guard lock(r.mu);
  for (const auto& [name, n] : r.names) {
    GraphMetrics g;
    g.name = name;
    g.compiles = n->compiles;
    g.cache_hits = n->hits;
    g.disk_hits = n->disk_hits;
    g.syncs = g.compiles + g.cache_hits + g.disk_hits;
    if (g.syncs == 0) continue;
    g.compile_seconds = n->compile_ns * 1e-9;
    g.execute_seconds = n->execute_ns * 1e-9;
    g.bytes_in = n->bytes_in;
    g.bytes_out = n->bytes_out;
    g.recompiling = runtime::detail::is_recompiling(*n);
    out.push_back(std::move(g));
  }
  return out;
}

void set_explain_recompiles(bool on) { runtime::detail::registry().explain = on; }

namespace runtime {

// The outermost site names the graph: a read inside printing (operator<<) keeps "print".
SyncSite::SyncSite(const CallSite& loc) : SyncSite(static_cast<void*>(nullptr)) {
  auto& t = detail::thread_names();
  if (t.site_depth == 1) t.site = detail::site_name(loc);
}

SyncSite::SyncSite(std::string_view label) : SyncSite(static_cast<void*>(nullptr)) {
  auto& t = detail::thread_names();
  if (t.site_depth == 1) t.site = detail::label_name(label);
}

SyncSite::SyncSite(void*) {
  auto& t = detail::thread_names();
  previous_ = t.site;
  if (t.site_depth++ == 0 && profile::enabled()) [[unlikely]]
    start_us_ = profile::now_us();
}

SyncSite::~SyncSite() {
  auto& t = detail::thread_names();
  if (start_us_ >= 0) [[unlikely]] {
    // The trace span: from the end of this thread's previous sync to the start of this one.
    const std::string& name = detail::current_name().name;
    if (t.last_sync_end_us >= 0)
      profile::record("trace", "trace " + name, t.last_sync_end_us, start_us_);
    double end = profile::now_us();
    profile::record("sync", "sync " + name, start_us_, end);
    t.last_sync_end_us = end;
  }
  --t.site_depth;
  t.site = static_cast<detail::NameStats*>(previous_);
}

const std::string& current_graph_name() { return detail::current_name().name; }

void note_recompile_cause(RecompileReason::Kind kind, std::string message, std::string before,
                          std::string after, std::string path) {
  auto& notes = detail::thread_names().notes;
  if (notes.size() < 16)
    notes.push_back(
        {kind, std::move(message), std::move(before), std::move(after), std::move(path)});
}

}  // namespace runtime

}  // namespace loom
