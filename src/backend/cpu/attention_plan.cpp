// Attention in place: the attention step reads q, k, v (and a gradient's dO) through strided
// views of the buffers they are layouts of (the [B, T, 3C] projection sliced, split into heads
// and permuted), and writes each result where its chain of layouts ends (the output permuted
// back to [B, T, H, D], the gradients into the concatenated [B, T, 3C] gradient), so no step
// copies them around it.
#include "backend/cpu/plan_impl.h"

namespace loom::cpu::detail {

using ir::OpKind;

namespace {

bool is_attention(OpKind op) { return op == OpKind::Attention || op == OpKind::AttentionGrad; }

// The kernel's products read and write [rows, D] blocks with a leading dimension: the last
// dim must be contiguous.
bool rows_contiguous(const Shape& s, const std::vector<int64_t>& strides) {
  return s.rank() < 2 || s.back() <= 1 || strides.back() == 1;
}

}  // namespace

bool attention_viewed_slot(OpKind op, size_t k) {
  return k < 3 || (op == OpKind::AttentionGrad && k == 5);
}

bool Planner::attention_node(NodeId id) const {
  return is_attention(g_.node(id).op) && !stand_in_[id];
}

void Planner::mark_attention_chains() {
  feeds_attention_.assign(n_, 0);
  attention_ = false;
  for (NodeId id = 0; id < n_ && !attention_; ++id) attention_ = attention_node(id);
  if (!attention_) return;
  build_users();
  std::vector<bool> out(n_, false);  // an output is computed, by a kernel through its layouts
  for (const ir::Value& v : g_.outputs()) out[v.node] = true;
  // Users come after their operands: one walk from the end settles each node.
  for (NodeId id = n_; id-- > 0;) {
    bool all = uses_[id] > 0 && !out[id];
    for (NodeId u : users(id)) {
      const ir::Node& un = g_.node(u);
      if (attention_node(u)) {
        for (size_t k = 0; k < un.operands.size(); ++k)
          all = all && (un.operands[k].node != id || attention_viewed_slot(un.op, k));
      } else {
        all = all && is_view_op(g_, u) && feeds_attention_[u];
      }
    }
    feeds_attention_[id] = all;
  }
}

bool Planner::attention_view(NodeId operand, BlasView* v) const {
  return view_of(g_, has_buf_, operand, v, 0) &&
         rows_contiguous(g_.node(operand).type.shape, v->strides);
}

void Planner::copy_layout(NodeId operand) {
  has_buf_[operand] = true;
  read_layouts(operand);
}

bool Planner::read_layouts(NodeId n) {
  // A kernel computes n's layouts inline, down to the buffers they read: a reshape that is
  // not a pure coordinate map reads its operand from memory.
  bool changed = false;
  for (NodeId c = n; is_view_op(g_, c);) {
    const NodeId in = g_.node(c).operands[0].node;
    if (g_.node(c).op == OpKind::Reshape && !trivial_reshape(g_, c) && !has_buf_[in]) {
      has_buf_[in] = true;
      changed = true;
    }
    if (has_buf_[in]) break;
    c = in;
  }
  return changed;
}

void Planner::settle_attention_inputs() {
  if (!attention_) return;
  // Buffers given after an attention node was seen (a layout stored for another reader, say)
  // may end a view earlier, and a stored layout computes the layouts under it: check both
  // again until nothing changes (each round only adds buffers, so this ends).
  for (bool again = true; again;) {
    again = false;
    for (NodeId id = 0; id < n_; ++id) {
      if (feeds_attention_[id] && has_buf_[id] && !stand_in_[id]) again |= read_layouts(id);
      if (!attention_node(id)) continue;
      const ir::Node& node = g_.node(id);
      for (size_t k = 0; k < node.operands.size(); ++k) {
        const NodeId x = node.operands[k].node;
        BlasView v;
        if (has_buf_[x] || !attention_viewed_slot(node.op, k) || attention_view(x, &v)) continue;
        copy_layout(x);
        again = true;
      }
    }
  }
}

void Planner::plan_attention_outputs() {
  if (!attention_) return;
  std::vector<bool> out(n_, false);
  for (const ir::Value& v : g_.outputs()) out[v.node] = true;
  for (NodeId id = 0; id < n_; ++id) {
    if (!attention_node(id)) continue;
    const std::vector<NodeId> rs = results_of(id);
    const size_t n_out = g_.node(id).op == OpKind::Attention ? 1 : 3;  // not the log-sum-exp
    for (size_t r = 0; r < n_out && r < rs.size(); ++r) {
      // The chain of layouts that reads only this result: permutes, reshapes, then at most
      // one concat that takes it as one piece.
      std::vector<NodeId> chain;
      for (NodeId cur = rs[r]; uses_[cur] == 1 && !out[cur];) {
        const NodeId u = users(cur)[0];
        const OpKind op = g_.node(u).op;
        if (op != OpKind::Permute && op != OpKind::Reshape && op != OpKind::Concat) break;
        chain.push_back(u);
        if (op == OpKind::Concat) break;
        cur = u;
      }
      for (; !chain.empty(); chain.pop_back()) {
        BlasView v;
        if (!result_view(rs[r], chain, &v)) continue;
        out_view_[rs[r]] = v;
        has_buf_[rs[r]] = false;
        for (size_t i = 0; i + 1 < chain.size(); ++i) has_buf_[chain[i]] = false;
        has_buf_[v.base] = true;
        if (g_.node(v.base).op == OpKind::Concat) {
          const NodeId piece = chain.size() > 1 ? chain[chain.size() - 2] : rs[r];
          filled_pieces_.insert({v.base, piece});
        } else {
          filled_.insert(v.base);
        }
        break;
      }
    }
  }
}

bool Planner::result_view(NodeId result, const std::vector<NodeId>& chain, BlasView* v) const {
  const NodeId end = chain.back();
  const ir::Node& en = g_.node(end);
  if (folded_.size() > end && folded_[end]) return false;
  v->base = end;
  v->offset = 0;
  v->strides = contiguous_strides(en.type.shape);
  // From the end's dense layout back to the result's: each node's operand strides.
  for (size_t i = chain.size(); i-- > 0;) {
    const ir::Node& node = g_.node(chain[i]);
    const NodeId in = i == 0 ? result : chain[i - 1];
    const Shape& ish = g_.node(in).type.shape;
    std::vector<int64_t> st(ish.size(), 0);
    switch (node.op) {
      case OpKind::Concat: {
        const int64_t axis = node.attrs.i;
        for (const ir::Value& x : node.operands) {
          if (x.node == in) break;
          v->offset += g_.type(x).shape[axis] * v->strides[axis];
        }
        st = v->strides;
        break;
      }
      case OpKind::Permute:
        for (size_t j = 0; j < node.attrs.ints.size(); ++j) st[node.attrs.ints[j]] = v->strides[j];
        break;
      default:
        if (!reshape_strides(node.type.shape, v->strides, ish, &st)) return false;
    }
    v->strides = std::move(st);
  }
  return rows_contiguous(g_.node(result).type.shape, v->strides);
}

void Planner::attention_views(NodeId id, Step* st) const {
  const ir::Node& node = g_.node(id);
  for (const ir::Value& x : node.operands) {
    st->views.emplace_back();
    LOOM_ASSERT(view_of(g_, has_buf_, x.node, &st->views.back(), 0));
  }
  for (NodeId r : results_of(id)) {
    auto it = out_view_.find(r);
    BlasView v = it != out_view_.end() ? it->second
                                       : BlasView{r, 0, contiguous_strides(g_.node(r).type.shape)};
    st->outs.push_back(plan_.buf_of[v.base]);
    st->out_views.push_back(std::move(v));
  }
}

}  // namespace loom::cpu::detail
