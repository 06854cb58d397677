// Block products on AVX-512: tiles of 6 rows by 64 columns held in 24 registers; each step of
// k loads one row of B (four vectors, the last masked) and broadcasts 6 elements of A.
#include "backend/cpu/block_gemm.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <utility>

// GCC 12 takes the unpack intrinsics' own undefined pass-through operand for a read.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace loom::cpu {

namespace {

constexpr int kRows = 6, kVectors = 4;

template <int R, int V, bool TA>
[[gnu::target("avx512f")]] void tile(int64_t k, float alpha, const float* a, int64_t lda,
                                     const float* b, int64_t ldb, bool beta, float* c, int64_t ldc,
                                     __mmask16 last) {
  __m512 acc[R][V];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t p = 0; p < k; ++p) {
    __m512 bv[V];
    const float* br = b + p * ldb;
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v)
      bv[v] = v == V - 1 ? _mm512_maskz_loadu_ps(last, br + 16 * v) : _mm512_loadu_ps(br + 16 * v);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(TA ? a[p * lda + r] : a[r * lda + p]);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
  const __m512 al = _mm512_set1_ps(alpha);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      float* cp = c + r * ldc + 16 * v;
      const __mmask16 m = v == V - 1 ? last : __mmask16(0xFFFF);
      __m512 x = _mm512_mul_ps(acc[r][v], al);
      if (beta) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(m, cp));
      _mm512_mask_storeu_ps(cp, m, x);
    }
}

using Tile = void (*)(int64_t, float, const float*, int64_t, const float*, int64_t, bool, float*,
                      int64_t, __mmask16);

template <bool TA, int R, int... V>
constexpr std::array<Tile, kVectors> row_of(std::integer_sequence<int, V...>) {
  return {tile<R, V + 1, TA>...};
}
template <bool TA, int... R>
constexpr std::array<std::array<Tile, kVectors>, kRows> table_of(std::integer_sequence<int, R...>) {
  return {row_of<TA, R + 1>(std::make_integer_sequence<int, kVectors>())...};
}
// kTiles<TA>[rows - 1][vectors - 1]: the tile for a strip of that many rows and vectors
template <bool TA>
constexpr auto kTiles = table_of<TA>(std::make_integer_sequence<int, kRows>());

// dst[i * ldo + j] = src[j * ld + i] for a 16 x 16 tile: two rounds of unpacks and two of
// 128-bit lane shuffles in registers.
[[gnu::target("avx512f")]] void transpose16(const float* src, int64_t ld, float* dst, int64_t ldo) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * ld);
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j) {
      t[8 * i + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + j + 4], 0x88);
      t[8 * i + j + 4] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + j + 4], 0xdd);
    }
  for (int j = 0; j < 8; ++j) {
    _mm512_storeu_ps(dst + j * ldo, _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88));
    _mm512_storeu_ps(dst + (j + 8) * ldo, _mm512_shuffle_f32x4(t[j], t[j + 8], 0xdd));
  }
}

}  // namespace

namespace {
std::atomic<bool> g_enabled{true};
}  // namespace

bool block_gemm_available() {
  static const bool cpu = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
  }();
  return cpu && g_enabled.load(std::memory_order_relaxed);
}
void enable_block_gemm(bool on) { g_enabled.store(on); }

void block_gemm(bool a_trans, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const auto& tiles = a_trans ? kTiles<true> : kTiles<false>;
  // Column panels of 64 outermost: a panel of B (k rows) stays in cache across the strips.
  for (int64_t j0 = 0; j0 < n; j0 += 16 * kVectors) {
    const int64_t w = std::min<int64_t>(16 * kVectors, n - j0);
    const int vectors = static_cast<int>((w + 15) / 16);
    const __mmask16 last = w % 16 ? static_cast<__mmask16>((1u << (w % 16)) - 1) : 0xFFFF;
    for (int64_t i0 = 0; i0 < m; i0 += kRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kRows, m - i0));
      const float* ap = a_trans ? a + i0 : a + i0 * lda;
      tiles[rows - 1][vectors - 1](k, alpha, ap, lda, b + j0, ldb, beta != 0, c + i0 * ldc + j0,
                                   ldc, last);
    }
  }
}

void pack_transposed(int64_t n, int64_t width, const float* rows, int64_t ld, float* out,
                     int64_t ldo) {
  const int64_t n16 = n / 16 * 16, w16 = width / 16 * 16;
  for (int64_t j = 0; j < n16; j += 16)
    for (int64_t e = 0; e < w16; e += 16)
      transpose16(rows + j * ld + e, ld, out + e * ldo + j, ldo);
  for (int64_t e = 0; e < width; ++e)  // the edges: columns past w16, rows past n16
    for (int64_t j = e < w16 ? n16 : 0; j < n; ++j) out[e * ldo + j] = rows[j * ld + e];
}

}  // namespace loom::cpu
