// Jit: the one class that hides LLVM's ORC (STYLE.md). The codegen builds an llvm::Module;
// Jit optimizes it (IR-level O2, then fast instruction selection: machine.md measured
// 2.4 ms against 6 ms for full O2 per small kernel, keeping 85-100 % of the speed), links it
// into one process-wide LLJIT and returns the addresses of the named functions. Code stays
// loaded for the life of the process; kernels are cached by structure (kernel_cache.h), so
// it grows with distinct kernels, not with steps. llvm::Error becomes loom::CompileError here.
//
// Persistent cache: when backend::DiskCache is on, a module's object code is stored under a
// key that hashes `what` (the canonical descriptions of the module's kernels), a structural
// hash of the module's IR (before optimization), loom's and LLVM's versions, the host CPU
// name and features and the pipeline settings; a later process that builds the
// same module loads the object instead of optimizing and generating code. Each module (built
// or loaded) is linked into its own JITDylib, so symbol names only need to be unique within
// a module and a refused object leaves nothing behind.
// Thread-safe: compile() takes a lock around code generation and linking.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace llvm {
class LLVMContext;
class Module;
class DataLayout;
}  // namespace llvm

namespace loom::cpu {

class Jit {
 public:
  static Jit& instance();
  ~Jit();

  // A fresh module configured for the host (data layout and triple).
  std::unique_ptr<llvm::Module> new_module(llvm::LLVMContext& ctx, const std::string& name);
  // Optimizes and links `module` (or loads its object code from the persistent cache);
  // returns the address of each of `names`, in order. `what` describes what the module
  // computes (part of the persistent key); *loaded tells which happened.
  std::vector<void*> compile(std::unique_ptr<llvm::LLVMContext> ctx,
                             std::unique_ptr<llvm::Module> module,
                             const std::vector<std::string>& names, std::string_view what = {},
                             bool* loaded = nullptr);
  // What the persistent-cache key holds besides the module: versions, CPU, settings.
  const std::string& environment() const;

 private:
  Jit();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom::cpu
