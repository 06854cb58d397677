// Epilogues: elementwise consumers of a oneDNN product (gelu, relu, sigmoid, tanh, linear and
// binary ops) matched in the graph and folded into it as post-ops.
#include <algorithm>
#include <cmath>
#include <span>

#include "backend/cpu/plan_impl.h"
#include "loom/core/error.h"

namespace loom::cpu::detail {

using ir::OpKind;

namespace {

constexpr size_t kMaxPostOps = 8;

}  // namespace

// The value of a constant read through expands and size-1 reshapes.
bool Planner::const_value(NodeId y, double* v) const {
  for (int i = 0; i < 8; ++i) {
    const ir::Node& n = g_.node(y);
    if (n.op == OpKind::Constant) {
      *v = n.attrs.f;
      return true;
    }
    if (n.op != OpKind::Expand && !(n.op == OpKind::Reshape && trivial_reshape(g_, y)))
      return false;
    y = n.operands[0].node;
  }
  return false;
}
bool Planner::is_const(NodeId y, double want, double tol) const {
  double v = 0;
  return const_value(y, &v) && std::abs(v - want) <= tol;
}
// x is read only by the pattern being matched (`count` reads) and is no graph output.
bool Planner::private_value(NodeId x, int count) const {
  return uses_[x] == count && !is_out_[x] && !stand_in_[x];
}
void Planner::build_users() {
  user_start_.assign(n_ + 1, 0);
  for (NodeId id = 0; id < n_; ++id)
    for (const ir::Value& v : g_.node(id).operands) user_start_[v.node + 1]++;
  for (size_t i = 0; i < n_; ++i) user_start_[i + 1] += user_start_[i];
  users_.assign(user_start_[n_], 0);
  std::vector<int> at(user_start_.begin(), user_start_.end() - 1);
  for (NodeId id = 0; id < n_; ++id)
    for (const ir::Value& v : g_.node(id).operands) users_[at[v.node]++] = id;
}
std::span<const NodeId> Planner::users(NodeId x) const {
  return {users_.data() + user_start_[x], users_.data() + user_start_[x + 1]};
}
// gelu (composite.cpp) on x, read by us = its two users: returns the end node (0: none).
NodeId Planner::match_gelu(NodeId x, std::span<const NodeId> us, const TensorType& t) const {
  // mul(mul(x, 0.5), add(erf(mul(x, 1/sqrt(2))), 1))
  for (int swap = 0; swap < 2; ++swap) {
    NodeId h = us[swap], e = us[1 - swap];
    const ir::Node &hn = g_.node(h), &en = g_.node(e);
    if (hn.op != OpKind::Mul || en.op != OpKind::Mul || !same_type(h, t) || !same_type(e, t))
      continue;
    auto other = [&](const ir::Node& n) {
      return n.operands[0].node == x ? n.operands[1].node : n.operands[0].node;
    };
    if (!is_const(other(hn), 0.5, 1e-12) || !is_const(other(en), M_SQRT1_2, 1e-7)) continue;
    if (!private_value(h, 1) || !private_value(e, 1)) continue;
    NodeId erf = users(e)[0];
    if (g_.node(erf).op != OpKind::Erf || !private_value(erf, 1)) continue;
    NodeId a = users(erf)[0];
    const ir::Node& an = g_.node(a);
    if (an.op != OpKind::Add || !private_value(a, 1) || !same_type(a, t)) continue;
    if (!is_const(an.operands[0].node == erf ? an.operands[1].node : an.operands[0].node, 1, 0))
      continue;
    NodeId m = users(a)[0];
    const ir::Node& mn = g_.node(m);
    if (users(h)[0] != m || mn.op != OpKind::Mul || !same_type(m, t)) continue;
    return m;
  }
  return 0;
}
// relu (composite.cpp) on x, read by its two users us: where(le(x, 0), 0, x).
NodeId Planner::match_relu(NodeId x, std::span<const NodeId> us, const TensorType& t) const {
  for (int swap = 0; swap < 2; ++swap) {
    NodeId l = us[swap], w = us[1 - swap];
    const ir::Node &ln = g_.node(l), &wn = g_.node(w);
    if (ln.op != OpKind::Le || wn.op != OpKind::Where || !same_type(w, t)) continue;
    if (ln.operands[0].node != x || !is_const(ln.operands[1].node, 0, 0)) continue;
    if (!private_value(l, 1) || wn.operands[0].node != l || wn.operands[2].node != x ||
        !is_const(wn.operands[1].node, 0, 0))
      continue;
    return w;
  }
  return 0;
}
// sigmoid (composite.cpp) from its negation u of x: div(1, add(exp(neg(x)), 1)).
NodeId Planner::match_sigmoid(NodeId u, const TensorType& t) const {
  if (!private_value(u, 1)) return 0;
  NodeId e = users(u)[0];
  if (g_.node(e).op != OpKind::Exp || !private_value(e, 1)) return 0;
  NodeId a = users(e)[0];
  const ir::Node& an = g_.node(a);
  if (an.op != OpKind::Add || !private_value(a, 1) || !same_type(a, t) ||
      !is_const(an.operands[0].node == e ? an.operands[1].node : an.operands[0].node, 1, 0))
    return 0;
  NodeId d = users(a)[0];
  const ir::Node& dn = g_.node(d);
  if (dn.op != OpKind::Div || dn.operands[1].node != a || !is_const(dn.operands[0].node, 1, 0) ||
      !same_type(d, t))
    return 0;
  return d;
}
// One consumer pattern at x: appends its post-op, returns the node it ends at (0: none).
NodeId Planner::match_post_op(NodeId x, const TensorType& t, std::vector<PostOp>* post,
                              std::vector<NodeId>* binaries) const {
  if (is_out_[x] || stand_in_[x]) return 0;
  auto us = users(x);
  if (uses_[x] == 2 && us.size() == 2) {
    if (NodeId m = match_gelu(x, us, t)) {
      post->push_back(PostOp{PostOp::Gelu});
      return m;
    }
    if (NodeId w = match_relu(x, us, t)) {
      post->push_back(PostOp{PostOp::Relu});
      return w;
    }
    return 0;
  }
  if (uses_[x] != 1 || us.size() != 1) return 0;
  const NodeId u = us[0];
  const ir::Node& un = g_.node(u);
  if (!same_type(u, t)) return 0;
  switch (un.op) {
    case OpKind::Tanh: post->push_back(PostOp{PostOp::Tanh}); return u;
    case OpKind::Neg:
      if (NodeId d = match_sigmoid(u, t)) {
        post->push_back(PostOp{PostOp::Sigmoid});
        return d;
      }
      post->push_back(PostOp{PostOp::Linear, -1, 0});  // -x
      return u;
    case OpKind::Add:
    case OpKind::Sub:
    case OpKind::Mul:
    case OpKind::Div:
    case OpKind::Maximum:
    case OpKind::Minimum: return match_binary(x, u, t, post, binaries);
    default: return 0;
  }
}

// A binary consumer u of x (add, sub, mul, div, max, min): a linear post-op when the other
// operand is a constant, else a binary post-op reading it.
NodeId Planner::match_binary(NodeId x, NodeId u, const TensorType& t, std::vector<PostOp>* post,
                             std::vector<NodeId>* binaries) const {
  const ir::Node& un = g_.node(u);
  const int k = un.operands[0].node == x ? 0 : 1;
  const NodeId y = un.operands[1 - k].node;
  if (y == x) return 0;
  const bool ordered = un.op == OpKind::Sub || un.op == OpKind::Div;
  double c = 0;
  // c - x: a linear post-op (merged into one before it). y - x, y a tensor (SGD's w - lr *
  // dW): linear(-1), then add(y), in place as oneDNN's sum when the output takes y's memory
  // (onednn.cpp); cheaper than a loop (docs/architecture.md, "Measurements": SGD update).
  if (ordered && k != 0) {
    if (un.op != OpKind::Sub) return 0;
    if (const_value(y, &c)) {
      post->push_back(PostOp{PostOp::Linear, -1, static_cast<float>(c)});
      return u;
    }
    const TensorType& yt = g_.node(y).type;
    if (yt.dtype != DType::Float32 || yt.shape.rank() > t.shape.rank() ||
        post->size() + 2 > kMaxPostOps)
      return 0;
    post->push_back(PostOp{PostOp::Linear, -1, 0});
    PostOp add;
    add.kind = PostOp::Add;
    add.operand = y;
    post->push_back(add);
    binaries->push_back(y);
    return u;
  }
  if (const_value(y, &c)) {
    const float cf = static_cast<float>(c);
    switch (un.op) {
      case OpKind::Add: post->push_back(PostOp{PostOp::Linear, 1, cf}); return u;
      case OpKind::Sub: post->push_back(PostOp{PostOp::Linear, 1, -cf}); return u;
      case OpKind::Mul: post->push_back(PostOp{PostOp::Linear, cf, 0}); return u;
      case OpKind::Maximum:
        if (c != 0) return 0;
        post->push_back(PostOp{PostOp::Relu});
        return u;
      default: break;  // x / c, min(x, c): a binary post-op on the constant's buffer
    }
  }
  const TensorType& yt = g_.node(y).type;
  if (yt.dtype != DType::Float32 || yt.shape.rank() > t.shape.rank()) return 0;
  PostOp po;
  switch (un.op) {
    case OpKind::Add: po.kind = PostOp::Add; break;
    case OpKind::Sub: po.kind = PostOp::Sub; break;
    case OpKind::Mul: po.kind = PostOp::Mul; break;
    case OpKind::Div: po.kind = PostOp::Div; break;
    case OpKind::Maximum: po.kind = PostOp::Max; break;
    default: po.kind = PostOp::Min; break;
  }
  po.operand = y;
  post->push_back(po);
  binaries->push_back(y);
  return u;
}

// Nodes strictly between x and end that a matched pattern computes (all private to it).
void Planner::pattern_nodes(NodeId x, NodeId end, std::vector<NodeId>* out) const {
  std::vector<NodeId> stack(users(x).begin(), users(x).end());
  while (!stack.empty()) {
    NodeId n = stack.back();
    stack.pop_back();
    if (n == end || std::find(out->begin(), out->end(), n) != out->end()) continue;
    out->push_back(n);
    for (NodeId u : users(n)) stack.push_back(u);
  }
}
void Planner::plan_epilogues() {
  bool any = false;
  for (NodeId id = 0; id < n_ && !any; ++id)
    any = g_.node(id).op == OpKind::MatMul && g_.node(id).type.dtype == DType::Float32;
  if (!any) return;
  is_out_.assign(n_, false);
  for (const ir::Value& v : g_.outputs()) is_out_[v.node] = true;
  folded_.assign(n_, 0);
  build_users();
  for (NodeId id = 0; id < n_; ++id) {
    const ir::Node& node = g_.node(id);
    if (node.op != OpKind::MatMul || node.type.dtype != DType::Float32 || !has_buf_[id]) continue;
    const TensorType& t = node.type;
    const Shape& os = t.shape;
    if (os.numel() == 0 || g_.type(node.operands[0]).shape.back() == 0) continue;
    Epilogue e;
    std::vector<NodeId> binaries, inner;
    NodeId x = id;
    while (e.post.size() < kMaxPostOps) {
      // Binary operands are operands of the pattern's nodes, which only the product reaches:
      // they never depend on it, and the step runs at the pattern's end, after them.
      const size_t before = e.post.size(), bin_before = binaries.size();
      NodeId end = match_post_op(x, t, &e.post, &binaries);
      if (end == 0) break;
      // A pattern another product's epilogue already folded (products summed in a chain,
      // s2 = s1 + m2 with s1 = m1 + ...): folding it twice would run one product's step
      // where the other computes the pattern in registers; nor may a binary operand be a
      // value computed inside an epilogue, which no buffer holds.
      std::vector<NodeId> pattern;
      pattern_nodes(x, end, &pattern);
      pattern.push_back(end);
      bool taken =
          std::any_of(pattern.begin(), pattern.end(), [&](NodeId n) { return folded_[n] != 0; });
      for (size_t b = bin_before; b < binaries.size(); ++b)
        taken = taken || folded_[binaries[b]] == 1;
      if (taken) {
        e.post.resize(before);
        binaries.resize(bin_before);
        break;
      }
      // Two linear post-ops in a row come out wrong from oneDNN 2.6's gemm:jit (the pair
      // (x + 1) * 2 gives 3.5 for x = 1.5): one linear does both. Only a pattern's first
      // post-op can be a linear.
      if (before >= 1 && e.post[before - 1].kind == PostOp::Linear &&
          e.post[before].kind == PostOp::Linear) {
        PostOp& first = e.post[before - 1];
        const PostOp& second = e.post[before];
        first.beta = second.alpha * first.beta + second.beta;  // a2 (a1 x + b1) + b2
        first.alpha *= second.alpha;
        e.post.erase(e.post.begin() + static_cast<std::ptrdiff_t>(before));
      }
      if (x != id) inner.push_back(x);
      inner.insert(inner.end(), pattern.begin(), pattern.end() - 1);  // without end
      x = end;
    }
    if (e.post.empty()) continue;
    BlasView a;
    LOOM_ASSERT(blas_view(g_, has_buf_, node.operands[0].node, &a));
    if (product_library(id, a.trans, true) != Library::Onednn) continue;
    e.end = x;
    for (NodeId n : inner) {
      has_buf_[n] = false;
      folded_[n] = 1;
    }
    has_buf_[x] = true;
    folded_[x] = 2;
    for (size_t i = 0, b = 0; i < e.post.size(); ++i) {
      PostOp& po = e.post[i];
      if (!po.binary()) continue;
      NodeId y = binaries[b++];
      if (!view_of(g_, has_buf_, y, &po.view, 0)) {
        has_buf_[y] = true;
        LOOM_ASSERT(view_of(g_, has_buf_, y, &po.view, 0));
      }
    }
    epilogue_end_of_[x] = id;
    epilogues_[id] = std::move(e);
  }
}

}  // namespace loom::cpu::detail
