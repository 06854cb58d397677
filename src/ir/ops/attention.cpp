// Type rules of the fused attention ops (ops.def: attention, attention_grad).
#include "ir/ops/infer_impl.h"

namespace loom::ir::detail {

namespace {

// The checks both ops share: q [..., H, L, E], k [..., H / group, S, E], v [..., H / group, S,
// Ev] of one float32/float64 dtype, and a mask that broadcasts to [..., H, L, S].
void check_attention(const Graph& g, const char* op, std::span<const Value> xs, size_t mask_at,
                     const Attrs& a) {
  const TensorType &q = g.type(xs[0]), &k = g.type(xs[1]), &v = g.type(xs[2]);
  const std::string types = operand_types(g, xs);
  LOOM_CHECK_T(DTypeError,
               (q.dtype == DType::Float32 || q.dtype == DType::Float64) && k.dtype == q.dtype &&
                   v.dtype == q.dtype,
               "[", op, "] expected q, k and v of one dtype, float32 or float64, got ", types);
  const size_t r = q.shape.size();
  LOOM_CHECK_T(ShapeError, r >= 2 && k.shape.size() == r && v.shape.size() == r, "[", op,
               "] expected q [..., L, E], k [..., S, E], v [..., S, Ev] of one rank, got ", types);
  const int64_t group = a.i;
  LOOM_CHECK_T(ShapeError, group >= 1 && (group == 1 || r >= 3), "[", op, "] group ", group,
               " must be >= 1, and 1 unless the operands have a head dim (rank >= 3)");
  bool ok = q.shape[r - 1] == k.shape[r - 1] && k.shape[r - 2] == v.shape[r - 2];
  for (size_t d = 0; d + 2 < r; ++d) {
    const int64_t want = d + 3 == r ? q.shape[d] / group : q.shape[d];
    ok = ok && k.shape[d] == want && v.shape[d] == want;
  }
  if (group > 1) ok = ok && q.shape[r - 3] % group == 0;
  LOOM_CHECK_T(ShapeError, ok, "[", op, "] expected q [..., H, L, E], k [..., H / ", group,
               ", S, E], v [..., H / ", group, ", S, Ev], got ", types);
  if (xs.size() <= mask_at) return;
  const TensorType& m = g.type(xs[mask_at]);
  LOOM_CHECK_T(DTypeError, m.dtype == DType::Bool || m.dtype == q.dtype, "[", op,
               "] mask must be bool or ", q.dtype, ", got ", m);
  Shape scores(q.shape.begin(), q.shape.end() - 1);
  scores.push_back(k.shape[r - 2]);
  bool fits = m.shape.size() <= scores.size();
  for (size_t d = 0; fits && d < m.shape.size(); ++d) {
    const int64_t md = m.shape[m.shape.size() - 1 - d], sd = scores[scores.size() - 1 - d];
    fits = md == 1 || md == sd;
  }
  LOOM_CHECK_T(ShapeError, fits, "[", op, "] mask ", m, " does not broadcast to the scores ",
               TensorType{q.dtype, scores});
  LOOM_CHECK_T(Error, !a.flag, "[", op, "] takes a mask or causal, not both");
}

}  // namespace

std::vector<TensorType> infer_attention(const Graph& g, OpKind op, std::span<const Value> xs,
                                        const Attrs& a) {
  if (op == OpKind::Attention) {
    LOOM_CHECK(xs.size() == 3 || xs.size() == 4,
               "[attention] expected q, k, v and an optional mask, got ", xs.size(), " operands");
    check_attention(g, "attention", xs, 3, a);
    const TensorType &q = g.type(xs[0]), &v = g.type(xs[2]);
    Shape out = q.shape, lse(q.shape.begin(), q.shape.end() - 1);
    out[out.rank() - 1] = v.shape[v.shape.size() - 1];
    return {{q.dtype, out}, {q.dtype, lse}};
  }
  LOOM_CHECK(op == OpKind::AttentionGrad, "[", op_name(op), "] is not an attention op");
  LOOM_CHECK(xs.size() == 6 || xs.size() == 7,
             "[attention_grad] expected q, k, v, lse, delta, dout and an optional mask, got ",
             xs.size(), " operands");
  check_attention(g, "attention_grad", xs, 6, a);
  const TensorType &q = g.type(xs[0]), &v = g.type(xs[2]);
  Shape out = q.shape, lse(q.shape.begin(), q.shape.end() - 1);
  out[out.rank() - 1] = v.shape[v.shape.size() - 1];
  const TensorType want[] = {{q.dtype, lse}, {q.dtype, lse}, {q.dtype, out}};
  for (size_t k = 0; k < 3; ++k)
    LOOM_CHECK_T(ShapeError, g.type(xs[3 + k]) == want[k], "[attention_grad] expected lse, delta ",
                 "and dout of types ", want[0], ", ", want[1], ", ", want[2], ", got ",
                 operand_types(g, xs.subspan(3, 3)));
  return {q, g.type(xs[1]), v};
}

}  // namespace loom::ir::detail
