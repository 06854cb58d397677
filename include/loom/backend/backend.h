// Backend and Executable: the interface between the runtime and code generators.
//
// Backend::compile turns a verified Graph into an Executable; Executable::run takes one
// Buffer per graph parameter (in parameter order, each holding a contiguous row-major array
// of the parameter's type) and returns one freshly allocated Buffer per graph output.
// Executables are immutable after compile and may be run from several threads at once.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "loom/core/buffer.h"
#include "loom/ir/graph.h"

namespace loom::backend {

struct CompileOptions {
  int opt_level = 2;
  // Hash of everything in the options that changes generated code (part of the cache key).
  uint64_t hash() const { return static_cast<uint64_t>(opt_level); }
};

// How a compile got its machine code: LLVM modules generated now, and modules loaded from the
// persistent cache (backend/disk_cache.h). The runtime counts a compile whose code all came
// from disk as a disk-cache hit.
struct CodeInfo {
  int64_t modules_compiled = 0, modules_loaded = 0;
};

class Executable {
 public:
  virtual ~Executable() = default;
  // Throws ExecError when the inputs do not match the graph's parameters.
  virtual std::vector<Buffer> run(std::span<const Buffer> inputs) const = 0;
  // As run, where donated[i] != 0 marks an input whose memory the caller gives up: the
  // executable may return it as an output's buffer, possibly overwritten. Default: no reuse.
  virtual std::vector<Buffer> run(std::span<const Buffer> inputs,
                                  std::span<const uint8_t> donated) const {
    return run(inputs);
  }
  // Number of loop kernels (fused loops, fallbacks) and of library calls (matrix products)
  // one run executes: tests of fusion check them.
  virtual int64_t num_kernels() const { return 0; }
  virtual int64_t num_library_calls() const { return 0; }
  virtual CodeInfo code_info() const { return {}; }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  virtual std::shared_ptr<const Executable> compile(const ir::Graph& g,
                                                    const CompileOptions& options) const = 0;
};

// Checks that `inputs` match the parameters of `g` (count and byte sizes); throws ExecError
// naming `who`.
void check_inputs(const char* who, const ir::Graph& g, std::span<const Buffer> inputs);

}  // namespace loom::backend
