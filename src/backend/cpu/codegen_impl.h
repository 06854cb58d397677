// Private pieces of the code generator shared between its files.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "backend/cpu/codegen.h"
#include "backend/cpu/jit.h"

namespace llvm {
class Module;
}

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
KernelFn cached_function(const std::string& text, const std::function<void(llvm::Module&)>& emit,
                         Codegen codegen = Codegen::Optimized);

}  // namespace loom::cpu::detail
