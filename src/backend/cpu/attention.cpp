// Attention steps: the fused attention (ops.def) and its gradient, run natively as
// FlashAttention-2 schedules them on a GPU: a block of queries against blocks of keys, a
// running max and sum per row (an online softmax), the products on oneDNN's sgemm (float32)
// or OpenBLAS (float64). A task holds one block of scores at a time, never an [L, S] buffer. The
// backward recomputes each block of probabilities from q, k and the saved log-sum-exp.
#include <cblas.h>
#include <dnnl.h>
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "backend/cpu/block_gemm.h"
#include "backend/cpu/one_omp_thread.h"
#include "backend/cpu/program.h"
#include "backend/cpu/thread_pool.h"
#include "loom/core/error.h"

namespace loom::cpu {

namespace {

using ir::OpKind;

// Rows of queries and keys per block: a [128, 1024] float32 block of scores is 512 KiB, half a
// Zen 4 core's L2 (long key blocks: fewer rescales, longer products).
constexpr int64_t kBlockQ = 128, kBlockK = 1024, kBackQ = 128, kBackK = 256;
// Causal: a block of queries reads the keys up to its last row, so shorter blocks skip more of
// the square above the diagonal (at T 256, 56% of it computed with 32 rows against 62.5% with
// 64); from T 512 on, 64 rows, whose products stream the keys half as often.
int64_t forward_rows(bool causal, int64_t L) {
  return !causal ? kBlockQ : L <= 512 ? kBlockQ / 4 : kBlockQ / 2;
}

// Block products C = alpha op(A) B + beta C with B read row by row: float32 on AVX-512
// registers (block_gemm.h), else oneDNN's sgemm (row-major, on the calling thread: split() keeps
// OpenMP at one thread; 16% faster than OpenBLAS's over the step at T 2048); float64 on
// OpenBLAS. A product against a transposed block (q k^T, dout v^T) reads it packed (pack_t).
void mm(bool ta, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
        const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (block_gemm_available()) return block_gemm(ta, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  dnnl_sgemm(ta ? 'T' : 'N', 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void mm(bool ta, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
        const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b,
              static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

// out[e * ldo + j] = rows[j * ld + e] for rows j < n and columns e < width.
template <class T>
void pack_t(int64_t n, int64_t width, const T* rows, int64_t ld, T* out, int64_t ldo) {
  if constexpr (std::is_same_v<T, float>)
    if (block_gemm_available()) return pack_transposed(n, width, rows, ld, out, ldo);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t e = 0; e < width; ++e) out[e * ldo + j] = rows[j * ld + e];
}

// float32 rows run on GCC's vector types: sixteen lanes where the CPU has AVX-512, eight (one
// AVX register, two SSE ones) elsewhere. The helpers passing them are always inlined, so the
// ABI note on wide vectors does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
template <int W>
struct Lanes;
template <>
struct Lanes<8> {
  typedef float f __attribute__((vector_size(32)));
  typedef int32_t i __attribute__((vector_size(32)));
};
template <>
struct Lanes<16> {
  typedef float f __attribute__((vector_size(64)));
  typedef int32_t i __attribute__((vector_size(64)));
};
template <int W>
[[gnu::always_inline]] inline typename Lanes<W>::f load(const float* p) {
  typename Lanes<W>::f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <int W>
[[gnu::always_inline]] inline void store(float* p, typename Lanes<W>::f v) {
  std::memcpy(p, &v, sizeof v);
}

// 2^f for f in [-0.5, 0.5]: a degree-5 minimax polynomial (1.9e-7 relative, exact at 0).
template <class F>
[[gnu::always_inline]] inline F exp2_fraction(F f) {
  F p = F{} + 1.326472731e-3f;
  p = p * f + 9.671512991e-3f;
  p = p * f + 5.550733581e-2f;
  p = p * f + 2.402224243e-1f;
  p = p * f + 6.931470037e-1f;
  return p * f + 1.0f;
}

// float32 scores are kept in base-2 units (the product's alpha carries log2 e), so each
// exponential is an exp2: 2^n times the fraction's polynomial, half the instructions of a
// natural exp. 0 below -126, so 2^-inf = 0; NaN stays NaN.
template <int W>
[[gnu::always_inline]] inline typename Lanes<W>::f vexp2(typename Lanes<W>::f x) {
  using F = typename Lanes<W>::f;
  using I = typename Lanes<W>::i;
  const F lo = F{} - 126.0f, hi = F{} + 127.0f;
  const I zero = x < lo;
  F xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  const F t = xc + 12583039.0f;  // 1.5 * 2^23 + 127: rounds, leaving n + 127 in the low bits
  const F f = xc - (t - 12583039.0f);
  const F p = exp2_fraction<F>(f);
  const F two_n = std::bit_cast<F>(std::bit_cast<I>(t) << 23);
  return std::bit_cast<F>(std::bit_cast<I>(p * two_n) & ~zero);
}

// AVX-512: one vrndscaleps and one vscalefps; the clamp at -150 keeps 2^-inf exactly 0. Not
// always_inline (a target function cannot be forced into the generic templates): the AVX-512
// block functions flatten it. GCC 12's intrinsics trip -Wmaybe-uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
template <>
[[gnu::target("avx512f")]] inline Lanes<16>::f vexp2<16>(Lanes<16>::f x) {
  using F = Lanes<16>::f;
  const __m512 xc = _mm512_min_ps(_mm512_set1_ps(128.0f),
                                  _mm512_max_ps(_mm512_set1_ps(-150.0f), std::bit_cast<__m512>(x)));
  const __m512 n = _mm512_roundscale_ps(xc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const F p = exp2_fraction<F>(std::bit_cast<F>(_mm512_sub_ps(xc, n)));
  return std::bit_cast<F>(_mm512_scalef_ps(std::bit_cast<__m512>(p), n));
}

// The scores' unit: float32 rows in base-2 logarithms (exp2 above), float64 in natural ones.
template <class T>
constexpr T kUnit = std::is_same_v<T, float> ? T(1.44269504088896341) : T(1);
template <class T, int W>
[[gnu::always_inline]] inline T unit_exp(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return vexp2<W>(typename Lanes<W>::f{} + x)[0];
  } else {
    return std::exp(x);
  }
}

// One block of scores s [bq, bk] into probabilities in place, rows carrying their running max
// m and sum l; alpha[r] is what row r's earlier output is rescaled by.
template <class T, int W>
[[gnu::always_inline]] inline void softmax_block_impl(T* s, int64_t bq, int64_t bk, T* m, T* l,
                                                      T* alpha) {
  const T inf = std::numeric_limits<T>::infinity();
  for (int64_t r = 0; r < bq; ++r) {
    T* row = s + r * bk;
    T top = -inf;
    int64_t j = 0;
    if constexpr (std::is_same_v<T, float>) {
      using F = typename Lanes<W>::f;
      F part = F{} - inf;
      for (; j + W <= bk; j += W) {
        const F x = load<W>(row + j);
        part = part < x ? x : part;
      }
      for (int u = 0; u < W; ++u) top = top < part[u] ? part[u] : top;
    }
    for (; j < bk; ++j) top = top < row[j] ? row[j] : top;
    const T next = m[r] < top ? top : m[r];
    if (next == -inf) {  // every key so far masked, or NaN: NaN spreads to the row as in torch
      const bool nan = std::any_of(row, row + bk, [](T x) { return x != x; });
      std::fill(row, row + bk, nan ? std::numeric_limits<T>::quiet_NaN() : T(0));
      if (nan) l[r] = std::numeric_limits<T>::quiet_NaN();
      alpha[r] = 1;
      continue;
    }
    alpha[r] = unit_exp<T, W>(m[r] - next);
    T total = 0;
    j = 0;
    if constexpr (std::is_same_v<T, float>) {
      using F = typename Lanes<W>::f;
      F sums = F{};
      for (; j + W <= bk; j += W) {
        const F p = vexp2<W>(load<W>(row + j) - next);
        store<W>(row + j, p);
        sums += p;
      }
      for (int u = 0; u < W; ++u) total += sums[u];
    }
    for (; j < bk; ++j) total += (row[j] = unit_exp<T, W>(row[j] - next));
    l[r] = l[r] * alpha[r] + total;
    m[r] = next;
  }
}

// Scores s [bq, bk] into the forward's probabilities exp(s - lse) (0 for a fully masked row);
// lse in natural units.
template <class T, int W>
[[gnu::always_inline]] inline void probs_block_impl(T* s, int64_t bq, int64_t bk, const T* lse) {
  for (int64_t r = 0; r < bq; ++r) {
    T* row = s + r * bk;
    const T l = lse[r] * kUnit<T>;
    if (l == -std::numeric_limits<T>::infinity()) {
      std::fill(row, row + bk, T(0));
      continue;
    }
    int64_t j = 0;
    if constexpr (std::is_same_v<T, float>)
      for (; j + W <= bk; j += W) store<W>(row + j, vexp2<W>(load<W>(row + j) - l));
    for (; j < bk; ++j) row[j] = unit_exp<T, W>(row[j] - l);
  }
}

// dp [bq, bk] into the scores' gradient times scale: p * (dp - delta) * scale.
template <class T, int W>
[[gnu::always_inline]] inline void dscores_block_impl(const T* p, T* dp, int64_t bq, int64_t bk,
                                                      const T* delta, T scale) {
  for (int64_t r = 0; r < bq; ++r) {
    const T d = delta[r];
    const T* pr = p + r * bk;
    T* g = dp + r * bk;
    int64_t j = 0;
    if constexpr (std::is_same_v<T, float>)
      for (; j + W <= bk; j += W) store<W>(g + j, load<W>(pr + j) * (load<W>(g + j) - d) * scale);
    for (; j < bk; ++j) g[j] = pr[j] * (g[j] - d) * scale;
  }
}

template <class T>
struct BlockFns {
  void (*softmax)(T*, int64_t, int64_t, T*, T*, T*);
  void (*probs)(T*, int64_t, int64_t, const T*);
  void (*dscores)(const T*, T*, int64_t, int64_t, const T*, T);
};

// The block functions three times: sixteen lanes for AVX-512, eight for AVX2 with FMA, eight
// for the baseline; one pointer table per CPU.
#define LOOM_ATTENTION_BLOCK_FNS(suffix, W, ...)                                               \
  template <class T>                                                                           \
  __VA_ARGS__ void softmax_##suffix(T* s, int64_t bq, int64_t bk, T* m, T* l, T* a) {          \
    softmax_block_impl<T, W>(s, bq, bk, m, l, a);                                              \
  }                                                                                            \
  template <class T>                                                                           \
  __VA_ARGS__ void probs_##suffix(T* s, int64_t bq, int64_t bk, const T* lse) {                \
    probs_block_impl<T, W>(s, bq, bk, lse);                                                    \
  }                                                                                            \
  template <class T>                                                                           \
  __VA_ARGS__ void dscores_##suffix(const T* p, T* dp, int64_t bq, int64_t bk, const T* delta, \
                                    T scale) {                                                 \
    dscores_block_impl<T, W>(p, dp, bq, bk, delta, scale);                                     \
  }
LOOM_ATTENTION_BLOCK_FNS(avx512, 16,
                         [[gnu::target("avx512f,avx512dq,avx512vl,avx512bw,fma"), gnu::flatten]])
LOOM_ATTENTION_BLOCK_FNS(avx2, 8, [[gnu::target("avx2,fma")]])
LOOM_ATTENTION_BLOCK_FNS(base, 8)
#undef LOOM_ATTENTION_BLOCK_FNS

template <class T>
const BlockFns<T>& block_fns() {
  static const BlockFns<T> fns = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw"))
      return BlockFns<T>{softmax_avx512<T>, probs_avx512<T>, dscores_avx512<T>};
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
      return BlockFns<T>{softmax_avx2<T>, probs_avx2<T>, dscores_avx2<T>};
    return BlockFns<T>{softmax_base<T>, probs_base<T>, dscores_base<T>};
  }();
  return fns;
}

// Per batch (the dims of `shape` before the last two, row-major) its element offset under
// `strides`.
std::vector<int64_t> batch_offsets(const Shape& shape, const std::vector<int64_t>& strides) {
  const size_t r = shape.size() < 2 ? 0 : shape.size() - 2;
  int64_t batches = 1;
  for (size_t d = 0; d < r; ++d) batches *= shape[d];
  std::vector<int64_t> at(static_cast<size_t>(batches), 0);
  for (int64_t b = 0; b < batches; ++b) {
    int64_t rest = b, off = 0;
    for (size_t d = r; d-- > 0;) {
      off += (rest % shape[d]) * strides[d];
      rest /= shape[d];
    }
    at[static_cast<size_t>(b)] = off;
  }
  return at;
}

// Where view v of the step's buffers starts.
template <class T>
T* view_data(void* const* ptr, const Program& prog, const BlasView& v) {
  return static_cast<T*>(ptr[prog.plan.buf_of[v.base]]) + v.offset;
}

// An operand or result as blocks of rows: row i of batch b at p + at[b] + i * ld, the batches
// being the dims before the last two. The step reads and writes layouts of other buffers in
// place (Step::views, Step::out_views: the heads of a [B, T, 3C] projection, say).
template <class T>
struct Rows {
  T* p = nullptr;
  int64_t ld = 0;
  std::vector<int64_t> at;
  Rows(void* const* ptr, const Program& prog, const BlasView& v, const Shape& shape)
      : p(view_data<T>(ptr, prog, v)),
        ld(shape.size() >= 2 ? v.strides[shape.size() - 2] : 0),
        at(batch_offsets(shape, v.strides)) {}
  T* row(int64_t b, int64_t i) const { return p + at[static_cast<size_t>(b)] + i * ld; }
};

// One attention node's shapes and buffers. Batches run over q's dims before the last two
// (heads last); k and v's batch is q's with its head divided by the group.
template <class T>
struct Attn {
  int64_t batches = 1, heads = 1, group = 1, L = 0, S = 0, E = 0, Ev = 0;
  T scale = 1;
  bool causal = false;
  Rows<const T> q, k, v;
  const void* mask = nullptr;
  bool bool_mask = false;
  int64_t mask_row = 0, mask_col = 0;  // strides of the mask over i and j (0: broadcast)
  std::vector<int64_t> mask_base;      // per batch

  Attn(const Program& p, const Step& st, void* const* ptr, size_t mask_at)
      : q(operand(p, st, ptr, 0)), k(operand(p, st, ptr, 1)), v(operand(p, st, ptr, 2)) {
    const ir::Graph& g = p.graph;
    const ir::Node& n = g.node(st.node);
    const Shape& qs = g.type(n.operands[0]).shape;
    const size_t r = qs.size();
    for (size_t d = 0; d + 2 < r; ++d) batches *= qs[d];
    heads = r >= 3 ? qs[r - 3] : 1;
    group = n.attrs.i;
    L = qs[r - 2];
    E = qs[r - 1];
    S = g.type(n.operands[1]).shape[r - 2];
    Ev = g.type(n.operands[2]).shape[r - 1];
    scale = static_cast<T>(n.attrs.f);
    causal = n.attrs.flag;
    if (n.operands.size() <= mask_at) return;
    mask = ptr[p.plan.buf_of[n.operands[mask_at].node]];
    const TensorType& mt = g.type(n.operands[mask_at]);
    bool_mask = mt.dtype == DType::Bool;
    // The mask's strides over the scores' dims [..., L, S], right-aligned, 0 where broadcast.
    const size_t mr = mt.shape.size();
    std::vector<int64_t> strides(r, 0);
    int64_t step = 1;
    for (size_t d = 0; d < mr; ++d) {
      const size_t md = mr - 1 - d, sd = r - 1 - d;
      const int64_t want = sd == r - 1 ? S : qs[sd];
      strides[sd] = mt.shape[md] == want && want != 1 ? step : 0;
      step *= mt.shape[md];
    }
    mask_row = strides[r - 2];
    mask_col = strides[r - 1];
    mask_base = batch_offsets(qs, strides);
  }
  static Rows<const T> operand(const Program& p, const Step& st, void* const* ptr, size_t k) {
    return Rows<const T>(ptr, p, st.views[k],
                         p.graph.type(p.graph.node(st.node).operands[k]).shape);
  }
  int64_t kv_batch(int64_t b) const { return (b / heads) * (heads / group) + (b % heads) / group; }

  // Scores s [bq, bk] of rows i0.. and keys j0.. of batch b, in kUnit, the mask applied.
  void mask_block(int64_t b, int64_t i0, int64_t bq, int64_t j0, int64_t bk, T* s) const {
    const T inf = std::numeric_limits<T>::infinity();
    if (causal && j0 + bk - 1 > i0) {
      for (int64_t r = 0; r < bq; ++r)
        for (int64_t j = std::max<int64_t>(0, i0 + r + 1 - j0); j < bk; ++j) s[r * bk + j] = -inf;
    }
    if (!mask) return;
    const int64_t base = mask_base[static_cast<size_t>(b)];
    for (int64_t r = 0; r < bq; ++r) {
      const int64_t row = base + (i0 + r) * mask_row + j0 * mask_col;
      T* sr = s + r * bk;
      if (bool_mask) {
        const auto* m = static_cast<const uint8_t*>(mask) + row;
        for (int64_t j = 0; j < bk; ++j)
          if (!m[j * mask_col]) sr[j] = -inf;
      } else {
        const T* m = static_cast<const T*>(mask) + row;
        for (int64_t j = 0; j < bk; ++j) sr[j] += m[j * mask_col] * kUnit<T>;
      }
    }
  }
};

// Runs items [lo, hi) of n, each on this thread; splits them over the pool when `tasks` is 0.
template <class F>
void split(int64_t items, int64_t t, int64_t tasks, const F& f0) {
  auto f = [&](int64_t lo, int64_t hi) {
    OneOmpThread one;  // the caller's setting comes back: torch reads it as its thread count
    f0(lo, hi);
  };
  if (tasks == 0) {
    const int64_t n = std::min<int64_t>(items, ThreadPool::instance().size());
    if (n <= 1) return f(0, items);
    ThreadPool::instance().run(static_cast<int>(n),
                               [&](int i) { f(items * i / n, items * (i + 1) / n); });
    return;
  }
  f(items * t / tasks, items * (t + 1) / tasks);
}

// Result k of the step, where out_views[k] says it goes.
template <class T>
Rows<T> result(const Program& p, const Step& st, void* const* ptr, size_t k) {
  const ir::Node& n = p.graph.node(st.node);
  return Rows<T>(ptr, p, st.out_views[k], k == 0 ? n.type.shape : n.more_types[k - 1].shape);
}

template <class T>
void forward(const Program& p, const Step& st, void* const* ptr, int64_t t, int64_t tasks) {
  const Attn<T> a(p, st, ptr, 3);
  const Rows<T> out = result<T>(p, st, ptr, 0);
  T* lse = view_data<T>(ptr, p, st.out_views[1]);
  const BlockFns<T>& fns = block_fns<T>();
  const int64_t rows = forward_rows(a.causal, a.L), blocks = (a.L + rows - 1) / rows;
  const T inf = std::numeric_limits<T>::infinity();
  split(a.batches * blocks, t, tasks, [&](int64_t lo, int64_t hi) {
    std::vector<T> s(kBlockQ * kBlockK), acc(kBlockQ * a.Ev), m(kBlockQ), l(kBlockQ),
        alpha(kBlockQ), kt(a.E * a.S);
    int64_t packed = -1;  // the k/v batch whose keys kt holds, transposed
    for (int64_t item = lo; item < hi; ++item) {
      const int64_t b = item / blocks, i0 = (item % blocks) * rows;
      const int64_t bq = std::min(rows, a.L - i0), kb = a.kv_batch(b);
      const T* q = a.q.row(b, i0);
      const T* v = a.v.row(kb, 0);
      if (kb != packed) pack_t(a.S, a.E, a.k.row(kb, 0), a.k.ld, kt.data(), a.S);
      packed = kb;
      std::fill(m.begin(), m.end(), -inf);
      std::fill(l.begin(), l.end(), T(0));
      std::fill(acc.begin(), acc.end(), T(0));
      const int64_t keys = a.causal ? std::min(a.S, i0 + bq) : a.S;
      for (int64_t j0 = 0; j0 < keys; j0 += kBlockK) {
        const int64_t bk = std::min(kBlockK, keys - j0);
        mm(false, bq, bk, a.E, a.scale * kUnit<T>, q, a.q.ld, kt.data() + j0, a.S, T(0), s.data(),
           bk);
        a.mask_block(b, i0, bq, j0, bk, s.data());
        fns.softmax(s.data(), bq, bk, m.data(), l.data(), alpha.data());
        for (int64_t r = 0; r < bq; ++r)
          if (alpha[r] != T(1))
            for (int64_t e = 0; e < a.Ev; ++e) acc[r * a.Ev + e] *= alpha[r];
        mm(false, bq, a.Ev, bk, T(1), s.data(), bk, v + j0 * a.v.ld, a.v.ld, T(1), acc.data(),
           a.Ev);
      }
      for (int64_t r = 0; r < bq; ++r) {
        T* o = out.row(b, i0 + r);
        const bool none = l[r] == T(0);  // every key masked: zeros, as torch >= 2.5
        for (int64_t e = 0; e < a.Ev; ++e) o[e] = none ? T(0) : acc[r * a.Ev + e] / l[r];
        lse[b * a.L + i0 + r] = none ? -inf : m[r] / kUnit<T> + std::log(l[r]);
      }
    }
  });
}

template <class T>
void backward(const Program& p, const Step& st, void* const* ptr, int64_t t, int64_t tasks) {
  const Attn<T> a(p, st, ptr, 6);
  const T* lse = view_data<const T>(ptr, p, st.views[3]);
  const T* delta = view_data<const T>(ptr, p, st.views[4]);
  const Rows<const T> dout = Attn<T>::operand(p, st, ptr, 5);
  const Rows<T> dq = result<T>(p, st, ptr, 0), dk = result<T>(p, st, ptr, 1),
                dv = result<T>(p, st, ptr, 2);
  const BlockFns<T>& fns = block_fns<T>();
  const int64_t kv_heads = a.heads / a.group, kv_batches = a.batches / a.group;
  // A task owns whole k/v batches: their dk and dv, and the dq of the q heads that read them.
  // Causal: key blocks of 128, so the blocks above the diagonal are skipped at that grain
  // (a fourth of the work at T 256, where 256-key blocks computed the whole square), and a
  // block on the diagonal runs as four strips of 32 rows, each against the keys up to its end.
  const int64_t back_k = a.causal ? kBackK / 2 : kBackK;
  split(kv_batches, t, tasks, [&](int64_t lo, int64_t hi) {
    std::vector<T> s(kBackQ * back_k), dp(kBackQ * back_k), dk_acc(back_k * a.E),
        dv_acc(back_k * a.Ev), kt(a.E * back_k), vt(a.Ev * back_k);
    for (int64_t kb = lo; kb < hi; ++kb) {
      const int64_t b0 = (kb / kv_heads) * a.heads + (kb % kv_heads) * a.group;
      for (int64_t b = b0; b < b0 + a.group; ++b)
        for (int64_t i = 0; i < a.L; ++i) std::fill_n(dq.row(b, i), a.E, T(0));
      const T* k = a.k.row(kb, 0);
      const T* v = a.v.row(kb, 0);
      // Rows i0.. (bq) of batch b against keys j0.. (bk; kt and vt hold them transposed from
      // j0 on): the five products of a block.
      auto block = [&](int64_t b, int64_t i0, int64_t bq, int64_t j0, int64_t bk) {
        const T* q = a.q.row(b, i0);
        const T* g = dout.row(b, i0);
        const int64_t row = b * a.L + i0;
        mm(false, bq, bk, a.E, a.scale * kUnit<T>, q, a.q.ld, kt.data(), back_k, T(0), s.data(),
           bk);
        a.mask_block(b, i0, bq, j0, bk, s.data());
        fns.probs(s.data(), bq, bk, lse + row);
        mm(true, bk, a.Ev, bq, T(1), s.data(), bk, g, dout.ld, T(1), dv_acc.data(), a.Ev);
        mm(false, bq, bk, a.Ev, T(1), g, dout.ld, vt.data(), back_k, T(0), dp.data(), bk);
        fns.dscores(s.data(), dp.data(), bq, bk, delta + row, a.scale);
        mm(false, bq, a.E, bk, T(1), dp.data(), bk, k + j0 * a.k.ld, a.k.ld, T(1), dq.row(b, i0),
           dq.ld);
        mm(true, bk, a.E, bq, T(1), dp.data(), bk, q, a.q.ld, T(1), dk_acc.data(), a.E);
      };
      for (int64_t j0 = 0; j0 < a.S; j0 += back_k) {
        const int64_t bk = std::min(back_k, a.S - j0);
        std::fill(dk_acc.begin(), dk_acc.end(), T(0));
        std::fill(dv_acc.begin(), dv_acc.end(), T(0));
        pack_t(bk, a.E, k + j0 * a.k.ld, a.k.ld, kt.data(), back_k);
        pack_t(bk, a.Ev, v + j0 * a.v.ld, a.v.ld, vt.data(), back_k);
        for (int64_t h = 0; h < a.group; ++h) {
          const int64_t b = b0 + h;
          for (int64_t i0 = a.causal ? j0 : 0; i0 < a.L; i0 += kBackQ) {
            const int64_t bq = std::min(kBackQ, a.L - i0);
            if (a.causal && i0 < j0 + bk - 1) {
              for (int64_t r = 0; r < bq; r += kBackQ / 4) {
                const int64_t h = std::min(kBackQ / 4, bq - r);
                block(b, i0 + r, h, j0, std::min(bk, i0 + r + h - j0));
              }
            } else {
              block(b, i0, bq, j0, bk);
            }
          }
        }
        for (int64_t j = 0; j < bk; ++j) {
          std::copy_n(dk_acc.data() + j * a.E, a.E, dk.row(kb, j0 + j));
          std::copy_n(dv_acc.data() + j * a.Ev, a.Ev, dv.row(kb, j0 + j));
        }
      }
    }
  });
}

int64_t items(const Program& p, const Step& st) {
  const ir::Node& n = p.graph.node(st.node);
  const Shape& qs = p.graph.type(n.operands[0]).shape;
  int64_t batches = 1;
  for (size_t d = 0; d + 2 < qs.size(); ++d) batches *= qs[d];
  if (n.op == OpKind::AttentionGrad) return batches / n.attrs.i;
  const int64_t rows = forward_rows(n.attrs.flag, qs[qs.size() - 2]);
  return batches * ((qs[qs.size() - 2] + rows - 1) / rows);
}

}  // namespace

int64_t attention_tasks(const Program& p, const Step& st) {
  return std::max<int64_t>(1, std::min<int64_t>(items(p, st), 2 * ThreadPool::instance().size()));
}

void run_attention(const Program& p, const Step& st, void* const* ptr, int64_t t, int64_t tasks) {
  const ir::Node& n = p.graph.node(st.node);
  const bool f64 = n.type.dtype == DType::Float64;
  LOOM_ASSERT(f64 || n.type.dtype == DType::Float32);
  if (n.op == OpKind::Attention) {
    return f64 ? forward<double>(p, st, ptr, t, tasks) : forward<float>(p, st, ptr, t, tasks);
  }
  LOOM_ASSERT(n.op == OpKind::AttentionGrad);
  f64 ? backward<double>(p, st, ptr, t, tasks) : backward<float>(p, st, ptr, t, tasks);
}

}  // namespace loom::cpu
