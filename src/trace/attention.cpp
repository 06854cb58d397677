// Attention as a composite of loom's ops: the products on the library path, the softmax and
// masks fused by the planner around them.
#include "loom/trace/attention.h"

#include <cmath>
#include <limits>

#include "loom/trace/ops.h"

namespace loom {

namespace {
TensorType type_of(const Tensor& x) { return {x.dtype(), x.shape()}; }

// k [..., Hk, S, E] -> [..., Hk * group, S, E], each head repeated `group` times in a row.
Tensor repeat_heads(const Tensor& k, int64_t group) {
  std::vector<int64_t> grown = k.shape().vec(), joined = k.shape().vec();
  const size_t h = grown.size() - 3;
  grown.insert(grown.begin() + static_cast<std::ptrdiff_t>(h) + 1, group);
  joined[h] *= group;
  return reshape(expand(unsqueeze(k, static_cast<int64_t>(h) + 1), grown), joined);
}

void check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const SdpaOptions& o) {
  const char* op = "[scaled_dot_product_attention]";
  LOOM_CHECK_T(ShapeError, q.dim() >= 2 && k.dim() >= 2 && v.dim() >= 2, op,
               " expected q [..., L, E], k [..., S, E], v [..., S, Ev], got ", type_of(q), ", ",
               type_of(k), ", ", type_of(v));
  LOOM_CHECK_T(DTypeError,
               is_floating(q.dtype()) && k.dtype() == q.dtype() && v.dtype() == q.dtype(), op,
               " expected q, k and v of one floating dtype, got ", type_of(q), ", ", type_of(k),
               ", ", type_of(v));
  LOOM_CHECK_T(ShapeError, q.size(-1) == k.size(-1) && k.size(-2) == v.size(-2), op,
               " expected q [..., L, E], k [..., S, E], v [..., S, Ev], got ", type_of(q), ", ",
               type_of(k), ", ", type_of(v));
  if (o.enable_gqa && q.dim() >= 3 && k.dim() >= 3) {
    const int64_t hq = q.size(-3), hk = k.size(-3), hv = v.size(-3);
    LOOM_CHECK_T(ShapeError, hk > 0 && hv == hk && hq % hk == 0, op,
                 " with enable_gqa, q's heads (dim -3) must be a multiple of k's and v's, got ",
                 type_of(q), ", ", type_of(k), ", ", type_of(v));
  }
  LOOM_CHECK_T(Error, o.dropout_p >= 0 && o.dropout_p <= 1, op,
               " dropout_p must be in [0, 1], got ", o.dropout_p);
  if (!o.attn_mask.defined()) return;
  const Tensor& m = o.attn_mask;
  LOOM_CHECK_T(Error, !o.is_causal, op,
               " takes attn_mask or is_causal, not both (torch refuses the pair too)");
  LOOM_CHECK_T(DTypeError, m.dtype() == DType::Bool || m.dtype() == q.dtype(), op,
               " attn_mask must be bool or q's dtype ", q.dtype(), ", got ", type_of(m));
  const int64_t L = q.size(-2), S = k.size(-2);
  bool ok = m.dim() == 0 || (m.size(-1) == S || m.size(-1) == 1);
  if (m.dim() >= 2) ok = ok && (m.size(-2) == L || m.size(-2) == 1);
  LOOM_CHECK_T(ShapeError, ok, op, " attn_mask ", type_of(m),
               " does not broadcast to the scores [..., ", L, ", ", S, "] of q ", type_of(q),
               " and k ", type_of(k));
}
}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const SdpaOptions& o) {
  check_inputs(q, k, v, o);
  const int64_t L = q.size(-2), S = k.size(-2);
  Tensor kk = k, vv = v;
  if (o.enable_gqa && q.dim() >= 3 && k.dim() >= 3 && q.size(-3) != k.size(-3)) {
    kk = repeat_heads(k, q.size(-3) / k.size(-3));
    vv = repeat_heads(v, q.size(-3) / v.size(-3));
  }
  const double scale = o.scale ? *o.scale : 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  const double inf = std::numeric_limits<double>::infinity();
  Tensor scores = matmul(q, transpose(kk, -2, -1)) * scale;
  Tensor att;
  if (o.is_causal) {  // every row keeps key 0: a plain softmax
    Tensor qpos = unsqueeze(arange(0, static_cast<double>(L), DType::Int64), 1);
    Tensor kpos = unsqueeze(arange(0, static_cast<double>(S), DType::Int64), 0);
    att = softmax(where(qpos >= kpos, scores, full({}, -inf, scores.dtype())), -1);
  } else if (o.attn_mask.defined()) {
    scores = o.attn_mask.dtype() == DType::Bool
                 ? where(o.attn_mask, scores, full({}, -inf, scores.dtype()))
                 : scores + o.attn_mask;
    // A fully masked row: shift by 0 and divide by 1, so it gives zeros and no NaN gradient.
    Tensor top = max(scores, {-1}, true);
    Tensor zero = full({}, 0, scores.dtype()), one = full({}, 1, scores.dtype());
    Tensor e = exp(scores - where(top == full({}, -inf, top.dtype()), zero, top));
    Tensor total = sum(e, {-1}, true);
    att = e / where(total == zero, one, total);
  } else {
    att = softmax(scores, -1);
  }
  if (o.dropout_p > 0) att = dropout(att, o.dropout_p, true);
  return matmul(att, vv);
}

Tensor packed_qkv_attention(const Tensor& qkv, int64_t heads, bool is_causal) {
  LOOM_CHECK_T(ShapeError, qkv.dim() == 3 && heads > 0 && qkv.size(2) % (3 * heads) == 0,
               "[packed_qkv_attention] expected qkv [batch, seq, 3 dim] with dim a multiple of ",
               heads, " heads, got ", type_of(qkv));
  const int64_t B = qkv.size(0), T = qkv.size(1), dim = qkv.size(2) / 3, hd = dim / heads;
  auto head = [&](int64_t k) {  // [B, heads, T, hd]
    Tensor part = slice(qkv, 2, k * dim, (k + 1) * dim);
    return permute(reshape(part, {B, T, heads, hd}), {0, 2, 1, 3});
  };
  SdpaOptions o;
  o.is_causal = is_causal;
  Tensor y = scaled_dot_product_attention(head(0), head(1), head(2), o);
  return reshape(permute(y, {0, 2, 1, 3}), {B, T, dim});
}

}  // namespace loom
