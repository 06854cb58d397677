// A product's post-ops as generated code: loom's epilogue, which a oneDNN product task runs on
// its block of C right after the primitive wrote it (onednn.cpp), where oneDNN's own post-op
// is slower or refused. The post-ops are computed as loom's elementwise kernels compute the ops
// they stand for (math.h's erf for GELU, tanh, exp), so the result matches the unfused plan.
#pragma once

#include <cstdint>
#include <span>

#include "backend/cpu/codegen.h"
#include "backend/cpu/plan.h"

namespace loom::cpu {

// The function for `post` applied to a float32 block, its binary operands' column strides
// `col_strides` (one per binary post-op, in order; 0 and 1 are compiled in, any other is read
// at run time). Called as fn(bufs, begin, end) for rows [begin, end) with
//   bufs[0]: C (float*), the block's first element,
//   bufs[1]: const int64_t* {cols, ldc, then each binary operand's row and column strides},
//   bufs[2 + j]: binary operand j (const float*), at the block's first element.
// Compiled once per distinct description and cached with the kernels (codegen.h).
KernelFn epilogue_function(std::span<const PostOp> post, std::span<const int64_t> col_strides);

// Compiles one such epilogue with the full instruction selector, outside the kernel cache:
// LLVM builds some tables of its code generator on first use, and the tier-up thread must be
// made after them (tier_up.cpp, TierUpWorker).
void build_code_generator_tables();

}  // namespace loom::cpu
