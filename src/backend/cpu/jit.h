// Jit: the one class that hides LLVM's code generation and linking (STYLE.md). The codegen
// builds an llvm::Module; Jit optimizes it (a lean IR pipeline with the loop vectorizer, see
// kIrPipeline in jit.cpp; then fast instruction selection: machine.md measured 2.4 ms against
// 6 ms for full O2 per small kernel, keeping 85-100 % of the speed), generates an object, links it
// with RuntimeDyld into memory of its own and returns the addresses of the named functions. Code
// stays loaded for the life of the process; kernels are cached by structure (kernel_cache.cpp), so
// it grows with distinct kernels, not with steps. llvm::Error becomes loom::CompileError here. No
// ORC session: the kernels need no lazy compilation, initializers or cross-module symbols, and a
// session's set-up (1 ms) and per-object materialization (0.15-0.2 ms) were most of a warm start.
//
// Persistent cache: when backend::DiskCache is on, a module's object code is stored under a
// key that hashes `what` (the canonical descriptions of the module's kernels), a hash of the
// code generator's sources taken at build time (LOOM_CODEGEN_HASH, so a changed generator
// never loads stale code), loom's and LLVM's versions, the host CPU name and features, the
// pipeline settings and the vector width of generated loops. The key needs no IR: a later process
// that asks for the same kernels loads the object without emitting, optimizing or generating
// anything. A kernel's tier-up stores its module's code again under the key of a full-selector
// compile, which later processes load first. Each object is linked on its own, so symbol names only
// need to be unique within a module and a refused object leaves nothing behind. start() creates the
// instance (target machines, about 1 ms) on a background thread, so that a process's first compile,
// often a load from the persistent cache, does not wait for it; that thread then links the cache's
// most recently used objects, which a restarted program is about to ask for, and compile() takes
// them by key. Thread-safe: compile() may run on any number of threads at once; each compile holds
// a target machine of its own (from a pool) and an LLVMContext of its own, and locks are taken only
// around the pool, the preloaded objects and the list of linked memory.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "loom/core/hash.h"

namespace llvm {
class LLVMContext;
class Module;
class DataLayout;
class MemoryBuffer;
}  // namespace llvm

namespace loom::cpu {

// How a module's code is generated. Fast: fast instruction selection and register allocation
// (CodeGenOptLevel::None), the kernels' first code (the IR is optimized first; see above for what
// it costs and keeps; arithmetic-heavy kernels keep less, and tier up: codegen.h, KernelCode).
// Optimized: the full selector and the greedy register allocator (CodeGenOptLevel::Default), for
// native loops: the fast allocator keeps no value in a register from one block to the next, so a
// carry promoted to a register would go through the stack on every trip (4.3 against 1.1 ns a trip
// of a scalar cumsum; the loop's first compile takes about 2 ms more), and for loom's epilogues of
// oneDNN products (epilogue.h: a GELU epilogue ran 1.5x faster).
enum class Codegen { Fast, Optimized };

class Jit {
 public:
  static Jit& instance();
  // Starts building the instance on a background thread (once; later calls do nothing).
  static void start();
  // Starts it if need be and waits until that thread is done, the cache's preload included
  // (whose rejections count in the disk cache's stats: a test reads them after this).
  static void wait_for_start();
  ~Jit();

  // Returns the address of each of `names`, in order: from the persistent cache when it holds
  // the object code for `what` (the canonical text of what the module computes) generated as
  // `codegen` says, else `emit` fills a fresh module configured for the host with the
  // functions, which is then verified, optimized, compiled and linked. *loaded tells which
  // happened.
  // `tier_up`, where given, is filled for a Codegen::Fast module: the optimized module as LLVM
  // bitcode when its code is generated here and want_bitcode (empty when it was loaded), for
  // codegen_optimized, and the persistent-cache key its tiered-up code goes under (the key a
  // Codegen::Optimized compile of `what` has; the cache on). A Fast compile loads that entry
  // first, when the cache holds it: code that a run before this one tiered up (bitcode stays
  // empty: nothing is left to tier up).
  struct TierUpSource {
    bool want_bitcode = true;
    std::string bitcode;
    std::optional<Hash128> key;
  };
  std::vector<void*> compile(std::string_view what, const std::vector<std::string>& names,
                             const std::function<void(llvm::Module&)>& emit, bool* loaded = nullptr,
                             Codegen codegen = Codegen::Fast, TierUpSource* tier_up = nullptr);
  // The functions `names` of a module that compile() generated as Codegen::Fast, generated
  // again from its optimized IR (`bitcode`) as Codegen::Optimized and linked: a kernel's tier-up
  // (codegen.h). Its IR is not optimized again; the object is stored in the persistent cache
  // under `key` when one is given.
  std::vector<void*> codegen_optimized(const std::string& bitcode,
                                       const std::vector<std::string>& names,
                                       const std::optional<Hash128>& key);
  // Modules that compile() loaded from the persistent cache as tiered-up code.
  static int64_t tiered_loads();
  // What the persistent-cache key holds besides the module: versions, CPU, settings.
  const std::string& environment() const;

 private:
  Jit();
  struct Impl;
  struct Lease;
  // compile()'s steps (jit.cpp).
  std::optional<std::vector<void*>> load_object(const Hash128& key,
                                                const std::vector<std::string>& names,
                                                bool count_miss);
  std::optional<std::vector<void*>> load_cached(std::string_view what,
                                                const std::vector<std::string>& names,
                                                Codegen codegen, TierUpSource* tier_up,
                                                Hash128* key);
  std::unique_ptr<llvm::MemoryBuffer> generate(llvm::Module& module, Lease& lease, Codegen codegen,
                                               TierUpSource* tier_up);
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom::cpu
