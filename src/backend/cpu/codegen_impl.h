// Private pieces of the code generator shared between its files.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/codegen.h"
#include "backend/cpu/jit.h"

namespace llvm {
class Function;
class IRBuilderBase;
class MDNode;
class Metadata;
class Module;
class Value;
}  // namespace llvm

namespace loom::cpu {

// A fast module that can tier up: its optimized IR, the kernels it defines and their run time.
struct TierUp {
  std::atomic<int64_t> ran_ns{0};
  std::string bitcode;
  std::optional<Hash128> key;      // where its tiered-up code goes in the persistent cache
  std::vector<std::string> names;  // the functions to take from it, in order of `codes`
  std::vector<KernelCode*> codes;
  std::atomic<bool> requested{false};
};

}  // namespace loom::cpu

namespace loom::cpu::detail {

struct KernelDescription {
  std::string text;       // canonical: equal texts mean interchangeable kernels
  std::vector<int> bufs;  // plan buffer ids by local argument index
};
KernelDescription describe(const ir::Graph& g, const Plan& p, const KernelSpec& k);
// describe() of every kernel of the plan, printing each distinct text once.
std::vector<KernelDescription> describe_all(const ir::Graph& g, const Plan& p);

// Native loops (native_loop.cpp). emit_inlined_kernel adds kernel k of p to m as an internal,
// always-inlined function `name`. cached_function returns the kernel cache's function for
// `text` (a canonical description), or compiles it: `emit` defines the function "k0", whose
// code is generated as `codegen` says (jit.h: Optimized keeps a native loop's carries in
// registers). Also loom's epilogues of oneDNN products (epilogue.h).
void emit_inlined_kernel(llvm::Module& m, const ir::Graph& g, const Plan& p, const KernelSpec& k,
                         const KernelDescription& d, const std::string& name);
// A counted loop over [lo, hi) at b's insert point in fn: body(iv) emits its body, and b is
// left in the loop's exit block. `group`, where non-null, is the access group of the loop's
// loads and stores, declared parallel (llvm.loop.parallel_accesses: no alias checks for the
// vectorizer), with the loop properties `extra` beside it.
void emit_counted_loop(llvm::IRBuilderBase& b, llvm::Function* fn, llvm::Value* lo, llvm::Value* hi,
                       llvm::MDNode* group, std::span<llvm::Metadata* const> extra,
                       const std::function<void(llvm::Value*)>& body);
// The same with values carried from trip to trip: PHIs in the loop's head that start at init;
// body(iv, carried) returns their values for the next trip.
using CarriedLoopBody = std::function<std::vector<llvm::Value*>(
    llvm::Value* iv, std::span<llvm::Value* const> carried)>;
void emit_counted_loop(llvm::IRBuilderBase& b, llvm::Function* fn, llvm::Value* lo, llvm::Value* hi,
                       llvm::MDNode* group, std::span<llvm::Metadata* const> extra,
                       std::span<llvm::Value* const> init, const CarriedLoopBody& body);

// Emits kernels[j] of p (descriptions descs[kernels[j]]) into m as functions names[j], the
// kernel cache's fast modules (kernel_cache.cpp).
void emit_kernels(llvm::Module& m, const ir::Graph& g, const Plan& p,
                  const std::vector<KernelDescription>& descs, const std::vector<size_t>& kernels,
                  const std::vector<std::string>& names);

// Tier-up (tier_up.cpp): whether a new fast module may still keep its optimized IR (a bound on
// the IR kept in all), and the record of one that did: its kernels start counting run time.
bool may_keep_bitcode();
void keep_for_tier_up(std::unique_ptr<TierUp> t, Jit::TierUpSource&& source);

KernelFn cached_function(const std::string& text, const std::function<void(llvm::Module&)>& emit,
                         Codegen codegen = Codegen::Optimized);

}  // namespace loom::cpu::detail
