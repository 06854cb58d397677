// The engine: runs a graph through the compile cache and the selected backend.
//
// run_graph fingerprints the graph, looks up {fingerprint, input signature, backend and
// options, format version} in a bounded LRU cache, compiles on a miss (default pass pipeline,
// then the backend), and runs the executable. The cache takes a reader/writer lock, so
// several threads may run graphs at once. compile_cached, run_executable and the sync path
// the trace room uses are in loom/runtime/sync.h (included here).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "loom/backend/backend.h"
#include "loom/core/buffer.h"
#include "loom/ir/graph.h"
#include "loom/runtime/diagnostics.h"
#include "loom/runtime/sync.h"

namespace loom::runtime {

// Format version of compiled artifacts and cache keys; bump when the IR's meaning changes.
inline constexpr int kFormatVersion = 1;

struct CacheKey {
  Hash128 fingerprint;
  uint64_t signature = 0;  // hash of the parameter types
  std::string backend;     // backend name
  uint64_t options = 0;    // CompileOptions::hash()
  int format = kFormatVersion;
  friend bool operator==(const CacheKey&, const CacheKey&) = default;
};

// The backend selected by LOOM_BACKEND (or the default), created once.
const backend::Backend& current_backend();
// Replaces the backend used by later run_graph calls ("ref"); throws Error on unknown names.
void set_backend(std::string_view name);

// Compiles (cached) and runs `g` on `inputs`; returns one Buffer per output.
std::vector<Buffer> run_graph(const ir::Graph& g, std::span<const Buffer> inputs);
// Drops every compiled executable.
void clear_compile_cache();
int64_t compile_cache_size();
// Bounds the cache to `entries` graphs (LRU); the default comes from LOOM_CACHE_SIZE.
void set_compile_cache_capacity(int64_t entries);

}  // namespace loom::runtime
