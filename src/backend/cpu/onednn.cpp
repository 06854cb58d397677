// Products on oneDNN's matmul primitive (onednn.h): operands, tasks and running them; each
// part's primitive is built in onednn_parts.cpp.
#include "backend/cpu/onednn.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/cpu/onednn_impl.h"
#include "backend/cpu/thread_pool.h"
#include "loom/core/error.h"
#include "loom/core/profile.h"

namespace loom::cpu {

using dnn::cached_part;
using dnn::engine;
using dnn::md;
using dnn::Operand;
using dnn::Part;
using dnn::Task;

namespace {

// A's or B's matrix layout from its BLAS view, batch strides aligned to the output's batch dims.
Operand matrix_operand(const ir::Graph& g, const Plan& plan, ir::NodeId operand, const BlasView& v,
                       size_t br) {
  const Shape& s = g.node(operand).type.shape;
  const size_t r = s.size();
  Operand o;
  o.buf = plan.buf_of[v.base];
  o.offset = v.offset;
  o.sr = v.trans ? 1 : v.ld;
  o.sc = v.trans ? v.ld : 1;
  o.batch.assign(br, 0);
  for (size_t d = 0; d + 2 < r; ++d) o.batch[br - (r - 2) + d] = s[d] == 1 ? 0 : v.strides[d];
  return o;
}

// A binary post-op's operand, broadcast to the output's shape `os`.
Operand binary_operand(const ir::Graph& g, const Plan& plan, const PostOp& po, const Shape& os) {
  const Shape& s = g.node(po.operand).type.shape;
  const size_t r = os.size(), ry = s.size();
  Operand o;
  o.buf = plan.buf_of[po.view.base];
  o.offset = po.view.offset;
  std::vector<int64_t> st(r, 0);
  for (size_t d = 0; d < r; ++d) {
    if (d + ry < r) continue;
    const size_t dy = d + ry - r;
    st[d] = s[dy] == 1 ? 0 : po.view.strides[dy];
  }
  o.bcast_rows = ry < 2 || s[ry - 2] == 1;
  o.bcast_cols = ry < 1 || s[ry - 1] == 1;
  o.sr = st[r - 2];
  o.sc = st[r - 1];
  o.batch.assign(st.begin(), st.end() - 2);
  return o;
}

// dense[i * k + j] = src[i + j * sc] for i < rows, j < k: a block of A read transposed, copied
// dense, 16 x 16 blocks transposed in AVX-512 registers: full-line stores where a plain loop stored
// floats a line apart (docs/architecture.md, "Measurements": transpose_blocks16).
// GCC 12 warns that the intrinsics' own _mm512_undefined_ps() "may be used uninitialized".
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f"))) void transpose_blocks16(float* dense, const float* src,
                                                           int64_t rows, int64_t k, int64_t sc,
                                                           float scale) {
  const __m512 f = _mm512_set1_ps(scale);
  for (int64_t jb = 0; jb + 16 <= k; jb += 16) {
    for (int64_t ib = 0; ib + 16 <= rows; ib += 16) {
      __m512 r[16], t[16];
      for (int q = 0; q < 16; ++q) r[q] = _mm512_loadu_ps(src + ib + (jb + q) * sc);
      // Pairs of rows interleaved, then pairs of pairs, then 128-bit lanes twice: row q of
      // the block transposed ends in r[q].
      for (int q = 0; q < 8; ++q) {
        t[2 * q] = _mm512_unpacklo_ps(r[2 * q], r[2 * q + 1]);
        t[2 * q + 1] = _mm512_unpackhi_ps(r[2 * q], r[2 * q + 1]);
      }
      for (int q = 0; q < 4; ++q) {
        r[4 * q] = _mm512_castpd_ps(
            _mm512_unpacklo_pd(_mm512_castps_pd(t[4 * q]), _mm512_castps_pd(t[4 * q + 2])));
        r[4 * q + 1] = _mm512_castpd_ps(
            _mm512_unpackhi_pd(_mm512_castps_pd(t[4 * q]), _mm512_castps_pd(t[4 * q + 2])));
        r[4 * q + 2] = _mm512_castpd_ps(
            _mm512_unpacklo_pd(_mm512_castps_pd(t[4 * q + 1]), _mm512_castps_pd(t[4 * q + 3])));
        r[4 * q + 3] = _mm512_castpd_ps(
            _mm512_unpackhi_pd(_mm512_castps_pd(t[4 * q + 1]), _mm512_castps_pd(t[4 * q + 3])));
      }
      for (int q = 0; q < 2; ++q) {
        for (int p = 0; p < 4; ++p) {
          t[8 * q + p] = _mm512_shuffle_f32x4(r[8 * q + p], r[8 * q + 4 + p], 0x88);
          t[8 * q + 4 + p] = _mm512_shuffle_f32x4(r[8 * q + p], r[8 * q + 4 + p], 0xdd);
        }
      }
      for (int p = 0; p < 8; ++p) {
        r[p] = _mm512_shuffle_f32x4(t[p], t[8 + p], 0x88);
        r[8 + p] = _mm512_shuffle_f32x4(t[p], t[8 + p], 0xdd);
      }
      for (int q = 0; q < 16; ++q)
        _mm512_storeu_ps(dense + (ib + q) * k + jb, scale == 1 ? r[q] : _mm512_mul_ps(r[q], f));
    }
  }
}
#pragma GCC diagnostic pop

void copy_transposed(float* dense, const float* src, int64_t rows, int64_t k, int64_t sc,
                     float scale) {
  int64_t rows16 = 0, k16 = 0;  // the part that 16 x 16 blocks cover
  if (onednn_avx512()) {
    rows16 = rows / 16 * 16;
    k16 = k / 16 * 16;
    transpose_blocks16(dense, src, rows, k, sc, scale);
  }
  for (int64_t j = 0; j < k; ++j)
    for (int64_t i = j < k16 ? rows16 : 0; i < rows; ++i)
      dense[i * k + j] = scale == 1 ? src[i + j * sc] : src[i + j * sc] * scale;
}

// A part's argument table on one thread: its memory objects, made once and pointed at each
// task's operands with set_data_handle (making fresh ones cost 1.4 us of a [32,10]x[10,256]
// product's 5.0 us, one thread). Keyed by the part's id, never reused, so a part freed and
// another made at its address cannot meet a stale table; the cache is dropped past 512 parts.
struct BoundArgs {
  std::unordered_map<int, dnnl::memory> args;
  void set(int arg, void* p) { args.at(arg).set_data_handle(p); }
};

BoundArgs& bound_args(const Part& part) {
  thread_local std::unordered_map<uint64_t, BoundArgs> cache;
  auto it = cache.find(part.id);
  if (it != cache.end()) return it->second;
  if (cache.size() >= 512) cache.clear();
  BoundArgs b;
  dnnl::engine& eng = engine();
  auto add = [&](int arg, const md& d) { b.args.emplace(arg, dnnl::memory(d, eng, nullptr)); };
  add(DNNL_ARG_SRC, part.a);
  add(DNNL_ARG_WEIGHTS, part.b);
  add(DNNL_ARG_DST, part.c);
  if (part.bias) add(DNNL_ARG_BIAS, part.bias_md);
  if (part.fused)
    for (size_t j = 0; j < part.bin.size(); ++j)
      add(DNNL_ARG_ATTR_MULTIPLE_POST_OP(part.bin_index[j]) | DNNL_ARG_SRC_1, part.bin[j]);
  if (part.scratch > 0) add(DNNL_ARG_SCRATCHPAD, part.scratch_md);
  return cache.emplace(part.id, std::move(b)).first->second;
}

void run_task(const OnednnProduct& p, const Task& t, void* const* ptr) {
  if (t.rows == 0 || t.cols == 0) return;
  OneOmpThread one;
  thread_local dnnl::stream stream(engine());
  auto at = [&](int buf, int64_t off) { return static_cast<float*>(ptr[buf]) + off; };
  float* c = at(p.c_buf, t.c);
  // Each binary operand's block; the last one moves when the output lies in it.
  thread_local std::vector<const float*> ys;
  ys.resize(p.bin.size());
  for (size_t j = 0; j < p.bin.size(); ++j) ys[j] = at(p.bin[j].buf, t.bin[j]);
  const Part& primary = *p.parts[t.part];
  const Part* chosen = &primary;
  // The output lies in the last addend's memory (the plan lets a product write over the weight
  // its update adds to, adds_in_place in buffer_lifetimes.cpp): the part's in-place form adds what
  // C holds. Without one (gemm:jit has none), the addend's block is copied aside first.
  const bool aliased = !p.bin.empty() && p.post.back().kind == PostOp::Add && ys.back() == c;
  if (aliased && chosen->in_place) {
    chosen = chosen->in_place.get();
  } else if (aliased) {
    thread_local std::vector<float> addend;
    const int64_t ld = p.bin.back().sr;
    addend.resize(static_cast<size_t>((t.rows - 1) * ld + t.cols));
    for (int64_t i = 0; i < t.rows; ++i)
      std::memcpy(addend.data() + i * ld, c + i * ld, static_cast<size_t>(t.cols) * sizeof(float));
    ys.back() = addend.data();
  }
  const Part& part = *chosen;
  BoundArgs& b = bound_args(part);
  if (part.dense_a) {
    // The task's rows of A, read transposed (row i, column j at i + j * sc), copied dense.
    thread_local std::vector<float> dense;
    const int64_t k = part.a.dims()[1], sc = p.a.sc;
    dense.resize(static_cast<size_t>(t.rows * k));
    float scale = primary.a_scale;  // the folded scales (build_folded)
    for (size_t j = 0; j < primary.folded_bins; ++j) scale *= *ys[j];
    copy_transposed(dense.data(), at(p.a.buf, t.a), t.rows, k, sc, scale);
    b.set(DNNL_ARG_SRC, dense.data());
  } else {
    b.set(DNNL_ARG_SRC, at(p.a.buf, t.a));
  }
  b.set(DNNL_ARG_WEIGHTS, at(p.b.buf, t.b));
  thread_local std::vector<float> dense_c;
  if (part.dense_c) dense_c.resize(static_cast<size_t>(t.rows * t.cols));
  b.set(DNNL_ARG_DST, part.dense_c ? dense_c.data() : c);
  // The product's first binary operands not in part.bin: the folded scalars, then the bias
  // when the primitive adds it.
  const size_t skip = primary.folded_bins + (part.bias ? 1 : 0);
  if (part.bias) b.set(DNNL_ARG_BIAS, const_cast<float*>(ys[primary.folded_bins]));
  if (part.fused)  // an in-place part's bin lacks the last operand (its sum reads C)
    for (size_t j = 0; j < part.bin.size(); ++j)
      b.set(DNNL_ARG_ATTR_MULTIPLE_POST_OP(part.bin_index[j]) | DNNL_ARG_SRC_1,
            const_cast<float*>(ys[j + skip]));
  thread_local std::vector<char> scratch;
  if (part.scratch > 0) {
    if (scratch.size() < part.scratch + 64) scratch.resize(part.scratch + 64);
    char* s = scratch.data() + (64 - reinterpret_cast<uintptr_t>(scratch.data()) % 64) % 64;
    b.set(DNNL_ARG_SCRATCHPAD, s);
  }
  part.prim.execute(stream, b.args);
  stream.wait();
  if (part.dense_c)
    for (int64_t i = 0; i < t.rows; ++i)
      std::memcpy(c + i * p.ldc, dense_c.data() + i * t.cols,
                  static_cast<size_t>(t.cols) * sizeof(float));
  if (part.fused || p.post.empty()) return;
  // loom's epilogue on the block, while it is still in cache (epilogue.h's arguments).
  thread_local std::vector<int64_t> params;
  thread_local std::vector<void*> args;
  params.assign({t.cols, p.ldc});
  args.assign({c, nullptr});  // [1]: params, once they stop growing
  for (size_t j = part.bias ? 1 : 0; j < p.bin.size(); ++j) {
    params.insert(params.end(), {p.bin[j].sr, p.bin[j].sc});
    args.push_back(const_cast<float*>(ys[j]));
  }
  args[1] = params.data();
  part.epilogue(args.data(), 0, t.rows);
}

}  // namespace

bool onednn_avx512() {
  static const bool on = [] {
    switch (dnnl::get_effective_cpu_isa()) {
      case dnnl::cpu_isa::avx512_core:
      case dnnl::cpu_isa::avx512_core_vnni:
      case dnnl::cpu_isa::avx512_core_bf16:
      case dnnl::cpu_isa::avx512_core_amx: return true;
      default: return false;
    }
  }();
  return on;
}

std::string onednn_describe(const OnednnProduct& prod) {
  std::string impls;
  for (const auto& part : prod.parts)
    if (impls.find(part->impl) == std::string::npos)
      impls += (impls.empty() ? "" : ",") + part->impl;
  const bool columns = !prod.tasks.empty() && prod.tasks[0].cols < prod.ldc;
  const bool bias = !prod.parts.empty() && std::all_of(prod.parts.begin(), prod.parts.end(),
                                                       [](const auto& p) { return p->bias; });
  const bool in_place =
      !prod.parts.empty() && std::all_of(prod.parts.begin(), prod.parts.end(),
                                         [](const auto& p) { return p->in_place != nullptr; });
  const bool folded = !prod.parts.empty() && std::all_of(prod.parts.begin(), prod.parts.end(),
                                                         [](const auto& p) { return p->fold > 0; });
  const bool chosen =
      std::any_of(prod.parts.begin(), prod.parts.end(), [](const auto& p) { return p->chosen; });
  return detail::str_cat(impls.empty() ? "nothing to compute" : impls, ", ", prod.tasks.size(),
                         columns ? " column parts" : " parts",
                         bias ? ", bias in the primitive" : "",
                         onednn_fused(prod) ? ""
                         : chosen           ? ", post-ops in loom's epilogue"
                                            : ", post-ops in loom's epilogue (oneDNN refused them)",
                         in_place ? ", the last add in place when the output takes its memory" : "",
                         folded ? ", scales folded into A's copy" : "");
}

namespace {
std::atomic<bool> g_epilogues_everywhere{false};
}  // namespace
bool epilogues_everywhere() { return g_epilogues_everywhere.load(std::memory_order_relaxed); }
void set_epilogues_everywhere(bool on) { g_epilogues_everywhere.store(on); }

bool onednn_fused(const OnednnProduct& prod) {
  return std::all_of(prod.parts.begin(), prod.parts.end(), [](const auto& p) { return p->fused; });
}

namespace {

// Batches that share B, with A's (and each binary operand's) rows evenly spaced across
// them, are one tall product (as run_matmul does for OpenBLAS).
bool batches_merge(const OnednnProduct& prod, const Shape& os, size_t br, int64_t m, int64_t nb) {
  auto even = [&](const Operand& o, bool rows_in_order) {
    bool ok = rows_in_order;
    for (size_t d = br, span = 1; ok && d-- > 0;) {
      ok = os[d] == 1 || o.batch[d] == static_cast<int64_t>(span) * m * o.sr;
      span *= static_cast<size_t>(os[d]);
    }
    return ok;
  };
  bool merge = nb > 1 && std::all_of(prod.b.batch.begin(), prod.b.batch.end(),
                                     [](int64_t s) { return s == 0; });
  merge = merge && even(prod.a, prod.a.sc == 1);
  for (const Operand& y : prod.bin) merge = merge && even(y, true);
  return merge;
}

// The product's tasks: per batch, row_parts x col_parts blocks of its [m, nn] output, each
// with the part (shared by blocks of one size) that computes it.
void add_tasks(OnednnProduct& p, const std::vector<int64_t>& batch, int64_t nb, size_t br,
               int64_t m, int64_t nn, int64_t k, int64_t row_parts, int64_t col_parts) {
  auto part_of = [&](int64_t rows, int64_t cols) {
    for (size_t i = 0; i < p.tasks.size(); ++i)
      if (p.tasks[i].rows == rows && p.tasks[i].cols == cols) return p.tasks[i].part;
    p.parts.push_back(cached_part(rows, cols, k, p.a, p.b, p.ldc, p.post, p.bin));
    return static_cast<int>(p.parts.size() - 1);
  };
  for (int64_t bi = 0; bi < nb; ++bi) {
    int64_t oa = p.a.offset, ob = p.b.offset, rest = bi;
    std::vector<int64_t> oy;
    for (const Operand& y : p.bin) oy.push_back(y.offset);
    for (size_t d = br; d-- > 0;) {
      int64_t coord = rest % batch[d];
      rest /= batch[d];
      oa += coord * p.a.batch[d];
      ob += coord * p.b.batch[d];
      for (size_t j = 0; j < p.bin.size(); ++j) oy[j] += coord * p.bin[j].batch[d];
    }
    for (int64_t rp = 0; rp < row_parts; ++rp) {
      for (int64_t cp = 0; cp < col_parts; ++cp) {
        int64_t r0 = m * rp / row_parts, r1 = m * (rp + 1) / row_parts;
        int64_t c0 = nn * cp / col_parts, c1 = nn * (cp + 1) / col_parts;
        if (r0 == r1 || c0 == c1) continue;
        Task t;
        t.rows = r1 - r0;
        t.cols = c1 - c0;
        t.a = oa + r0 * p.a.sr;
        t.b = ob + c0 * p.b.sc;
        t.c = bi * m * nn + r0 * nn + c0;
        for (size_t j = 0; j < p.bin.size(); ++j) {
          const Operand& y = p.bin[j];
          t.bin.push_back(oy[j] + (y.bcast_rows ? 0 : r0 * y.sr) + (y.bcast_cols ? 0 : c0 * y.sc));
        }
        t.part = part_of(t.rows, t.cols);
        p.tasks.push_back(std::move(t));
      }
    }
  }
}

}  // namespace

std::shared_ptr<const OnednnProduct> make_onednn_product(const ir::Graph& g, const Plan& plan,
                                                         const Step& st) {
  auto p = std::make_shared<OnednnProduct>();
  const ir::Node& n = g.node(st.node);
  const Shape& os = n.type.shape;
  size_t br = os.size() - 2;
  int64_t m = os[br], nn = os[br + 1];
  const int64_t k = g.type(n.operands[0]).shape.back();
  LOOM_ASSERT(n.type.dtype == DType::Float32 && k > 0);
  p->a = matrix_operand(g, plan, n.operands[0].node, st.views[0], br);
  p->b = matrix_operand(g, plan, n.operands[1].node, st.views[1], br);
  p->c_buf = plan.buf_of[st.node];
  p->ldc = nn;
  p->post = st.post;
  for (const PostOp& po : st.post)
    if (po.binary()) p->bin.push_back(binary_operand(g, plan, po, os));
  p->name = detail::str_cat("onednn [", m, ",", k, "]x[", k, ",", nn, "]");
  p->k = k;
  if (m == 0 || nn == 0) return p;
  int64_t nb = 1;
  for (size_t d = 0; d < br; ++d) nb *= os[d];
  const bool merge = batches_merge(*p, os, br, m, nb);
  std::vector<int64_t> batch(os.begin(), os.begin() + static_cast<int64_t>(br));
  if (merge) {
    m *= nb;
    nb = 1;
    br = 0;
    batch.clear();
  }
  const int64_t pool = ThreadPool::instance().size();
  // Rows first, down to parts of 32: a part of whole rows writes a dense block of C, which
  // oneDNN 2.6's brgemm takes, while a part of columns writes a strided one and runs on its
  // gemm:jit (the MLP's [64,784]x[784,256] at 2 threads: 83 against 93 us per part in the
  // step, 4-12% more steps per second). Columns only for products of fewer rows.
  int64_t row_parts = nb >= 2 * pool ? 1 : std::min<int64_t>(pool, std::max<int64_t>(1, m / 32));
  // Except few rows against a transposed B (a Linear's weight, whose column blocks are dense
  // rows of the stored weight): columns, each part writing its block dense for brgemm. Each
  // thread then reads half the weight, and the weight gradient's row parts and the update
  // touch the same half (the MLP's step: 376 -> 311 us, the update kernel 54-88 -> 14 us).
  if (nb == 1 && m < 128 && p->b.sr == 1 && nn >= 128 && m * nn * k >= (int64_t{1} << 20))
    row_parts = 1;
  // A row against a matrix (a bias gradient as ones x dY) is bound by reading B: columns from a
  // 1 MiB B ([1,2048]x[2048,384] had run on one thread while the other waited, 38 a GPT step).
  int64_t col_parts = 1;
  if (nb == 1 && row_parts == 1 && nn >= 128 &&
      (m * nn * k >= (int64_t{1} << 20) || nn * k >= (int64_t{1} << 18)))
    col_parts = std::min<int64_t>(pool, nn / 64);
  add_tasks(*p, batch, nb, br, m, nn, k, row_parts, col_parts);
  return p;
}

std::vector<int64_t> onednn_row_bounds(const OnednnProduct& p) {
  std::vector<int64_t> bounds;
  int64_t next = 0;
  for (const Task& t : p.tasks) {
    if (t.cols != p.ldc || t.c != next * p.ldc) return {};
    bounds.push_back(next);
    next += t.rows;
  }
  bounds.push_back(next);
  return bounds;
}

RowRead onednn_row_read(const OnednnProduct& p, int buf, int64_t elems) {
  const std::vector<int64_t> bounds = onednn_row_bounds(p);
  if (bounds.size() < 2) return RowRead::Other;
  const int64_t m = bounds.back();
  // Operand o, read by task t at element offset at(t): row r of the task at row r of the buffer.
  auto rows_of = [&](const Operand& o, int64_t row_len, auto at) {
    if (o.sc != 1 || o.sr != row_len || m * o.sr != elems) return false;
    for (size_t t = 0; t < p.tasks.size(); ++t)
      if (at(t) != bounds[t] * o.sr) return false;
    return true;
  };
  RowRead r = RowRead::None;
  auto saw = [&](bool same) {
    r = !same || r == RowRead::Other ? RowRead::Other : RowRead::SameRows;
  };
  if (p.a.buf == buf) saw(rows_of(p.a, p.k, [&](size_t t) { return p.tasks[t].a; }));
  if (p.b.buf == buf) saw(false);
  for (size_t j = 0; j < p.bin.size(); ++j) {
    const Operand& y = p.bin[j];
    if (y.buf != buf) continue;
    saw(!y.bcast_rows && !y.bcast_cols &&
        rows_of(y, p.ldc, [&](size_t t) { return p.tasks[t].bin[j]; }));
  }
  return r;
}

int64_t onednn_tasks(const OnednnProduct& p) { return static_cast<int64_t>(p.tasks.size()); }

void run_onednn_task(const OnednnProduct& p, void* const* ptr, int64_t t) {
  run_task(p, p.tasks[static_cast<size_t>(t)], ptr);
}

const std::string& onednn_name(const OnednnProduct& p) { return p.name; }

void run_onednn(const OnednnProduct& p, void* const* ptr) {
  const int64_t tasks = static_cast<int64_t>(p.tasks.size());
  if (tasks == 0) return;
  auto one = [&](int t) {
    if (!profile::enabled()) [[likely]] {
      run_task(p, p.tasks[t], ptr);
      return;
    }
    double t0 = profile::now_us();
    run_task(p, p.tasks[t], ptr);
    profile::record("matmul", p.name, t0, profile::now_us(),
                    "\"task\": " + std::to_string(t) + ", \"tasks\": " + std::to_string(tasks));
  };
  if (tasks == 1)
    one(0);
  else
    ThreadPool::instance().run(static_cast<int>(tasks), one);
}

}  // namespace loom::cpu
