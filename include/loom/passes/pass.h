// Graph-to-graph passes and the pipeline that runs them.
//
//   ir::Graph g = ir::parse(text);
//   passes::Pipeline p = passes::default_pipeline();  // inline, simplify, cse, dce
//   bool changed = p.run(g);
//
// A pass rewrites a verified graph in place, keeps its parameters and the meaning and order
// of its outputs, leaves multi-result nodes (control flow) alone, and returns whether it
// changed anything. Pipeline::run verifies the graph before the first pass and after each
// pass, and, when LOOM_DUMP_IR names a directory (or set_dump another), writes the IR into it
// as NN_<pass>.ir (00_input.ir holding the graph before the first pass), numbered across the
// process, or as <prefix>.NN_<pass>.ir when set_dump gives a prefix (the runtime names each
// compiled graph's files by a counter and its fingerprint). Passes and pipelines hold no shared
// state: one per thread, or one pipeline shared under external locking.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "loom/ir/graph.h"

namespace loom::passes {

class Pass {
 public:
  virtual ~Pass() = default;
  virtual std::string_view name() const = 0;
  // Rewrites g in place; returns true when it changed the graph.
  virtual bool run(ir::Graph& g) = 0;
};

class Pipeline {
 public:
  Pipeline() = default;
  Pipeline(Pipeline&&) noexcept = default;
  Pipeline& operator=(Pipeline&&) noexcept = default;

  Pipeline& add(std::unique_ptr<Pass> pass);
  // Where run() writes the IR after each pass ("" dir: nowhere); the default is LOOM_DUMP_IR
  // with no prefix.
  Pipeline& set_dump(std::string dir, std::string prefix = {});
  // Runs the passes in order; returns true when any of them changed the graph. Throws Error
  // naming the pass after which the graph no longer verifies.
  bool run(ir::Graph& g);
  size_t size() const { return passes_.size(); }

 private:
  std::vector<std::unique_ptr<Pass>> passes_;
  std::string dump_dir_ = config_dump_dir();
  std::string dump_prefix_;
  static std::string config_dump_dir();
};

// "dce": drops nodes no output needs (parameters stay).
// "cse": merges identical nodes.
// "simplify": algebraic identities and constant folding of scalar constants.
// "inline": replaces call nodes (assume_pure) by their bodies, so kernels fuse across them.
// Throws Error for any other name.
std::unique_ptr<Pass> make_pass(std::string_view name);

// inline, simplify, cse, dce: the pipeline the runtime runs before compiling.
Pipeline default_pipeline();

}  // namespace loom::passes
