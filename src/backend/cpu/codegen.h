// Code generation of the plan's kernels (LLVM IR through IRBuilder, compiled by Jit).
//
// A kernel is `void k(void* const* bufs, int64_t begin, int64_t end)`: it runs outer points
// [begin, end) of its KernelSpec, reading and writing the buffers bufs[0..] in the order of
// CompiledKernel::bufs. Kernels are cached process-wide by a canonical description of their
// structure, so identical fused kernels compile once and are shared across graphs.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cpu/plan.h"

namespace loom::cpu {

using KernelFn = void (*)(void* const* bufs, int64_t begin, int64_t end);

struct CompiledKernel {
  KernelFn fn = nullptr;
  std::vector<int> bufs;  // plan buffer ids, in the kernel's argument order
  int64_t outer = 0;      // number of outer points
  int64_t work = 0;       // elements touched per outer point (to decide on threading)
  int out_arg = -1;       // the argument that KernelSpec::out_shift moves, and by how much
  int64_t out_shift_bytes = 0;
};

// Compiles (or finds in the process-wide cache) every kernel of `plan`, in one LLVM module.
std::vector<CompiledKernel> compile_kernels(const ir::Graph& g, const Plan& plan);

// Kernels compiled and cache hits since process start (for tests and benchmarks).
struct KernelCacheStats {
  int64_t compiled = 0, hits = 0;
};
KernelCacheStats kernel_cache_stats();

}  // namespace loom::cpu
