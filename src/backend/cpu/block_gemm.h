// Products of attention's blocks (tens to hundreds of rows against a head of 64) on AVX-512
// registers: a library's sgemm spends a call's fixed cost and its packing on blocks this small
// (in the GPT bench's T 256 layer dnnl_sgemm ran them at ~75 GFLOP/s a core).
#pragma once

#include <cstdint>

namespace loom::cpu {

// Whether block_gemm runs on this CPU (AVX-512F) and is enabled.
bool block_gemm_available();
// For tests: false runs attention's float32 products on oneDNN's sgemm, as on CPUs without
// AVX-512 (a plan's steps read it at run time).
void enable_block_gemm(bool on);

// C[m, n] = alpha * op(A) B + beta * C, beta 0 or 1, all row-major: op(A) is A [m, k] (lda),
// or with a_trans A^T of A stored [k, m]; B is [k, n] (ldb). Precondition:
// block_gemm_available().
void block_gemm(bool a_trans, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// out[e * ldo + j] = rows[j * ld + e] for j < n, e < width: a block of rows packed transposed
// (the keys of q k^T), 16 x 16 tiles in registers. Precondition: block_gemm_available().
void pack_transposed(int64_t n, int64_t width, const float* rows, int64_t ld, float* out,
                     int64_t ldo);

}  // namespace loom::cpu
