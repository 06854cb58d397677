// The engine: runs a graph through the compile cache and the selected backend.
//
// run_graph fingerprints the graph, looks up {fingerprint, input signature, backend and
// options, format version} in a bounded LRU cache, compiles on a miss (default pass pipeline,
// then the backend), and runs the executable. The cache takes a reader/writer lock, so
// several threads may run graphs at once.
#pragma once

#include <memory>
#include <source_location>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "loom/backend/backend.h"
#include "loom/core/buffer.h"
#include "loom/ir/graph.h"
#include "loom/runtime/diagnostics.h"

namespace loom::runtime {

// Format version of compiled artifacts and cache keys; bump when the IR's meaning changes.
inline constexpr int kFormatVersion = 1;

struct CacheKey {
  Hash128 fingerprint;
  uint64_t signature = 0;      // hash of the parameter types
  std::string backend;         // backend name
  uint64_t options = 0;        // CompileOptions::hash()
  int format = kFormatVersion;
  friend bool operator==(const CacheKey&, const CacheKey&) = default;
};

// The backend selected by LOOM_BACKEND (or the default), created once.
const backend::Backend& current_backend();
// Replaces the backend used by later run_graph calls ("ref"); throws Error on unknown names.
void set_backend(std::string_view name);

// Compiles (cached) and runs `g` on `inputs`; returns one Buffer per output.
std::vector<Buffer> run_graph(const ir::Graph& g, std::span<const Buffer> inputs);
// The cached executable for `g` (compiling it on a miss), without running it.
std::shared_ptr<const backend::Executable> compile_cached(const ir::Graph& g);

// Runs an executable that compile_cached returned, counting it in the metrics.
std::vector<Buffer> run_executable(const backend::Executable& exe, std::span<const Buffer> inputs,
                                   std::span<const uint8_t> donated = {});
// Counts a cache hit found by a caller's own index into this cache (the tracer's).
void count_cache_hit();
// Changes whenever cached executables may no longer be valid for a graph (the cache was
// cleared or the backend replaced); callers that index executables include it in their keys.
uint64_t cache_generation();

// Drops every compiled executable.
void clear_compile_cache();
int64_t compile_cache_size();
// Bounds the cache to `entries` graphs (LRU); the default comes from LOOM_CACHE_SIZE.
void set_compile_cache_capacity(int64_t entries);

// Names the graph a sync runs by its call site, unless a GraphName is active: the trace room
// creates one in sync(), item(), to_vector() and printing; nested sites keep the outermost.
// Also records the sync's profile spans (the trace span before it, the sync itself).
class SyncSite {
 public:
  explicit SyncSite(const std::source_location& loc);
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

}  // namespace loom::runtime
