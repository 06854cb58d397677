// The VJP rules, one per op of ops.def, and the backward sweep. Each rule gets the node, its
// operands and results (values of the same graph) and the adjoint of each result, and
// returns the adjoint of each operand with the operand's type.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_map>

#include "autodiff/autodiff_impl.h"
#include "loom/core/error.h"
#include "loom/core/host_callback.h"

namespace loom::autodiff {

using ir::OpKind;
using ir::Value;

namespace {

struct Ctx {
  ir::Builder& b;
  const ir::Node& n;  // the graph's node: appending nodes never moves it (ir::NodeStore)
  Value g;            // adjoint of result 0
  Value x(size_t k) const { return n.operands[k]; }
  const TensorType& t(Value v) const { return b.type(v); }
  Value y() const { return Value{id, 0}; }
  ir::NodeId id;
  Value c(double v) const { return b.constant(v, t(g).dtype); }
  Value mul(Value a, Value c2) { return b.binary(OpKind::Mul, a, c2); }
  Value div(Value a, Value c2) { return b.binary(OpKind::Div, a, c2); }
  Value add(Value a, Value c2) { return b.binary(OpKind::Add, a, c2); }
  Value sub(Value a, Value c2) { return b.binary(OpKind::Sub, a, c2); }
  Value neg(Value a) { return b.unary(OpKind::Neg, a); }
  Value where(Value cond, Value a, Value c2) { return b.where(cond, a, c2); }
  Value cmp(OpKind op, Value a, Value c2) { return b.binary(op, a, c2); }
  Value zero_like(Value v) { return b.expand(c(0), t(v).shape); }
  Value to_shape(size_t k, Value grad) { return unbroadcast(b, grad, Shape(t(x(k)).shape)); }
};

std::vector<int64_t> keep_shape(const Shape& in, const std::vector<int64_t>& axes) {
  std::vector<int64_t> s(in.begin(), in.end());
  for (int64_t a : axes) s[static_cast<size_t>(a)] = 1;
  return s;
}

// The adjoint of slice(x, axis, start, end, step): g placed back at its positions, zeros
// elsewhere, built from concatenations (no scatter op).
Value unslice(ir::Builder& b, Value g, const Shape& xs, int64_t axis, int64_t start, int64_t end,
              int64_t step) {
  const TensorType gt = b.type(g);
  const int64_t n = gt.shape[axis], len = xs[axis];
  auto zeros_with = [&](int64_t extent) {
    Shape s = gt.shape;
    s[axis] = extent;
    return zeros(b, {gt.dtype, s});
  };
  Value spread = g;
  if (step > 1 && n > 0) {
    // [.., n, ..] -> [.., n, step, ..] with zeros after each element, then merged and cut.
    Shape with(gt.shape.begin(), gt.shape.end());
    with.insert(static_cast<size_t>(axis) + 1, 1);
    Value g1 = b.reshape(g, with);
    Shape zs = with;
    zs[axis + 1] = step - 1;
    Value parts[] = {g1, zeros(b, {gt.dtype, zs})};
    Value inter = b.concat(parts, axis + 1);
    Shape merged = gt.shape;
    merged[axis] = n * step;
    spread = b.slice(b.reshape(inter, merged), axis, 0, (n - 1) * step + 1, 1);
  }
  const int64_t covered = n == 0 ? 0 : (n - 1) * step + 1;
  std::vector<Value> parts;
  if (start > 0) parts.push_back(zeros_with(start));
  if (n > 0) parts.push_back(spread);
  const int64_t after = len - start - covered;
  if (after > 0) parts.push_back(zeros_with(after));
  (void)end;
  if (parts.empty()) return zeros(b, {gt.dtype, xs});
  return b.concat(parts, axis);
}

std::vector<Adjoint> elementwise_rule(Ctx& c) {
  const OpKind op = c.n.op;
  switch (op) {
    case OpKind::Neg: return {c.neg(c.g)};
    case OpKind::Abs: {
      Value x = c.x(0);
      Value sign = c.where(c.cmp(OpKind::Gt, x, c.c(0)), c.c(1),
                           c.where(c.cmp(OpKind::Lt, x, c.c(0)), c.c(-1), c.c(0)));
      return {c.mul(c.g, sign)};
    }
    case OpKind::Exp: return {c.mul(c.g, c.y())};
    case OpKind::Log: return {c.div(c.g, c.x(0))};
    case OpKind::Sqrt: return {c.div(c.g, c.mul(c.y(), c.c(2)))};
    case OpKind::Tanh: return {c.mul(c.g, c.sub(c.c(1), c.mul(c.y(), c.y())))};
    case OpKind::Sin: return {c.mul(c.g, c.b.unary(OpKind::Cos, c.x(0)))};
    case OpKind::Cos: return {c.neg(c.mul(c.g, c.b.unary(OpKind::Sin, c.x(0))))};
    case OpKind::Erf: {
      Value x = c.x(0);
      Value e = c.b.unary(OpKind::Exp, c.neg(c.mul(x, x)));
      return {c.mul(c.g, c.mul(e, c.c(2.0 / std::sqrt(M_PI))))};
    }
    case OpKind::Convert: {
      const TensorType in = c.t(c.x(0));
      if (!is_floating(in.dtype) || !is_floating(c.t(c.g).dtype)) return {std::nullopt};
      return {c.b.convert(c.g, in.dtype)};
    }
    case OpKind::Add: return {c.to_shape(0, c.g), c.to_shape(1, c.g)};
    case OpKind::Sub: return {c.to_shape(0, c.g), c.to_shape(1, c.neg(c.g))};
    case OpKind::Mul: return {c.to_shape(0, c.mul(c.g, c.x(1))), c.to_shape(1, c.mul(c.g, c.x(0)))};
    case OpKind::Div:
      return {c.to_shape(0, c.div(c.g, c.x(1))),
              c.to_shape(1, c.neg(c.div(c.mul(c.g, c.y()), c.x(1))))};
    case OpKind::Rem:  // y = a - trunc(a / b) * b, the quotient read back as (a - y) / b
      return {c.to_shape(0, c.g),
              c.to_shape(1, c.neg(c.mul(c.g, c.div(c.sub(c.x(0), c.y()), c.x(1)))))};
    case OpKind::Pow: {
      Value a = c.x(0), p = c.x(1);
      Value da = c.mul(c.g, c.mul(p, c.b.binary(OpKind::Pow, a, c.sub(p, c.c(1)))));
      // d/dp a^p = a^p log a; 0 where a == 0 and p >= 0 (as PyTorch).
      Value lg = c.mul(c.y(), c.b.unary(OpKind::Log, a));
      Value zero_base =
          c.b.binary(OpKind::And, c.cmp(OpKind::Eq, a, c.c(0)), c.cmp(OpKind::Ge, p, c.c(0)));
      Value dp = c.mul(c.g, c.where(zero_base, c.c(0), lg));
      return {c.to_shape(0, da), c.to_shape(1, dp)};
    }
    case OpKind::Maximum:
    case OpKind::Minimum: {
      // The larger (smaller) operand takes the gradient; ties split it evenly, and a nan
      // (unordered) passes it to both, as PyTorch.
      Value a = c.x(0), bb = c.x(1);
      OpKind loses = op == OpKind::Maximum ? OpKind::Lt : OpKind::Gt;
      Value half = c.mul(c.g, c.c(0.5));
      Value tie = c.cmp(OpKind::Eq, a, bb);
      Value ga = c.where(tie, half, c.where(c.cmp(loses, a, bb), c.c(0), c.g));
      Value gb = c.where(tie, half, c.where(c.cmp(loses, bb, a), c.c(0), c.g));
      return {c.to_shape(0, ga), c.to_shape(1, gb)};
    }
    case OpKind::Where:
      return {std::nullopt, c.to_shape(1, c.where(c.x(0), c.g, c.c(0))),
              c.to_shape(2, c.where(c.x(0), c.c(0), c.g))};
    default: break;
  }
  LOOM_ASSERT(false);
  return {};
}

std::vector<Adjoint> reduce_rule(Ctx& c) {
  const ir::Node& n = c.n;
  const Shape xs = c.t(c.x(0)).shape;
  std::vector<int64_t> axes(n.attrs.ints.begin(), n.attrs.ints.end());
  Shape kept(keep_shape(xs, axes));
  Value g = c.b.expand(c.b.reshape(c.g, kept), xs);
  if (n.op == OpKind::ReduceSum) return {g};
  // max / min: the elements equal to the result share the gradient evenly.
  Value y = c.b.expand(c.b.reshape(c.y(), kept), xs);
  Value hit = c.b.convert(c.cmp(OpKind::Eq, c.x(0), y), c.t(c.g).dtype);
  Value count = c.b.expand(c.b.reduce(OpKind::ReduceSum, hit, axes, true), xs);
  return {c.div(c.mul(g, hit), count)};
}

Value transpose_last(ir::Builder& b, Value v) {
  size_t r = b.type(v).shape.size();
  std::vector<int64_t> perm(r);
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[r - 1], perm[r - 2]);
  return b.permute(v, perm);
}

std::vector<Adjoint> layout_rule(Ctx& c) {
  const ir::Node& n = c.n;
  const Shape xs = c.t(c.x(0)).shape;
  switch (n.op) {
    case OpKind::Reshape: return {c.b.reshape(c.g, xs)};
    case OpKind::Permute: {
      // The adjoint of a transposed weight is often a fresh product: (X Y)^T = Y^T X^T, read by
      // BLAS with transpose flags instead of a strided copy.
      const ir::Node& gn = c.b.graph().node(c.g.node);
      if (n.attrs.ints.size() == 2 && n.attrs.ints[0] == 1 && gn.op == OpKind::MatMul &&
          gn.type.shape.size() == 2) {
        Value x = gn.operands[0], y = gn.operands[1];
        return {c.b.matmul(transpose_last(c.b, y), transpose_last(c.b, x))};
      }
      std::vector<int64_t> inv(n.attrs.ints.size());
      for (size_t i = 0; i < inv.size(); ++i)
        inv[static_cast<size_t>(n.attrs.ints[i])] = static_cast<int64_t>(i);
      return {c.b.permute(c.g, inv)};
    }
    case OpKind::Expand: return {unbroadcast(c.b, c.g, xs)};
    case OpKind::Slice:
      return {unslice(c.b, c.g, xs, n.attrs.i, n.attrs.ints[0], n.attrs.ints[1], n.attrs.ints[2])};
    case OpKind::Concat: {
      std::vector<Adjoint> r;
      int64_t off = 0;
      for (Value v : n.operands) {
        int64_t len = c.t(v).shape[n.attrs.i];
        r.push_back(c.b.slice(c.g, n.attrs.i, off, off + len, 1));
        off += len;
      }
      return r;
    }
    default: break;
  }
  LOOM_ASSERT(false);
  return {};
}

std::vector<Adjoint> index_rule(Ctx& c) {
  ir::Builder& b = c.b;
  const ir::Node& n = c.n;
  const TensorType xt = c.t(c.x(0));
  const TensorType it = c.t(c.x(1));
  const int64_t axis = n.attrs.i;
  const int64_t C = xt.shape[axis];
  if (n.op == OpKind::IndexSelect) {
    // dx: g's slices added into zeros at their indices (repeated indices accumulate).
    Value zeros = b.expand(b.constant(0, xt.dtype), xt.shape);
    return {b.index_add(zeros, axis, c.x(1), c.g), std::nullopt};
  }
  if (n.op == OpKind::IndexAdd) {  // d base = g; d src = g's slices at the indices
    return {c.g, std::nullopt, b.index_select(c.g, axis, c.x(1))};
  }
  // gather: dx[.., c, ..] = sum_k g[.., k, ..] * (idx[.., k, ..] == c), then zeros up to x's
  // extents off the axis (the index may be smaller there).
  Shape with(it.shape.begin(), it.shape.end());
  with.insert(static_cast<size_t>(axis) + 1, 1);
  Shape full = with;
  full[axis + 1] = C;
  Value idx = b.expand(b.reshape(c.x(1), with), full);
  Value hit = b.binary(OpKind::Eq, idx, b.iota({it.dtype, full}, axis + 1));
  Value g = b.expand(b.reshape(c.g, with), full);
  Value d = b.reduce(OpKind::ReduceSum, b.where(hit, g, b.constant(0, xt.dtype)), {axis}, false);
  for (size_t dim = 0; dim < xt.shape.size(); ++dim) {
    Shape cur = b.type(d).shape;
    if (cur[dim] == xt.shape[dim]) continue;
    Shape pad = cur;
    pad[dim] = xt.shape[dim] - cur[dim];
    Value parts[] = {d, zeros(b, {xt.dtype, pad})};
    d = b.concat(parts, static_cast<int64_t>(dim));
  }
  return {d, std::nullopt};
}

// The collectives' adjoints (ops.def). The objective is the sum of the ranks' objectives, so
// y = all_reduce_sum(x) gives dx = all_reduce_sum(dy) and all_gather and reduce_scatter_sum
// are each other's adjoints; with `replicated` (every rank computes the same objective from y)
// the adjoint is the rank's own share: dy itself, or its own block of an all_gather, written
// reduce_scatter_sum(dy) / world so that the graph does not depend on the rank.
std::vector<Adjoint> dist_rule(Ctx& c) {
  const ir::Node& n = c.n;
  ir::Attrs a;
  a.i = n.attrs.i;
  a.ints = n.attrs.ints;
  auto make = [&](OpKind op, Value v, bool replicated = false) {
    ir::Attrs at = a;
    at.flag = replicated;
    return c.b.make(op, std::span<const Value>(&v, 1), std::move(at));
  };
  const double world = static_cast<double>(n.attrs.i);
  switch (n.op) {
    case OpKind::AllReduceSum: return {n.attrs.flag ? c.g : make(OpKind::AllReduceSum, c.g)};
    case OpKind::AllReduceMax:
    case OpKind::AllReduceMin: {  // the ranks holding the extreme (all of them on a tie)
      Value hit = c.b.convert(c.cmp(OpKind::Eq, c.x(0), c.y()), c.t(c.g).dtype);
      return {c.mul(make(OpKind::AllReduceSum, c.g), hit)};
    }
    case OpKind::AllGather: {
      Value d = make(OpKind::ReduceScatterSum, c.g);
      return {n.attrs.flag ? c.div(d, c.c(world)) : d};
    }
    case OpKind::ReduceScatterSum: return {make(OpKind::AllGather, c.g)};
    case OpKind::Shard: {  // the adjoint takes the value's layout (a parameter's gradient too)
      ir::Attrs at = n.attrs;
      at.flag = false;
      return {c.b.make(OpKind::Shard, std::span<const Value>(&c.g, 1), std::move(at))};
    }
    case OpKind::GradAllReduce: {
      ir::Attrs at;
      at.i = n.attrs.i;
      at.flag = true;
      return {c.b.make(OpKind::AllReduceSum, std::span<const Value>(&c.g, 1), std::move(at))};
    }
    default: LOOM_ASSERT(false);
  }
  return {};
}

// attention's operands' adjoints: one attention_grad node for q, k and v (it recomputes the
// scores block by block from the saved log-sum-exp; the log-sum-exp's own adjoint enters as
// delta's second term) and, for an additive mask, the scores' gradient written out (dead code
// unless the mask needs its adjoint).
std::vector<Adjoint> attention_rule(ir::Builder& b, ir::NodeId id,
                                    std::span<const Adjoint> result_adjoints) {
  const ir::Node& n = b.graph().node(id);
  if (n.op == OpKind::AttentionGrad)
    throw AutodiffError(
        "[attention_grad] the fused attention has no second derivative; compute the "
        "scores with matmul and softmax to differentiate twice");
  const Value q = n.operands[0], k = n.operands[1], v = n.operands[2];
  const Value out{id, 0}, lse{id, 1};
  const int64_t last = static_cast<int64_t>(b.type(out).shape.size()) - 1;
  const Value g = result_adjoints[0] ? *result_adjoints[0] : zeros(b, b.type(out));
  Value delta = b.reduce(OpKind::ReduceSum, b.binary(OpKind::Mul, g, out), {last}, false);
  if (result_adjoints.size() > 1 && result_adjoints[1])
    delta = b.binary(OpKind::Sub, delta, *result_adjoints[1]);
  std::vector<Value> operands = {q, k, v, lse, delta, g};
  const bool masked = n.operands.size() == 4;
  if (masked) operands.push_back(n.operands[3]);
  const ir::Attrs attrs = n.attrs;
  std::vector<Value> d = b.make_region(OpKind::AttentionGrad, operands, attrs, {});
  std::vector<Adjoint> r = {d[0], d[1], d[2]};
  if (!masked) return r;
  const Value mask = n.operands[3];
  const TensorType mt = b.type(mask);
  r.emplace_back();
  if (!is_floating(mt.dtype)) return r;
  // ds = p * (dout v^T - rowsum(dout * out)), p = exp(s - lse) (0 where lse is -inf)
  auto heads = [&](Value x) {  // k or v with each head repeated `group` times
    const int64_t group = attrs.i;
    if (group == 1) return x;
    Shape s = b.type(x).shape, grown = s;
    const size_t h = s.size() - 3;
    grown.insert(h + 1, group);
    Shape with = s;
    with.insert(h + 1, 1);
    s[h] *= group;
    return b.reshape(b.expand(b.reshape(x, with), grown), s);
  };
  const DType dt = b.type(q).dtype;
  Value s =
      b.binary(OpKind::Mul, b.matmul(q, transpose_last(b, heads(k))), b.constant(attrs.f, dt));
  s = b.binary(OpKind::Add, s, mask);
  Shape lse_col = b.type(lse).shape;
  lse_col.push_back(1);
  const Value l = b.reshape(lse, lse_col);
  const Value inf = b.constant(-std::numeric_limits<double>::infinity(), dt);
  Value p = b.unary(OpKind::Exp, b.binary(OpKind::Sub, s, l));
  p = b.where(b.binary(OpKind::Eq, l, inf), b.constant(0, dt), p);
  const Value dp = b.matmul(g, transpose_last(b, heads(v)));
  const Value ds = b.binary(OpKind::Mul, p, b.binary(OpKind::Sub, dp, b.reshape(delta, lse_col)));
  r.back() = unbroadcast(b, ds, mt.shape);
  return r;
}

}  // namespace

Value zeros(ir::Builder& b, const TensorType t) {
  return b.expand(b.constant(0, t.dtype), t.shape);
}

Value unbroadcast(ir::Builder& b, Value g, const Shape shape) {
  const Shape gs = b.type(g).shape;
  if (gs == shape) return g;
  const size_t lead = gs.size() - shape.size();
  std::vector<int64_t> axes;
  for (size_t d = 0; d < gs.size(); ++d)
    if (d < lead || (shape[d - lead] == 1 && gs[d] != 1)) axes.push_back(static_cast<int64_t>(d));
  // Summing over leading rows (a bias's gradient) as ones[1, rows] @ g[rows, cols]: one
  // matrix-vector product instead of a strided reduction over columns.
  bool leading = !axes.empty() && is_floating(b.type(g).dtype);
  for (size_t k = 0; leading && k < axes.size(); ++k) leading = axes[k] == static_cast<int64_t>(k);
  int64_t rows = 1;
  for (int64_t a : axes) rows *= gs[static_cast<size_t>(a)];
  if (leading && rows >= 256) {
    const int64_t cols = gs.numel() / rows;
    Value ones = b.expand(b.constant(1, b.type(g).dtype), Shape{1, rows});
    Value r = b.matmul(ones, b.reshape(g, Shape{rows, cols}));
    return b.reshape(r, shape);
  }
  Value s = axes.empty() ? g : b.reduce(OpKind::ReduceSum, g, axes, true);
  return b.reshape(s, shape);
}

// From ops.def's traits: a new op is differentiable unless marked kNoGrad, and then needs
// a rule below (the registry test checks that every differentiable op has one).
RuleKind rule_kind(OpKind op) {
  if (ir::has_trait(op, ir::kNoGrad)) return RuleKind::NotDifferentiable;
  if (ir::has_trait(op, ir::kRegion)) return RuleKind::ControlFlow;
  return RuleKind::Differentiable;
}

std::vector<Adjoint> vjp(ir::Builder& b, ir::NodeId id, std::span<const Adjoint> result_adjoints) {
  const ir::Node& n = b.graph().node(id);  // stays put while rules append nodes
  const RuleKind kind = rule_kind(n.op);
  // Before the dtype test: a loop's first result may be an integer counter beside float ones.
  if (kind == RuleKind::ControlFlow) return detail::control_flow_vjp(b, id, result_adjoints);
  if (n.op == OpKind::PureCallback) {
    // Host code has no derivative loom can see: its VJP is the user's (custom_vjp, which
    // pure_callback's vjp= builds); reaching the bare op with a gradient is an error.
    bool needed = false, floating = false;
    for (const Adjoint& a : result_adjoints) needed = needed || a.has_value();
    for (Value v : n.operands) floating = floating || is_floating(b.type(v).dtype);
    if (needed && floating)
      throw AutodiffError(loom::detail::str_cat(
          "[pure_callback] the host callback '", loom::detail::host_callback_name(n.attrs.i),
          "' has no VJP: give pure_callback a vjp (vjp= in Python, "
          "CallbackOptions::vjp in C++) or wrap it in custom_vjp"));
    return std::vector<Adjoint>(n.operands.size());
  }
  if (kind == RuleKind::NotDifferentiable || !is_floating(n.type.dtype))
    return std::vector<Adjoint>(n.operands.size());
  if (ir::has_trait(n.op, ir::kMultiResult)) return attention_rule(b, id, result_adjoints);
  LOOM_ASSERT(result_adjoints.size() == 1 && result_adjoints[0]);
  Ctx c{b, n, *result_adjoints[0], id};
  std::vector<Adjoint> r;
  const uint32_t traits = ir::info(n.op).traits;
  if (n.op == OpKind::MatMul) {
    const Shape as = c.t(c.x(0)).shape;
    const Shape bs = c.t(c.x(1)).shape;
    Value da = b.matmul(c.g, transpose_last(b, c.x(1)));
    Value db;
    if (bs.size() == 2 && as.size() > 2) {
      // A batched against one B (x @ W): dB = A^T g over all rows at once, one product
      // instead of a batch of them and a sum.
      const int64_t k = as.back(), cols = bs.back();
      int64_t rows = 1;  // not numel / k: k may be 0
      for (size_t d = 0; d + 1 < as.size(); ++d) rows *= as[d];
      Value a2 = b.reshape(c.x(0), Shape{rows, k});
      Value g2 = b.reshape(c.g, Shape{rows, cols});
      db = b.matmul(transpose_last(b, a2), g2);
    } else {
      db = unbroadcast(b, b.matmul(transpose_last(b, c.x(0)), c.g), bs);
    }
    r = {unbroadcast(b, da, as), db};
  } else if (traits & ir::kElementwise) {
    r = elementwise_rule(c);
  } else if (traits & ir::kReduce) {
    r = reduce_rule(c);
  } else if (traits & ir::kLayout) {
    r = layout_rule(c);
  } else if (traits & ir::kIndex) {
    r = index_rule(c);
  } else if (traits & ir::kDist) {
    r = dist_rule(c);
  } else {
    LOOM_ASSERT(false);
  }
  // Integer operands (an index, a where condition) take no adjoint.
  for (size_t k = 0; k < r.size(); ++k)
    if (r[k] && !is_floating(b.type(n.operands[k]).dtype)) r[k].reset();
  return r;
}

std::vector<Adjoint> backward(ir::Builder& b, std::span<const Value> roots,
                              std::span<const Value> seeds, std::span<const Value> wrt,
                              const std::vector<uint8_t>* active) {
  const ir::Graph& g = b.graph();
  std::unordered_map<uint64_t, Value> adj;
  auto key = [](Value v) { return (static_cast<uint64_t>(v.node) << 32) | v.index; };
  auto accumulate = [&](Value v, Value a) {
    auto [it, fresh] = adj.emplace(key(v), a);
    if (!fresh) it->second = b.binary(OpKind::Add, it->second, a);
  };
  ir::NodeId top = 0;
  for (size_t k = 0; k < roots.size(); ++k) {
    accumulate(roots[k], seeds[k]);
    top = std::max(top, roots[k].node);
  }
  std::vector<uint8_t> stop(g.size(), 0);
  for (Value w : wrt) stop[w.node] = 1;
  for (ir::NodeId id = top + 1; id-- > 0;) {
    if (stop[id] || (active && (id >= active->size() || !(*active)[id]))) continue;
    const uint32_t results = static_cast<uint32_t>(g.node(id).num_results());
    std::vector<Adjoint> radj(results);
    bool any = false;
    for (uint32_t r = 0; r < results; ++r) {
      auto it = adj.find(key({id, r}));
      if (it != adj.end()) {
        radj[r] = it->second;
        any = true;
      }
    }
    if (!any || g.node(id).op == OpKind::Parameter) continue;
    if (results == 1 && rule_kind(g.node(id).op) != RuleKind::ControlFlow && !radj[0]) continue;
    std::vector<Adjoint> oadj = vjp(b, id, radj);
    // accumulate appends nodes, which never moves this one (ir::NodeStore).
    const auto& operands = b.graph().node(id).operands;
    for (size_t k = 0; k < oadj.size(); ++k)
      if (oadj[k]) accumulate(operands[k], *oadj[k]);
  }
  std::vector<Adjoint> out;
  for (Value w : wrt) {
    auto it = adj.find(key(w));
    out.push_back(it == adj.end() ? Adjoint{} : Adjoint{it->second});
  }
  return out;
}

}  // namespace loom::autodiff
