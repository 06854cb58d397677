// Algebraic simplification. The graph is rebuilt front to back; each node, its operands
// already simplified, is matched against the rules below, so chains (neg(neg(neg(neg x))))
// collapse in one pass. A rule fires only when the replacement has the node's exact type:
// x + 0 with the 0 broadcast to a bigger shape is not x. Replaced nodes are left for DCE.
#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>
#include <vector>

#include "loom/ir/builder.h"
#include "passes/passes_impl.h"

namespace loom::passes::detail {

namespace {

using ir::Graph;
using ir::Node;
using ir::OpKind;
using ir::Value;

class Simplifier {
 public:
  // probe: match the rules against `out` without building anything (a rule that fires
  // returns a placeholder value), to learn whether any fires at all.
  explicit Simplifier(Graph& out, bool probe = false)
      : out_(out), b_(out, /*hash_cons=*/false), probe_(probe) {}

  // Returns the simplified value of node `n` (operands already mapped into out_), or nullopt.
  std::optional<Value> rewrite(const Node& n) {
    if (ir::has_trait(n.op, ir::kElementwise)) {
      if (auto v = fold(n)) return v;
    }
    const Value* x = n.operands.data();
    switch (n.op) {
      case OpKind::Add:
        if (is_zero(x[1]) && has_type(x[0], n)) return x[0];  // x + 0 -> x (-0 + 0 is +0)
        if (is_zero(x[0]) && has_type(x[1], n)) return x[1];  // 0 + x -> x
        return sum_of_concats(n);
      case OpKind::Sub:
        if (is_constant(x[1], 0) && has_type(x[0], n)) return x[0];  // x - 0 -> x
        break;
      case OpKind::Mul:
        if (is_constant(x[1], 1) && has_type(x[0], n)) return x[0];  // x * 1 -> x
        if (is_constant(x[0], 1) && has_type(x[1], n)) return x[1];  // 1 * x -> x
        break;
      case OpKind::Div:
        if (is_constant(x[1], 1) && has_type(x[0], n)) return x[0];  // x / 1 -> x
        break;
      case OpKind::Neg:
        if (const Node* p = producer(x[0], OpKind::Neg)) return p->operands[0];  // -(-x) -> x
        break;
      case OpKind::Convert:
      case OpKind::Expand:
        if (has_type(x[0], n)) return x[0];  // convert(x: d) to d -> x; expand(x) to x.shape -> x
        break;
      case OpKind::Reshape:
        if (auto v = reshape(n)) return v;
        return flat_product(n);
      case OpKind::Permute:
        if (auto v = permute(n)) return v;
        return transposed_product(n);
      case OpKind::GradAllReduce: return x[0];  // grad_all_reduce(x) -> x: only its VJP differs
      case OpKind::Where: return relu_mask(n);
      default: break;
    }
    return std::nullopt;
  }

  static constexpr int32_t kUnknownUses = 1 << 30;

  // How many readers node `id` of out_ has (operands and outputs), where known: a node kept
  // from the input graph has its readers there; a value a rule redirected readers to, unknown.
  void set_uses(ir::NodeId id, int32_t n) {
    if (uses_.size() <= id) uses_.resize(id + 1, kUnknownUses);
    uses_[id] = n;
  }

  // Called with each node kept (v: its value in out_): remembers relus, h = where(x <= 0, 0, x).
  void kept(const Node& n, Value v) {
    if (n.op != OpKind::Where || !is_constant(n.operands[1], 0)) return;
    const Node* le = producer(n.operands[0], OpKind::Le);
    if (le && le->operands[0] == n.operands[2] && is_constant(le->operands[1], 0))
      relu_of_mask_.emplace_back(n.operands[0], v);
  }

 private:
  // The single-result node of op `op` that defines v, if it is one.
  const Node* producer(Value v, OpKind op) const {
    const Node& p = out_.node(v.node);
    return p.op == op && p.num_results() == 1 ? &p : nullptr;
  }

  bool has_type(Value v, const Node& n) const { return out_.type(v) == n.type; }

  // v is a Constant (any shape) whose every element is c.
  bool is_constant(Value v, double c) const {
    const Node* p = producer(v, OpKind::Constant);
    if (!p) return false;
    std::optional<double> x = constant_value(p->attrs.f, p->type.dtype);
    return x && *x == c;
  }

  // v is a zero Constant, or one expanded to a bigger shape.
  bool is_zero(Value v) const {
    if (const Node* e = producer(v, OpKind::Expand)) v = e->operands[0];
    return is_constant(v, 0);
  }

  // concat(a, 0, 0) + concat(0, b, 0) + concat(0, 0, c) -> concat(a, b, c): the gradient of a
  // tensor read through slices (a transformer's q, k, v out of one projection) is a sum of
  // zero-padded pieces, which costs a pass over the whole tensor per piece. Fires when the
  // concats' other pieces are zeros where the other side is not (two pieces over the same
  // extent are added); each concat read only here.
  std::optional<Value> sum_of_concats(const Node& n) {
    const Node* c[2] = {producer(n.operands[0], OpKind::Concat),
                        producer(n.operands[1], OpKind::Concat)};
    if (!c[0] || !c[1] || c[0]->attrs.i != c[1]->attrs.i) return std::nullopt;
    for (int s = 0; s < 2; ++s)
      if (!has_type(n.operands[s], n) || uses(n.operands[s]) != 1) return std::nullopt;
    const int64_t axis = c[0]->attrs.i;
    struct Piece {
      int64_t at, len;
      Value v;
    };
    std::vector<Piece> live[2];  // the pieces that are not zeros, in order
    for (int s = 0; s < 2; ++s) {
      int64_t at = 0;
      for (const Value& v : c[s]->operands) {
        const int64_t len = out_.type(v).shape[axis];
        if (!is_zero(v)) live[s].push_back({at, len, v});
        at += len;
      }
    }
    // Each live piece meets, on the other side, zeros or a live piece of the same extent.
    for (int s = 0; s < 2; ++s)
      for (const Piece& p : live[s])
        for (const Piece& q : live[1 - s]) {
          const bool overlap = q.at < p.at + p.len && p.at < q.at + q.len;
          if (overlap && (q.at != p.at || q.len != p.len)) return std::nullopt;
        }
    if (probe_) return n.operands[0];
    std::vector<Value> pieces;
    const int64_t total = n.type.shape[axis];
    size_t i[2] = {0, 0};
    for (int64_t at = 0; at < total;) {
      const Piece* p[2] = {nullptr, nullptr};
      for (int s = 0; s < 2; ++s)
        if (i[s] < live[s].size() && live[s][i[s]].at == at) p[s] = &live[s][i[s]++];
      if (p[0] && p[1]) {
        pieces.push_back(b_.binary(OpKind::Add, p[0]->v, p[1]->v));
        at += p[0]->len;
      } else if (p[0] || p[1]) {
        pieces.push_back((p[0] ? p[0] : p[1])->v);
        at += (p[0] ? p[0] : p[1])->len;
      } else {  // zeros up to the next live piece on either side
        int64_t next = total;
        for (int s = 0; s < 2; ++s)
          if (i[s] < live[s].size()) next = std::min(next, live[s][i[s]].at);
        Shape shape = n.type.shape;
        shape[axis] = next - at;
        pieces.push_back(b_.expand(b_.constant(0, n.type.dtype), shape));
        at = next;
      }
    }
    const Value r = pieces.size() == 1 ? pieces[0] : b_.concat(pieces, axis);
    if (has_type(r, n)) return r;
    return std::nullopt;  // the nodes just built are left for DCE
  }

  std::optional<Value> reshape(const Node& n) {
    Value x = n.operands[0];
    if (has_type(x, n)) return x;  // reshape(x) to x.shape -> x
    const Node* inner = producer(x, OpKind::Reshape);
    if (!inner) return std::nullopt;
    Value y = inner->operands[0];
    if (has_type(y, n)) return y;  // reshape(reshape(y, s1), y.shape) -> y
    // reshape(reshape(y, s1), s2) -> reshape(y, s2)
    if (probe_) return y;
    return b_.make(OpKind::Reshape, std::span<const Value>(&y, 1), n.attrs);
  }

  std::optional<Value> permute(const Node& n) {
    Value x = n.operands[0];
    if (has_type(x, n) && is_identity(n.attrs.ints)) return x;  // permute(x, id) -> x
    const Node* inner = producer(x, OpKind::Permute);
    if (!inner) return std::nullopt;
    // out[i] = x[p2[i]] = y[p1[p2[i]]]: permute(permute(y, p1), p2) -> permute(y, p1 o p2)
    ir::Attrs a;
    for (int64_t p : n.attrs.ints) a.ints.push_back(inner->attrs.ints[p]);
    Value y = inner->operands[0];
    if (is_identity(a.ints)) return y;
    if (probe_) return y;
    return b_.make(OpKind::Permute, std::span<const Value>(&y, 1), std::move(a));
  }

  int32_t uses(Value v) const { return v.node < uses_.size() ? uses_[v.node] : kUnknownUses; }

  // Whether perm swaps the last two dims and keeps the others.
  static bool swaps_last_two(const SmallVector<int64_t, 6>& perm) {
    const size_t r = perm.size();
    if (r < 2 || perm[r - 1] != static_cast<int64_t>(r) - 2 ||
        perm[r - 2] != static_cast<int64_t>(r) - 1)
      return false;
    for (size_t i = 0; i + 2 < r; ++i) {
      if (perm[i] != static_cast<int64_t>(i)) return false;
    }
    return true;
  }

  // v [m, n] transposed: a permute's operand when v is itself a transpose, else a permute.
  Value transpose(Value v) {
    if (const Node* p = producer(v, OpKind::Permute); p && swaps_last_two(p->attrs.ints))
      return p->operands[0];
    ir::Attrs a;
    a.ints = {1, 0};
    return b_.make(OpKind::Permute, std::span<const Value>(&v, 1), std::move(a));
  }

  // transpose(a @ b) -> b^T @ a^T for 2-d products read only here: torch's autograd writes a
  // weight's gradient as the transpose of x^T g, and a product whose result is the gradient
  // itself takes the optimizer's update as its epilogue (the transposes are operand flags).
  std::optional<Value> transposed_product(const Node& n) {
    const Value x = n.operands[0];
    const Node* mm = producer(x, OpKind::MatMul);
    if (!mm || n.attrs.ints.size() != 2 || !swaps_last_two(n.attrs.ints) || uses(x) != 1)
      return std::nullopt;
    const Value a = mm->operands[0], b = mm->operands[1];
    if (out_.type(a).shape.rank() != 2 || out_.type(b).shape.rank() != 2) return std::nullopt;
    if (probe_) return x;
    const Value ops[2] = {transpose(b), transpose(a)};
    const Value r = b_.make(OpKind::MatMul, ops, {});
    if (has_type(r, n)) return r;
    return std::nullopt;  // the nodes just built are left for DCE
  }

  // reshape(reshape(x [..., k] to [m, k]) @ w [k, n]) to [..., n] -> x @ w, for a product read
  // only here: torch's linear flattens its input around the product, which hid the product's
  // elementwise readers (a residual add) from the planner's epilogues.
  std::optional<Value> flat_product(const Node& n) {
    const Value x = n.operands[0];
    const Node* mm = producer(x, OpKind::MatMul);
    if (!mm || uses(x) != 1) return std::nullopt;
    const Value a = mm->operands[0], w = mm->operands[1];
    const Node* flat = producer(a, OpKind::Reshape);
    if (!flat || out_.type(a).shape.rank() != 2 || out_.type(w).shape.rank() != 2)
      return std::nullopt;
    const Value src = flat->operands[0];
    const Shape& s = out_.type(src).shape;
    const Shape& want = n.type.shape;
    const size_t r = s.rank();
    if (r < 3 || want.rank() != r || s[r - 1] != out_.type(a).shape[1]) return std::nullopt;
    for (size_t d = 0; d + 1 < r; ++d) {
      if (s[d] != want[d]) return std::nullopt;
    }
    if (probe_) return x;
    const Value ops[2] = {src, w};
    const Value out = b_.make(OpKind::MatMul, ops, {});
    if (has_type(out, n)) return out;
    return std::nullopt;
  }

  static bool is_identity(const SmallVector<int64_t, 6>& perm) {
    for (size_t i = 0; i < perm.size(); ++i) {
      if (perm[i] != static_cast<int64_t>(i)) return false;
    }
    return true;
  }

  // where(x <= 0, 0, g) beside a relu h = where(x <= 0, 0, x) (its gradient's mask) ->
  // where(h <= 0, 0, g): h <= 0 exactly where x <= 0 (nan: neither), and x's only readers are
  // then the relu's own nodes, so the planner folds the relu into the product that computes x
  // (a post-op) and no buffer holds x.
  std::optional<Value> relu_mask(const Node& n) {
    const Value m = n.operands[0];
    if (!is_constant(n.operands[1], 0)) return std::nullopt;
    const Node* le = producer(m, OpKind::Le);
    if (!le || le->operands[0] == n.operands[2]) return std::nullopt;  // the relu itself
    for (const auto& [mask, h] : relu_of_mask_) {
      if (mask != m) continue;
      if (probe_) return h;
      const Value hm = b_.binary(OpKind::Le, h, le->operands[1]);
      const Value r = b_.where(hm, n.operands[1], n.operands[2]);
      if (has_type(r, n)) return r;
      return std::nullopt;  // the nodes just built are left for DCE
    }
    return std::nullopt;
  }

  // op(c0, c1, ...) -> c for 0-d constants c_k: evaluated once here instead of per run.
  std::optional<Value> fold(const Node& n) {
    if (n.type.shape.rank() != 0 || n.operands.size() > 3) return std::nullopt;
    double xs[3];
    for (size_t k = 0; k < n.operands.size(); ++k) {
      const Node* c = producer(n.operands[k], OpKind::Constant);
      if (!c || c->type.shape.rank() != 0) return std::nullopt;
      std::optional<double> v = constant_value(c->attrs.f, c->type.dtype);
      if (!v) return std::nullopt;
      xs[k] = *v;
    }
    DType in = out_.type(n.operands[n.op == OpKind::Where ? 1 : 0]).dtype;
    std::optional<double> r =
        fold_elementwise(n.op, std::span<const double>(xs, n.operands.size()), in, n.type.dtype);
    if (!r) return std::nullopt;
    if (probe_) return n.operands[0];
    return b_.constant(*r, n.type.dtype);
  }

  Graph& out_;
  ir::Builder b_;
  bool probe_;
  std::vector<std::pair<Value, Value>> relu_of_mask_;  // (x <= 0, where(x <= 0, 0, x))
  std::vector<int32_t> uses_;                          // readers per node of out_, where known
};

// Readers of each node of g: operands of later nodes and the graph's outputs.
std::vector<int32_t> readers(const Graph& g) {
  std::vector<int32_t> n(g.size(), 0);
  for (ir::NodeId id = 0; id < g.size(); ++id) {
    for (const Value& v : g.node(id).operands) ++n[v.node];
  }
  for (const Value& v : g.outputs()) ++n[v.node];
  return n;
}

class Simplify final : public Pass {
 public:
  std::string_view name() const override { return "simplify"; }

  bool run(Graph& g) override {
    // Most graphs have nothing to simplify: find out before copying every node. Until a
    // rule fires the rebuilt graph is a copy of g, so matching against g itself is exact.
    const std::vector<int32_t> uses = readers(g);
    {
      Simplifier probe(g, /*probe=*/true);
      for (ir::NodeId id = 0; id < g.size(); ++id) probe.set_uses(id, uses[id]);
      bool fires = false;
      for (ir::NodeId id = 0; id < g.size() && !fires; ++id) {
        const Node& n = g.node(id);
        fires = n.num_results() == 1 && n.regions.empty() && probe.rewrite(n).has_value();
        if (!fires) probe.kept(n, {id, 0});
      }
      if (!fires) return false;
    }
    Graph out;
    out.reserve(g.size());
    Simplifier s(out);
    std::vector<Value> map(g.size());
    bool changed = false;
    for (ir::NodeId id = 0; id < g.size(); ++id) {
      Node n = g.node(id);
      for (Value& v : n.operands) v = remap(map, v);
      std::optional<Value> r;
      const ir::NodeId before = static_cast<ir::NodeId>(out.size());
      if (n.num_results() == 1 && n.regions.empty()) r = s.rewrite(n);
      if (r) {
        map[id] = *r;
        changed = true;
        // A node built for n takes n's readers; an older one gains readers it did not have.
        s.set_uses(r->node, r->node >= before ? uses[id] : Simplifier::kUnknownUses);
      } else {
        s.kept(n, {before, 0});  // the id out.add gives it
        s.set_uses(before, uses[id]);
        map[id] = {out.add(std::move(n)), 0};
      }
    }
    for (Value& v : g.outputs()) v = remap(map, v);
    out.outputs() = std::move(g.outputs());
    g = std::move(out);
    return changed;
  }

 private:
  // A result of old node v.node in the new graph: a rewritten node maps to a single value,
  // a kept one to the same result of its copy.
  static Value remap(const std::vector<Value>& map, Value v) {
    Value m = map[v.node];
    return {m.node, m.index + v.index};
  }
};

}  // namespace

std::unique_ptr<Pass> make_simplify() { return std::make_unique<Simplify>(); }

}  // namespace loom::passes::detail
