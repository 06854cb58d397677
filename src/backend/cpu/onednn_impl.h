// What onednn.cpp and onednn_parts.cpp share (the only files that see oneDNN's headers).
// Thread-safety: a Part is immutable once cached_part returns it; cached_part is thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <dnnl.hpp>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/codegen.h"
#include "backend/cpu/one_omp_thread.h"
#include "backend/cpu/onednn.h"
#include "backend/cpu/plan.h"

namespace loom::cpu::dnn {

using dims = dnnl::memory::dims;
using md = dnnl::memory::desc;

inline dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// One part's primitive: a [rows, k] x [k, cols] product with its post-ops.
struct Part {
  dnnl::matmul prim;
  md a, b, c;
  std::vector<md> bin;         // per binary post-op, in post-op order
  std::vector<int> bin_index;  // post-op position of each binary operand
  // The first post-op adds a row vector (a Linear's bias): with the post-ops fused it is the
  // primitive's bias argument (the product's first binary operand; `bin` holds the others).
  bool bias = false;
  md bias_md;
  size_t scratch = 0;
  md scratch_md;
  std::string impl;   // oneDNN's implementation ("gemm:jit", "brg:avx512_core", "ref:any")
  bool fused = true;  // false: loom's epilogue applies the post-ops after the product
  // The post-ops that oneDNN does not apply (all but a bias in the primitive) as generated
  // code (epilogue.h), run by the task on its block; set when !fused. `chosen`: because loom's
  // code is faster for them (GELU), not because oneDNN refused them.
  KernelFn epilogue = nullptr;
  bool chosen = false;
  // A is read transposed, which 2.6's brgemm refuses: each task copies its block of A into a
  // dense scratch first and the primitive reads that (`a` is then the dense layout).
  bool dense_a = false;
  // C is a block of columns of a wider output (ldc > cols), which 2.6's brgemm refuses: the
  // primitive writes a dense scratch (`c` is then dense) that the task copies into place.
  bool dense_c = false;
  uint64_t id = 0;  // unique in the process: the key of each thread's argument tables
  // Leading post-ops that only scale (a linear without offset, a product with a scalar
  // operand) applied to A's dense copy instead (dense_a): `fold` of them, the first
  // `folded_bins` binary operands among them, times a_scale for the linears'.
  size_t fold = 0, folded_bins = 0;
  float a_scale = 1;
  // The last post-op adds an operand laid out as C (an SGD update, w - lr * dW): this part
  // with that add as oneDNN's sum post-op, run when the output lies in the operand's memory
  // (a donated weight). Null when oneDNN has no fused kernel for it.
  std::shared_ptr<const Part> in_place;
};

// A matrix operand of the product: element strides of its rows and columns and of each batch
// dim of the output (0: broadcast).
struct Operand {
  int buf = -1;
  int64_t offset = 0;
  int64_t sr = 0, sc = 0;
  std::vector<int64_t> batch;
  bool bcast_rows = false, bcast_cols = false;  // binary operands
};

struct Task {
  int part = 0;
  int64_t rows = 0, cols = 0;
  int64_t a = 0, b = 0, c = 0;  // element offsets into their buffers
  std::vector<int64_t> bin;
};

// The part computing a [rows, k] x [k, cols] block of C (leading dimension ldc) with the
// product's post-ops and their binary operands, shared process-wide (onednn_parts.cpp).
std::shared_ptr<const Part> cached_part(int64_t rows, int64_t cols, int64_t k, const Operand& a,
                                        const Operand& b, int64_t ldc,
                                        const std::vector<PostOp>& post,
                                        const std::vector<Operand>& bin);

}  // namespace loom::cpu::dnn

namespace loom::cpu {

// A product's parts and its tasks over them (make_onednn_product); immutable once made.
struct OnednnProduct {
  std::vector<std::shared_ptr<const dnn::Part>> parts;
  std::vector<dnn::Task> tasks;
  dnn::Operand a, b;
  int c_buf = -1;
  int64_t ldc = 0;
  std::vector<dnn::Operand> bin;
  std::vector<PostOp> post;
  std::string name;
  int64_t k = 0;
};

}  // namespace loom::cpu
