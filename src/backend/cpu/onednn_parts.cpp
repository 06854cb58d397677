// Each part's oneDNN primitive (onednn_impl.h): its descriptors and post-ops, the move onto
// brgemm, loom's epilogue where oneDNN is slower or refuses, and the process-wide table.
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/cpu/epilogue.h"
#include "backend/cpu/onednn_impl.h"
#include "loom/core/error.h"

namespace loom::cpu::dnn {

namespace {

md matrix_md(int64_t rows, int64_t cols, int64_t sr, int64_t sc) {
  // Strides of size-1 dims do not address anything: give them dense values.
  if (rows == 1) sr = cols * std::max<int64_t>(sc, 1);
  if (cols == 1) sc = 1;
  return md({rows, cols}, dnnl::memory::data_type::f32, dims{sr, sc});
}

dnnl::algorithm eltwise_alg(PostOp::Kind k) {
  switch (k) {
    case PostOp::Relu: return dnnl::algorithm::eltwise_relu;
    case PostOp::Tanh: return dnnl::algorithm::eltwise_tanh;
    case PostOp::Sigmoid: return dnnl::algorithm::eltwise_logistic;
    case PostOp::Gelu: return dnnl::algorithm::eltwise_gelu_erf;
    default: return dnnl::algorithm::eltwise_linear;
  }
}
dnnl::algorithm binary_alg(PostOp::Kind k) {
  switch (k) {
    case PostOp::Add: return dnnl::algorithm::binary_add;
    case PostOp::Sub: return dnnl::algorithm::binary_sub;
    case PostOp::Mul: return dnnl::algorithm::binary_mul;
    case PostOp::Div: return dnnl::algorithm::binary_div;
    case PostOp::Max: return dnnl::algorithm::binary_max;
    default: return dnnl::algorithm::binary_min;
  }
}

// build_part's post-ops: those after the primitive's bias into `ops`, each binary operand's
// layout into part.bin; the last an in-place sum when sum_last.
void append_post_ops(dnnl::post_ops& ops, Part& part, int64_t rows, int64_t cols,
                     const std::vector<PostOp>& post, const std::vector<Operand>& bin, size_t first,
                     bool sum_last) {
  for (size_t i = first, j = first; i < post.size(); ++i) {
    const PostOp& po = post[i];
    const int at = static_cast<int>(i - first);  // position in `ops`
    if (sum_last && i + 1 == post.size()) {
      ops.append_sum(1.f);
      continue;
    }
    if (!po.binary()) {
      // alpha and beta mean something only to linear (relu's alpha is its negative slope).
      const bool linear = po.kind == PostOp::Linear;
      ops.append_eltwise(1.f, eltwise_alg(po.kind), linear ? po.alpha : 0.f,
                         linear ? po.beta : 0.f);
      continue;
    }
    const Operand& y = bin[j++];
    part.bin.push_back(matrix_md(y.bcast_rows ? 1 : rows, y.bcast_cols ? 1 : cols, y.sr, y.sc));
    part.bin_index.push_back(at);
    ops.append_binary(binary_alg(po.kind), part.bin.back());
  }
}

// The part's primitive made from its layouts, with `ops` when with_post and not `chosen` for
// loom's epilogue, and the bias in the primitive when with_post and desc_bias.
void make_primitive(Part& part, const dnnl::post_ops& ops, bool with_post, bool chosen,
                    bool desc_bias) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (with_post && !chosen) attr.set_post_ops(ops);
  part.bias = with_post && desc_bias;
  dnnl::matmul::primitive_desc pd(part.bias
                                      ? dnnl::matmul::desc(part.a, part.b, part.bias_md, part.c)
                                      : dnnl::matmul::desc(part.a, part.b, part.c),
                                  attr, engine());
  part.scratch_md = pd.scratchpad_desc();
  part.impl = pd.impl_info_str();
  part.scratch = part.scratch_md.get_size();
  part.prim = dnnl::matmul(pd);
}

// What build_part throws when oneDNN refuses the product even without its post-ops.
CompileError refused_error(int64_t rows, int64_t cols, int64_t k, const Operand& a,
                           const Operand& b, const dnnl::error& e) {
  return CompileError(detail::str_cat("[matmul] oneDNN refused the f32 product [", rows, ",", k,
                                      "]x[", k, ",", cols, "] (A strides ", a.sr, ",", a.sc,
                                      "; B strides ", b.sr, ",", b.sc, "): ", e.what(),
                                      "; LOOM_MATMUL=openblas runs products on OpenBLAS"));
}

// build_part's step from gemm:jit to brgemm: A copied dense, or C written dense, where brgemm
// then takes the part (`make(with_post)` rebuilds its primitive).
template <class Make>
void move_onto_brgemm(Part& part, const Make& make, int64_t rows, int64_t cols, int64_t k,
                      const Operand& a, int64_t ldc, const std::vector<PostOp>& post) {
  // The part rebuilt with `relayout` applied, kept if brgemm takes it: post-ops fused first
  // when `fuse_first`, else (or if refused fused) the product alone, unless that would move
  // fused post-ops into the epilogue. Otherwise the part is put back as it was.
  auto onto_brgemm = [&](auto relayout, bool fuse_first) {
    Part plain = part;
    relayout(part);
    for (bool with_post : {fuse_first, false}) {
      if (!with_post && plain.fused && !post.empty()) break;
      try {
        make(with_post);
        if (part.impl.rfind("brg", 0) == 0) {
          part.fused = with_post || post.empty();
          return true;
        }
      } catch (const dnnl::error&) {
      }
      if (!with_post) break;
    }
    part = std::move(plain);
    return false;
  };
  // A transposed (a weight gradient's dY^T) sends the product to gemm:jit. Copying the
  // task's block of A dense (at most 256 KB) lets brgemm take it, post-ops fused: half of
  // the MLP's [256,64]^T x [64,784] with its scale, one thread, hot, 59.9 against 66.4 us;
  // in the step 61.8-64.0 against 68.5-78.1 us (LOOM_PROFILE medians).
  if (a.sr == 1 && a.sc != 1 && rows > 1 && k > 1 && rows * k <= (int64_t{1} << 16) &&
      part.impl.rfind("gemm", 0) == 0)
    part.dense_a =
        onto_brgemm([&](Part& q) { q.a = matrix_md(rows, k, k, 1); }, part.fused && !post.empty());
  // Likewise a block of columns (ldc > cols): brgemm writes it dense to scratch, copied into
  // place (docs/architecture.md, "Measurements": dense_c), post-ops fused even if the strided
  // part ran them after; brgemm refuses a binary operand unlike dense C.
  if (ldc != cols && rows > 1 && rows * cols <= (int64_t{1} << 20) &&
      part.impl.rfind("gemm", 0) == 0)
    part.dense_c =
        onto_brgemm([&](Part& q) { q.c = matrix_md(rows, cols, cols, 1); }, !post.empty());
}

// A part whose post-ops run after the product: loom's epilogue takes the post-ops after the
// primitive's bias (nothing was folded: only fused parts fold), with the binary operands' column
// strides.
void set_epilogue(Part& part, const std::vector<PostOp>& post, const std::vector<Operand>& bin) {
  const size_t skip = part.bias ? 1 : 0;
  std::vector<int64_t> col_strides;
  for (size_t j = skip; j < bin.size(); ++j) col_strides.push_back(bin[j].sc);
  part.epilogue = epilogue_function(std::span(post).subspan(skip), col_strides);
}

// `like`: the part's in-place form (Part::in_place) with like's layout of A: the last post-op
// (an add of an operand laid out as C) becomes oneDNN's sum, which adds what C holds before
// the product writes it; null unless its post-ops run fused.
std::shared_ptr<Part> build_part(int64_t rows, int64_t cols, int64_t k, const Operand& a,
                                 const Operand& b, int64_t ldc, const std::vector<PostOp>& post,
                                 const std::vector<Operand>& bin, const Part* like = nullptr) {
  OneOmpThread one;
  const bool sum_last = like != nullptr;
  auto part = std::make_shared<Part>();
  static std::atomic<uint64_t> next_id{1};
  part->id = next_id++;
  part->a = matrix_md(rows, k, a.sr, a.sc);
  part->b = matrix_md(k, cols, b.sr, b.sc);
  part->c = matrix_md(rows, cols, ldc, 1);
  // A first post-op adding a dense row vector (a Linear's bias) is the primitive's bias, added in
  // the accumulators; a scalar stays a binary post-op, since 2.6 then fused none of the post-ops
  // behind it (docs/architecture.md, "Measurements": desc_bias).
  const bool desc_bias = !post.empty() && post[0].kind == PostOp::Add && bin[0].bcast_rows &&
                         !bin[0].bcast_cols && bin[0].sc == 1;
  if (desc_bias) part->bias_md = matrix_md(1, cols, cols, 1);
  const size_t first = desc_bias ? 1 : 0;  // the post-ops oneDNN gets start here
  // Post-ops with an exact GELU run in loom's epilogue after a product adding only the bias:
  // oneDNN's gelu_erf (an exp and a division per element) costs more than loom's rational erf on
  // the block just written (docs/architecture.md, "Measurements": exact GELU epilogue).
  const bool chosen =
      !sum_last &&
      (epilogues_everywhere() ||
       std::any_of(post.begin() + static_cast<std::ptrdiff_t>(std::min(first, post.size())),
                   post.end(), [](const PostOp& po) { return po.kind == PostOp::Gelu; }));
  dnnl::post_ops ops;
  append_post_ops(ops, *part, rows, cols, post, bin, first, sum_last);
  auto make = [&](bool with_post) { make_primitive(*part, ops, with_post, chosen, desc_bias); };
  auto refused = [&](const dnnl::error& e) { return refused_error(rows, cols, k, a, b, e); };
  if (sum_last) {
    part->dense_a = like->dense_a;
    if (like->dense_a) part->a = matrix_md(rows, k, k, 1);
    try {
      make(true);
    } catch (const dnnl::error&) {
      return nullptr;
    }
    return part->impl.rfind("ref", 0) == 0 ? nullptr : part;
  }
  try {
    make(!post.empty());
    // oneDNN answers some post-op lists with its reference implementation ("ref:any": a plain
    // loop, ~100x slower; a [64,784]x[784,256] product with a broadcast bias took 300 ms on
    // AVX2 with gemm:jit's 0.3 ms): run those post-ops in loom's epilogue after a fast product.
    if (!post.empty() && part->impl.rfind("ref", 0) == 0) {
      make(false);
      part->fused = false;
    }
    move_onto_brgemm(*part, make, rows, cols, k, a, ldc, post);
  } catch (const dnnl::error& e) {
    if (post.empty()) throw refused(e);
    try {
      make(false);  // oneDNN refused the post-ops here: loom's epilogue runs them
    } catch (const dnnl::error& e2) {
      throw refused(e2);
    }
    part->fused = false;
  }
  if (chosen && !post.empty()) {
    part->fused = false;
    part->chosen = true;
  }
  if (!part->fused && !post.empty()) set_epilogue(*part, post, bin);
  const bool adds_c = !post.empty() && post.back().kind == PostOp::Add && !bin.back().bcast_rows &&
                      !bin.back().bcast_cols && bin.back().sr == ldc && bin.back().sc == 1;
  if (adds_c && !part->dense_c && part->fused)
    part->in_place = build_part(rows, cols, k, a, b, ldc, post, bin, part.get());
  return part;
}

// The part, with its leading scales folded into A's dense copy when A is copied anyway: a
// scale of the product is one of A, and a binary post-op that broadcasts a scalar costs
// brgemm more than a multiply in the copy. Half of the MLP's weight gradient with its SGD
// update (lr, a 0-d input, as a binary post-op, then -1 and the sum), one thread, hot: 64.8 us
// against 55.2 for the product alone (a probe).
std::shared_ptr<const Part> build_folded(int64_t rows, int64_t cols, int64_t k, const Operand& a,
                                         const Operand& b, int64_t ldc,
                                         const std::vector<PostOp>& post,
                                         const std::vector<Operand>& bin) {
  size_t fold = 0, folded_bins = 0;
  float scale = 1;
  for (; fold < post.size(); ++fold) {
    const PostOp& po = post[fold];
    if (po.kind == PostOp::Linear && po.beta == 0) {
      scale *= po.alpha;
    } else if (po.kind == PostOp::Mul && bin[folded_bins].bcast_rows &&
               bin[folded_bins].bcast_cols) {
      ++folded_bins;
    } else {
      break;
    }
  }
  // Only a transposed A is ever copied dense: try the folded part first there, and build the
  // plain one when that part does not copy A (or runs its post-ops in loom's epilogue).
  if (fold > 0 && a.sr == 1 && a.sc != 1) {
    std::vector<PostOp> rest(post.begin() + static_cast<std::ptrdiff_t>(fold), post.end());
    std::vector<Operand> rest_bin(bin.begin() + static_cast<std::ptrdiff_t>(folded_bins),
                                  bin.end());
    auto folded = build_part(rows, cols, k, a, b, ldc, rest, rest_bin);
    if (folded->dense_a && folded->fused) {
      folded->fold = fold;
      folded->folded_bins = folded_bins;
      folded->a_scale = scale;
      return folded;
    }
  }
  return build_part(rows, cols, k, a, b, ldc, post, bin);
}

}  // namespace

// Primitives shared by descriptor: the L layers of a model build each shape once (a lookup
// here costs well under a microsecond; oneDNN's own cache answers in 5-6 us, a fresh
// primitive 20-30 us). Cleared when full; programs keep the parts they hold.
std::shared_ptr<const Part> cached_part(int64_t rows, int64_t cols, int64_t k, const Operand& a,
                                        const Operand& b, int64_t ldc,
                                        const std::vector<PostOp>& post,
                                        const std::vector<Operand>& bin) {
  std::string key = detail::str_cat(rows, ",", cols, ",", k, ";", a.sr, ",", a.sc, ";", b.sr, ",",
                                    b.sc, ";", ldc, ";", epilogues_everywhere());
  for (size_t i = 0, j = 0; i < post.size(); ++i) {
    key +=
        detail::str_cat(";", static_cast<int>(post[i].kind), ",", post[i].alpha, ",", post[i].beta);
    if (post[i].binary()) {
      const Operand& y = bin[j++];
      key += detail::str_cat(",", y.sr, ",", y.sc, ",", y.bcast_rows, y.bcast_cols);
    }
  }
  static std::mutex mu;
  static std::unordered_map<std::string, std::shared_ptr<const Part>> table;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = table.find(key); it != table.end()) return it->second;
  }
  auto part = build_folded(rows, cols, k, a, b, ldc, post, bin);
  std::lock_guard<std::mutex> lock(mu);
  if (table.size() >= 1024) table.clear();
  table.emplace(std::move(key), part);
  return part;
}

}  // namespace loom::cpu::dnn
