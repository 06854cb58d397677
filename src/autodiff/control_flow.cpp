// VJPs of the control-flow ops.
//
// call: a call of the body's VJP region (built once per body: the body's forward copied,
// then its backward sweep), so assume_pure's cached body has a cached VJP.
//
// scan: a reverse scan. The forward scan node is extended in place to also stack, per step,
// what the backward needs: by default the residuals (the body's intermediate values that the
// VJP reads, plus the carries it reads), with remat only the carries, from which each backward
// step recomputes its forward. xs are read from the forward's own xs (never copied), captured
// operands are captured again. The backward carries the carries' adjoints and accumulates
// the captured operands' adjoints; its ys are the xs' adjoints.
//
// while: no VJP (its trip count is only known at run time).
#include <algorithm>
#include <unordered_map>

#include "autodiff/autodiff_impl.h"
#include "loom/core/error.h"

namespace loom::autodiff {

using ir::Graph;
using ir::Node;
using ir::NodeId;
using ir::OpKind;
using ir::Value;

namespace {

constexpr NodeId kNone = UINT32_MAX;

// The body's forward copied into a fresh graph after its parameters and one adjoint
// parameter per output, then the backward sweep. forward_end: nodes below it are the copy.
struct Combined {
  std::shared_ptr<Graph> g;
  size_t params = 0, forward_end = 0;
  std::vector<NodeId> from_body;  // per node of g below forward_end: the body node it copies
};

Combined combine(const Graph& body) {
  Combined c;
  c.g = std::make_shared<Graph>();
  ir::Builder b(*c.g);
  std::vector<Value> map(body.size());
  for (NodeId p : body.params()) {
    map[p] = b.parameter(body.node(p).type);
    c.from_body.push_back(p);
  }
  std::vector<Value> seeds, roots;
  for (Value o : body.outputs()) seeds.push_back(b.parameter(body.type(o)));
  c.params = c.g->size();
  c.from_body.resize(c.params, kNone);
  for (NodeId id = 0; id < body.size(); ++id) {
    const Node& n = body.node(id);
    if (n.op == OpKind::Parameter) continue;
    Node copy = n;
    for (Value& v : copy.operands) v = Value{map[v.node].node, v.index};
    map[id] = Value{b.add(std::move(copy)), 0};
    c.from_body.push_back(id);
  }
  c.forward_end = c.g->size();
  std::vector<Value> wrt, fwd_roots, fwd_seeds;
  for (NodeId p : body.params()) wrt.push_back(map[p]);
  for (size_t k = 0; k < body.outputs().size(); ++k) {
    Value o = body.outputs()[k];
    if (!is_floating(body.type(o).dtype)) continue;
    fwd_roots.push_back(Value{map[o.node].node, o.index});
    fwd_seeds.push_back(Value{static_cast<NodeId>(body.params().size() + k), 0});
  }
  std::vector<Adjoint> adj = backward(b, fwd_roots, fwd_seeds, wrt);
  for (size_t k = 0; k < wrt.size(); ++k)
    c.g->outputs().push_back(adj[k] ? *adj[k] : zeros(b, c.g->type(wrt[k])));
  return c;
}

struct RegionMemo {
  std::weak_ptr<const Graph> body;
  std::shared_ptr<const Graph> vjp;
};

Value zeros_or(ir::Builder& b, const Adjoint& a, const TensorType t) {
  return a ? *a : zeros(b, t);
}

// A custom VJP (call with a vjp region): the user's backward on the residuals and the
// outputs' adjoints gives the arguments' adjoints; captures get none.
std::vector<Adjoint> custom_call_vjp(ir::Builder& b, NodeId id, std::span<const Adjoint> radj) {
  const Node n = b.graph().node(id);
  const int64_t n_out = n.attrs.ints[0], n_args = n.attrs.ints[1], n_extra = n.attrs.ints[2];
  std::vector<Value> ops;
  for (uint32_t r = static_cast<uint32_t>(n_out); r < n.num_results(); ++r) ops.push_back({id, r});
  for (uint32_t r = 0; r < static_cast<uint32_t>(n_out); ++r)
    ops.push_back(zeros_or(b, radj[r], n.result_type(r)));
  ops.insert(ops.end(), n.operands.end() - n_extra, n.operands.end());
  std::vector<Value> res = b.make_region(OpKind::Call, ops, {}, {n.regions[1]});
  std::vector<Adjoint> out(n.operands.size());
  for (int64_t k = 0; k < n_args; ++k)
    if (is_floating(b.type(n.operands[k]).dtype)) out[k] = res[k];
  return out;
}

std::vector<Adjoint> call_vjp(ir::Builder& b, NodeId id, std::span<const Adjoint> radj) {
  if (b.graph().node(id).regions.size() == 2) return custom_call_vjp(b, id, radj);
  const Node n = b.graph().node(id);
  std::vector<Value> ops(n.operands.begin(), n.operands.end());
  for (uint32_t r = 0; r < n.num_results(); ++r)
    ops.push_back(zeros_or(b, radj[r], n.result_type(r)));
  std::vector<Value> res = b.make_region(OpKind::Call, ops, {}, {vjp_region(n.regions[0])});
  std::vector<Adjoint> out;
  for (size_t k = 0; k < n.operands.size(); ++k) {
    if (is_floating(b.type(n.operands[k]).dtype))
      out.push_back(res[k]);
    else
      out.push_back(std::nullopt);
  }
  return out;
}

// Stacked extra outputs of a forward scan, appended once per node (the body is replaced by
// one that also returns `extra` values of its own graph).
struct Augmented {
  std::shared_ptr<const Graph> body;  // the augmented body
  size_t first = 0;                   // result index of the first extra output
};

std::vector<Value> augment_scan(ir::Builder& b, NodeId id, const Graph& old_body,
                                const std::vector<Value>& extra) {
  Graph nb = old_body;
  for (Value v : extra) nb.outputs().push_back(v);
  Node& n = b.graph().mutable_node(id);
  const size_t first = n.num_results();
  for (Value v : extra) {
    Shape s = old_body.type(v).shape;
    s.insert(0, n.attrs.i);
    n.more_types.push_back({old_body.type(v).dtype, s});
  }
  n.regions[0] = std::make_shared<const Graph>(std::move(nb));
  b.reindex();  // the node's hash changed
  std::vector<Value> out;
  for (size_t k = 0; k < extra.size(); ++k)
    out.push_back(Value{id, static_cast<uint32_t>(first + k)});
  return out;
}

// scan_vjp's first step: what the backward part (nodes >= forward_end, and the outputs) reads
// of the forward part.
std::vector<uint8_t> backward_reads(const Combined& comb) {
  const Graph& G = *comb.g;
  std::vector<uint8_t> read(comb.forward_end, 0);
  auto mark_reads = [&](Value v) {
    if (v.node < comb.forward_end) read[v.node] = 1;
  };
  for (NodeId i = static_cast<NodeId>(comb.forward_end); i < G.size(); ++i)
    for (Value v : G.node(i).operands) mark_reads(v);
  for (Value v : G.outputs()) mark_reads(v);
  return read;
}

// Whether the backward recomputes the whole forward from the saved carries; if not, cheap
// forward values it reads are marked 2 in `read` (recomputed from what they read).
bool choose_recompute(const Combined& comb, std::vector<uint8_t>& read, bool remat, size_t P,
                      int64_t c, int64_t y) {
  const Graph& G = *comb.g;
  // Saved per step: with remat the carries (each backward step recomputes its forward from
  // them); otherwise the forward values the backward reads (residuals), and the carries it
  // reads. Index, xs and captured operands are bound as they are; constants are copied. A
  // body holding a multi-result node (a nested loop) is recomputed, as with remat.
  bool recompute = remat;
  for (NodeId i = static_cast<NodeId>(P + c + y); i < comb.forward_end; ++i)
    recompute = recompute || G.node(i).num_results() != 1;
  // Cheap forward values (elementwise and layout ops) are recomputed in the backward from
  // what they read rather than stacked: a stack costs a write and a read of the whole value per
  // step, more than recomputing, say, a gelu's erf. Products, reductions, indexing and random
  // draws are saved. `read` grows from the backward's reads down through cheap nodes.
  if (!recompute) {
    for (NodeId i = static_cast<NodeId>(comb.forward_end); i-- > static_cast<NodeId>(P + c + y);) {
      if (!read[i]) continue;
      const ir::Node& fn = G.node(i);
      const uint32_t t = ir::info(fn.op).traits;
      const bool cheap = (t & (ir::kElementwise | ir::kLayout)) && !(t & ir::kRandom);
      if (!cheap) continue;
      read[i] = 2;  // recomputed: its operands are what the backward needs
      for (Value v : fn.operands)
        if (v.node < comb.forward_end && !read[v.node]) read[v.node] = 1;
    }
  }
  return recompute;
}

// The values of the body the forward scan stacks per step (saved_body), and the node of the
// combined graph each stands for (saved_of).
void choose_saved(const Combined& comb, const std::vector<uint8_t>& read, bool recompute, size_t P,
                  int64_t c, int64_t y, std::vector<Value>& saved_body,
                  std::vector<NodeId>& saved_of) {
  const Graph& G = *comb.g;
  for (NodeId i = 0; i < comb.forward_end; ++i) {
    if (i >= P && i < P + c + y) continue;  // adjoint parameters
    const bool is_carry = i >= 1 && i <= static_cast<NodeId>(c);
    if (i < P) {
      if (!is_carry || !(recompute || read[i])) continue;
    } else if (recompute || read[i] != 1 || G.node(i).op == OpKind::Constant ||
               G.node(i).op == OpKind::Iota) {
      continue;
    }
    saved_body.push_back(Value{comb.from_body[i], 0});
    saved_of.push_back(i);
  }
}

// The reverse scan's body: [index, carry adjoints, captured accumulators, saved slices, x slices,
// ys adjoint slices, captured] in; carry adjoints, accumulated captured adjoints, xs adjoints out.
std::shared_ptr<Graph> backward_body(const Graph& body, const Combined& comb,
                                     const std::vector<Value>& saved_body,
                                     const std::vector<NodeId>& saved_of, int64_t c, int64_t x,
                                     int64_t y, int64_t k) {
  auto param = [&](int64_t i) { return body.params()[static_cast<size_t>(i)]; };  // 0: index
  const Graph& G = *comb.g;
  const size_t P = body.params().size();
  auto bb = std::make_shared<Graph>();
  ir::Builder bw(*bb);
  Value idx = bw.parameter(G.node(0).type);
  std::vector<Value> adj_c, acc, saved_p, xs_p, adj_y, cap;
  for (int64_t i = 0; i < c; ++i) adj_c.push_back(bw.parameter(body.type(body.outputs()[i])));
  for (int64_t i = 0; i < k; ++i) acc.push_back(bw.parameter(body.node(param(1 + c + x + i)).type));
  for (Value v : saved_body) saved_p.push_back(bw.parameter(body.type(v)));
  for (int64_t i = 0; i < x; ++i) xs_p.push_back(bw.parameter(body.node(param(1 + c + i)).type));
  for (int64_t i = 0; i < y; ++i) adj_y.push_back(bw.parameter(body.type(body.outputs()[c + i])));
  for (int64_t i = 0; i < k; ++i) cap.push_back(bw.parameter(body.node(param(1 + c + x + i)).type));

  std::vector<Value> map(G.size(), Value{kNone, 0});
  for (size_t s = 0; s < saved_of.size(); ++s) map[saved_of[s]] = saved_p[s];
  map[0] = idx;
  for (int64_t i = 0; i < x; ++i) map[1 + c + i] = xs_p[i];
  for (int64_t i = 0; i < k; ++i) map[1 + c + x + i] = cap[i];
  for (int64_t i = 0; i < c + y; ++i) map[P + i] = i < c ? adj_c[i] : adj_y[i - c];
  // Copy what the backward needs: the backward part, and forward nodes not saved (remat, or
  // constants), recomputed from what is bound.
  for (NodeId i = static_cast<NodeId>(P + c + y); i < G.size(); ++i) {
    if (map[i].node != kNone) continue;
    Node copy = G.node(i);
    bool ok = true;
    for (Value& v : copy.operands) {
      ok = ok && map[v.node].node != kNone;
      if (ok) v = Value{map[v.node].node, v.index};
    }
    if (!ok) continue;  // depends on a forward value neither saved nor needed
    map[i] = Value{bw.add(std::move(copy)), 0};
  }
  auto mapped = [&](Value v) {
    LOOM_ASSERT(map[v.node].node != kNone);
    return Value{map[v.node].node, v.index};
  };
  std::vector<Value> outs;
  for (int64_t i = 0; i < c; ++i) outs.push_back(mapped(G.outputs()[1 + i]));
  for (int64_t i = 0; i < k; ++i) {
    Value a = mapped(G.outputs()[1 + c + x + i]);
    outs.push_back(is_floating(bw.type(a).dtype) ? bw.binary(OpKind::Add, acc[i], a) : acc[i]);
  }
  for (int64_t i = 0; i < x; ++i) outs.push_back(mapped(G.outputs()[1 + c + i]));
  // Only what the outputs need (parameters stay: they are the region's signature).
  std::vector<Value> roots = outs;
  for (NodeId p : bb->params()) roots.push_back(Value{p, 0});
  Graph pruned = ir::prune(*bb, roots);
  pruned.outputs().resize(outs.size());
  bb = std::make_shared<Graph>(std::move(pruned));
  return bb;
}

std::vector<Adjoint> scan_vjp(ir::Builder& b, NodeId id, std::span<const Adjoint> radj) {
  const Node n = b.graph().node(id);
  const Graph& body = *n.regions[0];
  const ir::ScanAttrs attrs = ir::ScanAttrs::of(n);
  const int64_t c = attrs.counts[0], x = attrs.counts[1], L = attrs.length;
  const int64_t k = static_cast<int64_t>(n.operands.size()) - c - x;
  // The body's own outputs, before any augmentation (carries, then ys).
  const int64_t y = static_cast<int64_t>(body.outputs().size()) - c;
  Combined comb = combine(body);
  const size_t P = body.params().size();

  std::vector<uint8_t> read = backward_reads(comb);
  const bool recompute = choose_recompute(comb, read, attrs.remat != 0, P, c, y);
  std::vector<Value> saved_body;  // values of the body to stack
  std::vector<NodeId> saved_of;   // the node of comb.g each stands for
  choose_saved(comb, read, recompute, P, c, y, saved_body, saved_of);
  std::vector<Value> stacks = augment_scan(b, id, body, saved_body);
  std::shared_ptr<Graph> bb = backward_body(body, comb, saved_body, saved_of, c, x, y, k);

  // The reverse scan's operands.
  std::vector<Value> ops;
  for (int64_t i = 0; i < c; ++i) ops.push_back(zeros_or(b, radj[i], n.result_type(i)));
  for (int64_t i = 0; i < k; ++i) ops.push_back(zeros(b, b.type(n.operands[c + x + i])));
  for (Value s : stacks) ops.push_back(s);
  for (int64_t i = 0; i < x; ++i) ops.push_back(n.operands[c + i]);
  for (int64_t i = 0; i < y; ++i) ops.push_back(zeros_or(b, radj[c + i], n.result_type(c + i)));
  for (int64_t i = 0; i < k; ++i) ops.push_back(n.operands[c + x + i]);
  ir::Attrs a;
  a.ints = {c + k, static_cast<int64_t>(stacks.size()) + x + y};
  a.i = L;
  a.flag = !n.attrs.flag;
  std::vector<Value> r = b.make_region(OpKind::Scan, ops, a, {bb});
  std::vector<Adjoint> out;
  for (int64_t i = 0; i < c; ++i) out.push_back(r[i]);
  for (int64_t i = 0; i < x; ++i) out.push_back(r[c + k + i]);
  for (int64_t i = 0; i < k; ++i) out.push_back(r[c + i]);
  for (size_t i = 0; i < out.size(); ++i)
    if (!is_floating(b.type(n.operands[i]).dtype)) out[i].reset();
  return out;
}

}  // namespace

std::shared_ptr<const Graph> vjp_region(const std::shared_ptr<const Graph>& body) {
  thread_local std::unordered_map<const Graph*, RegionMemo> memo;
  auto it = memo.find(body.get());
  if (it != memo.end() && it->second.body.lock() == body) return it->second.vjp;
  Combined c = combine(*body);
  std::shared_ptr<const Graph> r = c.g;
  if (memo.size() > 1024) memo.clear();
  memo[body.get()] = RegionMemo{body, r};
  return r;
}

namespace detail {

std::vector<Adjoint> control_flow_vjp(ir::Builder& b, NodeId id, std::span<const Adjoint> radj) {
  switch (b.graph().node(id).op) {
    case OpKind::Call: return call_vjp(b, id, radj);
    case OpKind::Scan: return scan_vjp(b, id, radj);
    case OpKind::While:
      throw AutodiffError(
          "[while_loop] reverse-mode autodiff through a while loop is not supported: its trip "
          "count is only known at run time. Use fori_loop with integer bounds (a scan) or scan");
    default: break;
  }
  LOOM_ASSERT(false);
  return {};
}

}  // namespace detail
}  // namespace loom::autodiff
