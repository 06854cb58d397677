// Reference kernels of attention and attention_grad: each score row written out in double,
// the softmax and its gradient computed plainly from it (the oracle of the blocked CPU kernel).
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "backend/ref/ref_impl.h"
#include "loom/core/error.h"

namespace loom::detail::ref {

namespace {

using ir::OpKind;

constexpr double kInf = std::numeric_limits<double>::infinity();

// The shapes both kernels walk: rows of q (batch b, row i) against rows of k and v.
struct Walk {
  int64_t batches, heads, group, L, S, E, Ev;
  const Array *q, *k, *v, *mask;
  double scale;
  bool causal;
  Shape scores;  // [..., H, L, S]: the mask broadcasts to it

  Walk(const ir::Node& n, std::span<const Array> in, size_t mask_at)
      : q(&in[0]), k(&in[1]), v(&in[2]), mask(in.size() > mask_at ? &in[mask_at] : nullptr) {
    const Shape& qs = q->shape();
    const size_t r = qs.size();
    L = qs[r - 2];
    E = qs[r - 1];
    S = k->shape()[r - 2];
    Ev = v->shape()[r - 1];
    batches = 1;
    for (size_t d = 0; d + 2 < r; ++d) batches *= qs[d];
    group = n.attrs.i;
    heads = r >= 3 ? qs[r - 3] : 1;
    scale = n.attrs.f;
    causal = n.attrs.flag;
    scores = Shape(qs.begin(), qs.end() - 1);
    scores.push_back(S);
  }
  // The k/v batch of q's batch b: its head divided by the group.
  int64_t kv_batch(int64_t b) const { return (b / heads) * (heads / group) + (b % heads) / group; }
  // Row i of batch b's scores, masked (-inf where a key is left out).
  void scores_row(int64_t b, int64_t i, const BroadcastIndex* mi, std::vector<double>& s) const {
    const int64_t kb = kv_batch(b);
    for (int64_t j = 0; j < S; ++j) {
      double acc = 0;
      for (int64_t e = 0; e < E; ++e)
        acc += q->get_f((b * L + i) * E + e) * k->get_f((kb * S + j) * E + e);
      acc *= scale;
      if (causal && j > i) acc = -kInf;
      if (mask) {
        const double m = mask->get_f((*mi)(((b * L) + i) * S + j));
        acc = mask->dtype() == DType::Bool ? (m != 0 ? acc : -kInf) : acc + m;
      }
      s[static_cast<size_t>(j)] = acc;
    }
  }
};

void attention_kernel(const ir::Node& n, std::span<const backend::Executable* const>,
                      std::span<const Array> in, std::span<Array> out) {
  const Walk w(n, in, 3);
  std::optional<BroadcastIndex> mi;
  if (w.mask) mi.emplace(w.scores, w.mask->shape());
  Array &o = out[0], &lse = out[1];
  std::vector<double> s(static_cast<size_t>(w.S));
  for (int64_t b = 0; b < w.batches; ++b) {
    const int64_t kb = w.kv_batch(b);
    for (int64_t i = 0; i < w.L; ++i) {
      w.scores_row(b, i, mi ? &*mi : nullptr, s);
      double top = -kInf;
      for (double x : s) top = std::isnan(x) || x > top ? x : top;  // NaN spreads, as in torch
      const int64_t row = b * w.L + i;
      if (top == -kInf) {  // every key masked: zeros, as torch >= 2.5
        lse.set_f(row, -kInf);
        for (int64_t e = 0; e < w.Ev; ++e) o.set_f(row * w.Ev + e, 0);
        continue;
      }
      double total = 0;
      for (double& x : s) total += (x = std::exp(x - top));
      lse.set_f(row, top + std::log(total));
      for (int64_t e = 0; e < w.Ev; ++e) {
        double acc = 0;
        for (int64_t j = 0; j < w.S; ++j)
          acc += s[static_cast<size_t>(j)] * w.v->get_f((kb * w.S + j) * w.Ev + e);
        o.set_f(row * w.Ev + e, acc / total);
      }
    }
  }
}

// dv_j += p_ij dout_i; ds_ij = p_ij (dout_i . v_j - delta_i); dq_i += scale ds_ij k_j;
// dk_j += scale ds_ij q_i, with p_ij = exp(s_ij - lse_i) (0 for a fully masked row).
void attention_grad_kernel(const ir::Node& n, std::span<const backend::Executable* const>,
                           std::span<const Array> in, std::span<Array> out) {
  const Walk w(n, in, 6);
  const Array &lse = in[3], &delta = in[4], &dout = in[5];
  std::optional<BroadcastIndex> mi;
  if (w.mask) mi.emplace(w.scores, w.mask->shape());
  std::vector<double> dq(static_cast<size_t>(w.batches * w.L * w.E), 0.0);
  std::vector<double> dk(static_cast<size_t>(w.k->numel()), 0.0);
  std::vector<double> dv(static_cast<size_t>(w.v->numel()), 0.0);
  std::vector<double> s(static_cast<size_t>(w.S));
  for (int64_t b = 0; b < w.batches; ++b) {
    const int64_t kb = w.kv_batch(b);
    for (int64_t i = 0; i < w.L; ++i) {
      const int64_t row = b * w.L + i;
      const double l = lse.get_f(row);
      if (l == -kInf) continue;
      w.scores_row(b, i, mi ? &*mi : nullptr, s);
      const double d = delta.get_f(row);
      for (int64_t j = 0; j < w.S; ++j) {
        const double p = std::exp(s[static_cast<size_t>(j)] - l);
        double dp = 0;
        for (int64_t e = 0; e < w.Ev; ++e) {
          const double g = dout.get_f(row * w.Ev + e);
          dp += g * w.v->get_f((kb * w.S + j) * w.Ev + e);
          dv[static_cast<size_t>((kb * w.S + j) * w.Ev + e)] += p * g;
        }
        const double ds = p * (dp - d) * w.scale;
        for (int64_t e = 0; e < w.E; ++e) {
          dq[static_cast<size_t>(row * w.E + e)] += ds * w.k->get_f((kb * w.S + j) * w.E + e);
          dk[static_cast<size_t>((kb * w.S + j) * w.E + e)] += ds * w.q->get_f(row * w.E + e);
        }
      }
    }
  }
  for (size_t x = 0; x < dq.size(); ++x) out[0].set_f(static_cast<int64_t>(x), dq[x]);
  for (size_t x = 0; x < dk.size(); ++x) out[1].set_f(static_cast<int64_t>(x), dk[x]);
  for (size_t x = 0; x < dv.size(); ++x) out[2].set_f(static_cast<int64_t>(x), dv[x]);
}

}  // namespace

void register_attention_kernels(KernelTable& t) {
  t.set(OpKind::Attention, attention_kernel);
  t.set(OpKind::AttentionGrad, attention_grad_kernel);
}

}  // namespace loom::detail::ref
