// Diagnostics: graph names, why a graph compiled again, and metrics per graph name.
//
//   { loom::GraphName name("train_step"); step(); loom::sync(); }   // or: the sync's call site
//   for (const auto& r : loom::recompile_reasons()) std::cerr << r.graph << ": " << r.message;
//   for (const auto& g : loom::graph_metrics()) ...;   // also in loom::metrics_report()
//
// Every sync (and every value read that runs a graph) has a *graph name*: the innermost
// GraphName on the thread, else the call site of sync()/item()/to_vector() ("train.cpp:42").
// When a name compiles again (a compile-cache miss for a name that compiled before), loom
// finds the closest earlier graph of that name and says what differs: an input whose shape
// or dtype changed (by tree path, "args[0]['x']", for a compile() step or assume_pure), a static
// argument of an assume_pure function whose value changed, or the first differing op as IR text.
// LOOM_EXPLAIN_RECOMPILES=1 prints each explanation to stderr. metrics_report() summarizes them and
// warns about a name that compiles more than once per two syncs after ten syncs. Also here: the
// persistent compile cache and IR dump settings. Thread-safety: GraphName is per thread; the rest
// may be called from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

// Names the graphs that syncs on this thread run while it lives (nests; the innermost wins).
class GraphName {
 public:
  explicit GraphName(std::string_view name);
  ~GraphName();
  GraphName(const GraphName&) = delete;
  GraphName& operator=(const GraphName&) = delete;

 private:
  void* previous_;
};

struct RecompileReason {
  enum class Kind {
    InputType,       // an input changed shape or dtype: `input`, `before`, `after`
    StaticArgument,  // a static argument of an assume_pure function changed value
    Graph,           // the op structure differs: `before`/`after` are the first differing ops
    Evicted,         // the same graph compiled before and left the compile cache (LRU
                     // eviction, clear_compile_cache, or another backend)
  };
  std::string graph;    // the graph name
  int64_t compile = 0;  // this compile's number for the name (2: the first recompile)
  Kind kind = Kind::Graph;
  std::string message;  // one line: "input 0 changed shape: f32[8,512] -> f32[16,512]"
  int64_t input =
      -1;  // InputType: the first graph input that changed (Graph: the first differing one)
  std::string path;  // InputType of a compiled step or assume_pure function: the tree path
                     // of the first argument leaf that changed ("args[0]['x']")
  std::string before, after;
};
const char* to_string(RecompileReason::Kind kind);

// Every explanation since the last reset_metrics() (at most the latest 1000).
std::vector<RecompileReason> recompile_reasons();

struct GraphMetrics {
  std::string name;
  int64_t syncs = 0;       // graphs run under this name (compiles + cache_hits + disk_hits)
  int64_t compiles = 0;    // compile-cache misses that generated code
  int64_t cache_hits = 0;  // found compiled in memory
  int64_t disk_hits = 0;   // compile-cache misses whose code all came from the disk cache
  double compile_seconds = 0, execute_seconds = 0;
  int64_t bytes_in = 0, bytes_out = 0;  // input and output bytes of every run
  bool recompiling = false;             // more than one compile per two syncs after ten syncs
};
// One entry per graph name seen since the last reset_metrics(), sorted by name.
std::vector<GraphMetrics> graph_metrics();

// Turns printing of explanations to stderr on or off (default: LOOM_EXPLAIN_RECOMPILES).
void set_explain_recompiles(bool on);

namespace runtime {

// The persistent compile cache (backend/disk_cache.h): compiled code kept in `dir` so that a
// new process loads it instead of compiling. "" turns it off; the default is LOOM_CACHE_DIR.
// An unusable directory never fails a compile (see metrics: disk_cache_write_failures).
void set_cache_dir(const std::string& dir);
std::string cache_dir();
// Bounds the directory to `mb` MiB (LRU by use); the default is LOOM_CACHE_DIR_MB or 1024.
void set_cache_dir_max_mb(int64_t mb);

// Where each compiled graph's IR is written: <dir>/<counter>-<fingerprint>.before.ir (the
// graph as cut), .NN_<pass>.ir (after each pass), .after.ir (what the backend compiles) and
// .dot (Graphviz, of the graph before the passes). "" turns it off; default LOOM_DUMP_IR.
void set_dump_ir_dir(const std::string& dir);

}  // namespace runtime

}  // namespace loom
