// Private pieces of the code generator shared between its files.
#pragma once

#include <functional>
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

KernelFn cached_function(const std::string& text, const std::function<void(llvm::Module&)>& emit,
                         Codegen codegen = Codegen::Optimized);

}  // namespace loom::cpu::detail
