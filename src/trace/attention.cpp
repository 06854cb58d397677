// scaled_dot_product_attention: one fused attention node (ops.def), whose CPU kernel keeps no
// [L, S] scores, or with dropout the composite of matmul, softmax and dropout.
#include "loom/trace/attention.h"

#include <cmath>
#include <limits>

#include "loom/trace/ops.h"
#include "trace/ops_impl.h"

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
  LOOM_CHECK_T(DTypeError, m.dtype() == DType::Bool || m.dtype() == q.dtype(), op,
               " attn_mask must be bool or q's dtype ", q.dtype(), ", got ", type_of(m));
  const int64_t L = q.size(-2), S = k.size(-2);
  bool ok = m.dim() == 0 || (m.size(-1) == S || m.size(-1) == 1);
  if (m.dim() >= 2) ok = ok && (m.size(-2) == L || m.size(-2) == 1);
  LOOM_CHECK_T(ShapeError, ok, op, " attn_mask ", type_of(m),
               " does not broadcast to the scores [..., ", L, ", ", S, "] of q ", type_of(q),
               " and k ", type_of(k));
}

// [L, S] bool: query i keeps key j <= i (torch's top-left alignment).
Tensor causal_keep(int64_t L, int64_t S) {
  return unsqueeze(arange(0, static_cast<double>(L), DType::Int64), 1) >=
         unsqueeze(arange(0, static_cast<double>(S), DType::Int64), 0);
}

// attn_mask with the causal triangle folded in, as torch's CPU kernels apply the pair: a
// boolean mask and-ed with it, an additive one -inf above it.
Tensor with_causal(const Tensor& mask, int64_t L, int64_t S) {
  Tensor keep = causal_keep(L, S);
  if (mask.dtype() == DType::Bool) return where(keep, mask, keep);
  return where(keep, mask, full({}, -std::numeric_limits<double>::infinity(), mask.dtype()));
}

// The composite: scores written out, for dropout (the fused op draws no random numbers).
Tensor composite_attention(const Tensor& q, const Tensor& kk, const Tensor& vv,
                           const SdpaOptions& o, double scale) {
  const int64_t L = q.size(-2), S = kk.size(-2);
  const double inf = std::numeric_limits<double>::infinity();
  Tensor scores = matmul(q, transpose(kk, -2, -1)) * scale;
  if (o.is_causal) {
    scores = where(causal_keep(L, S), scores, full({}, -inf, scores.dtype()));
  } else if (o.attn_mask.defined()) {
    scores = o.attn_mask.dtype() == DType::Bool
                 ? where(o.attn_mask, scores, full({}, -inf, scores.dtype()))
                 : scores + o.attn_mask;
  }
  // A fully masked row: shift by 0 and divide by 1, so it gives zeros and no NaN gradient.
  Tensor top = max(scores, {-1}, true);
  Tensor zero = full({}, 0, scores.dtype()), one = full({}, 1, scores.dtype());
  Tensor e = exp(scores - where(top == full({}, -inf, top.dtype()), zero, top));
  Tensor total = sum(e, {-1}, true);
  return matmul(dropout(e / where(total == zero, one, total), o.dropout_p, true), vv);
}

// q, k and v with their batch dims (all but the last two, and k's and v's heads aside when
// grouped) broadcast to one shape, which the mask's batch dims join too.
void broadcast_batches(Tensor& q, Tensor& k, Tensor& v, const Tensor& mask, int64_t group) {
  const int64_t r = std::max({q.dim(), k.dim(), v.dim(), mask.defined() ? mask.dim() : 0});
  std::vector<int64_t> batch(static_cast<size_t>(r - 2), 1);
  auto join = [&](const Tensor& t, bool kv) {
    const int64_t lead = r - t.dim();
    for (int64_t d = lead; d < r - 2; ++d) {
      int64_t n = t.size(d - lead);
      if (kv && group > 1 && d == r - 3) n *= group;
      int64_t& b = batch[static_cast<size_t>(d)];
      LOOM_CHECK_T(ShapeError, n == b || n == 1 || b == 1, "[scaled_dot_product_attention] ",
                   "the batch dims of q ", type_of(q), ", k ", type_of(k), ", v ", type_of(v),
                   mask.defined() ? " and the mask " + type_of(mask).str() : std::string(),
                   " do not broadcast",
                   kv && group == 1 && d == r - 3 && n != 1 && b % n == 0
                       ? "; k and v have fewer heads than q: pass enable_gqa=true for grouped "
                         "heads"
                       : "");
      if (b == 1) b = n;
    }
  };
  join(q, false);
  join(k, true);
  join(v, true);
  if (mask.defined()) join(mask, false);
  auto grow = [&](const Tensor& t, bool kv) {
    std::vector<int64_t> s = batch;
    if (kv && group > 1) s.back() /= group;
    s.push_back(t.size(-2));
    s.push_back(t.size(-1));
    Tensor x = t;
    while (x.dim() < r) x = unsqueeze(x, 0);
    return x.shape().vec() == s ? x : expand(x, s);
  };
  q = grow(q, false);
  k = grow(k, true);
  v = grow(v, true);
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const SdpaOptions& opts) {
  check_inputs(q, k, v, opts);
  SdpaOptions o = opts;
  if (o.attn_mask.defined() && o.is_causal) {
    o.attn_mask = with_causal(o.attn_mask, q.size(-2), k.size(-2));
    o.is_causal = false;
  }
  int64_t group = 1;
  if (o.enable_gqa && q.dim() >= 3 && k.dim() >= 3 && q.size(-3) != k.size(-3))
    group = q.size(-3) / k.size(-3);
  const double scale = o.scale ? *o.scale : 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  if (o.dropout_p > 0) {
    Tensor kk = group > 1 ? repeat_heads(k, group) : k, vv = group > 1 ? repeat_heads(v, group) : v;
    return composite_attention(q, kk, vv, o, scale);
  }
  // The fused op computes in float32 or float64; half precision is widened and rounded back.
  const DType dt = q.dtype(), wide = dt == DType::Float64 ? dt : DType::Float32;
  Tensor qq = to(q, wide), kk = to(k, wide), vv = to(v, wide);
  Tensor mask = o.attn_mask;
  if (mask.defined() && mask.dtype() != DType::Bool) mask = to(mask, wide);
  broadcast_batches(qq, kk, vv, mask, group);
  if (qq.numel() == 0 || kk.size(-2) == 0 || vv.numel() == 0) {  // nothing to attend: zeros
    std::vector<int64_t> s = qq.shape().vec();
    s.back() = vv.size(-1);
    return zeros(Shape(s), dt);
  }
  detail::OpRecord rec;
  std::vector<ir::Value> operands = {rec.ctx.value_of(qq), rec.ctx.value_of(kk),
                                     rec.ctx.value_of(vv)};
  if (mask.defined()) operands.push_back(rec.ctx.value_of(mask));
  ir::Attrs a;
  a.i = group;
  a.flag = o.is_causal;
  a.f = scale;
  std::vector<ir::Value> r = rec.b().make_region(ir::OpKind::Attention, operands, a, {});
  return to(rec.ctx.wrap(r[0]), dt);
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
