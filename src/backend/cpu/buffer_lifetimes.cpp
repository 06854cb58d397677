// Buffer lifetimes: where each temporary is freed, and which inputs may lend their memory to
// an output (donation).
#include <algorithm>
#include <functional>

#include "backend/cpu/plan_impl.h"

namespace loom::cpu::detail {

using ir::OpKind;

// Buffers each step touches, for freeing temporaries after their last use.
void Planner::compute_releases() {
  std::vector<int>& last = last_use_;
  last.assign(plan_.bufs.size(), -1);
  view_last_.assign(plan_.bufs.size(), -1);
  for (size_t si = 0; si < plan_.steps.size(); ++si) {
    const Step& st = plan_.steps[si];
    std::vector<int> used;
    if (st.kind == Step::Kernel) {
      for (const Stage& s : plan_.kernels[st.kernel].stages) {
        if (s.out_buf >= 0) used.push_back(s.out_buf);
        bool computes = !s.reduce && plan_.buf_of[s.node] == s.out_buf;
        collect_leaf_bufs(s.reduce ? g_.node(s.node).operands[0].node : s.node, &used,
                          computes ? static_cast<int>(s.node) : -1);
      }
    } else {
      used.push_back(plan_.buf_of[st.node]);
      used.insert(used.end(), st.outs.begin(), st.outs.end());
      for (const BlasView& bv : st.views) used.push_back(plan_.buf_of[bv.base]);
      for (const PostOp& po : st.post)
        if (po.binary()) used.push_back(plan_.buf_of[po.view.base]);
      if (st.kind != Step::MatMul)
        for (const ir::Value& v : g_.node(st.node).operands) used.push_back(plan_.buf_of[v.node]);
    }
    for (size_t j = 0, n = used.size(); j < n; ++j)  // a view keeps its base alive
      if (int b = used[j]; b >= 0 && plan_.bufs[b].kind == BufferInfo::View)
        used.push_back(plan_.bufs[b].base);
    std::sort(used.begin(), used.end());
    used.erase(std::unique(used.begin(), used.end()), used.end());
    for (int b : used) {
      if (b < 0) continue;
      last[b] = static_cast<int>(si);
      if (plan_.bufs[b].kind == BufferInfo::View)
        view_last_[plan_.bufs[b].base] =
            std::max(view_last_[plan_.bufs[b].base], static_cast<int>(si));
    }
  }
  for (size_t b = 0; b < plan_.bufs.size(); ++b)
    if (plan_.bufs[b].kind == BufferInfo::Temp && last[b] >= 0)
      plan_.steps[last[b]].release.push_back(static_cast<int>(b));
}
// Appends the buffers the expression at n reads (duplicates included).
void Planner::collect_leaf_bufs(NodeId n, std::vector<int>* out, int root) {
  std::vector<NodeId> stack = {n};
  if (visit_mark_.size() < g_.size()) visit_mark_.assign(g_.size(), 0);
  const uint32_t stamp = ++visit_stamp_;
  while (!stack.empty()) {
    NodeId id = stack.back();
    stack.pop_back();
    if (visit_mark_[id] == stamp) continue;
    visit_mark_[id] = stamp;
    if (has_buf_[id] && static_cast<int>(id) != root) {
      out->push_back(plan_.buf_of[id]);
      continue;
    }
    for (const ir::Value& v : g_.node(id).operands) stack.push_back(v.node);
  }
}
void Planner::plan_donation() {
  plan_.donors.assign(plan_.bufs.size(), {});
  std::vector<int> writers(plan_.bufs.size(), 0), writer_step(plan_.bufs.size(), -1);
  for (size_t si = 0; si < plan_.steps.size(); ++si) {
    const Step& st = plan_.steps[si];
    auto wrote = [&](int b) {
      if (b < 0) return;
      if (writers[b]++ == 0) writer_step[b] = static_cast<int>(si);
    };
    if (st.kind == Step::Kernel) {
      for (const Stage& s : plan_.kernels[st.kernel].stages) wrote(s.out_buf);
    } else if (st.kind == Step::Ref || st.kind == Step::Loop || st.kind == Step::Native) {
      for (int b : st.outs) wrote(b);
    } else {
      wrote(plan_.buf_of[st.node]);
    }
  }
  for (size_t ob = 0; ob < plan_.bufs.size(); ++ob) {
    if (plan_.bufs[ob].kind != BufferInfo::Output || writers[ob] != 1) continue;
    int s = writer_step[ob];
    if (plan_.steps[s].kind == Step::Ref) continue;  // it returns its own fresh buffers
    // A loop writes its results on every iteration while reading its operands: only an
    // input it never reads (last read by an earlier step) may lend it memory.
    for (size_t ib = 0; ib < plan_.bufs.size(); ++ib) {
      const BufferInfo& in = plan_.bufs[ib];
      if (in.kind != BufferInfo::Input || in.type.nbytes() != plan_.bufs[ob].type.nbytes())
        continue;
      // A view of the input read at step s reads it where in_place does not look.
      const Step& st = plan_.steps[s];
      bool ok = view_last_[ib] < s &&
                (last_use_[ib] < s ||
                 (last_use_[ib] == s && st.kind == Step::Kernel &&
                  in_place(plan_.kernels[st.kernel], static_cast<int>(ob), static_cast<int>(ib))) ||
                 (last_use_[ib] == s && st.kind == Step::MatMul &&
                  adds_in_place(st, static_cast<int>(ib))));
      if (ok) plan_.donors[ob].push_back(in.index);
    }
  }
}
// Product step st may write its output over `ib`: it reads ib only as its last post-op's
// addend, at the addresses it writes (a dense operand of the output's shape), which oneDNN
// then runs as its sum post-op (onednn.cpp; an SGD update folded into the weight gradient).
bool Planner::adds_in_place(const Step& st, int ib) const {
  if (st.post.empty() || st.post.back().kind != PostOp::Add) return false;
  for (const BlasView& v : st.views)
    if (plan_.buf_of[v.base] == ib) return false;
  for (size_t i = 0; i + 1 < st.post.size(); ++i)
    if (st.post[i].binary() && plan_.buf_of[st.post[i].view.base] == ib) return false;
  const PostOp& add = st.post.back();
  const TensorType& out = g_.node(st.out).type;
  return plan_.buf_of[add.view.base] == ib && add.view.offset == 0 &&
         g_.node(add.operand).type == out && add.view.strides == contiguous_strides(out.shape);
}
// Kernel k may write `ob` over `ib`: only the stage writing ob reads ib, and only at the
// very addresses it writes, with elements of the same size.
bool Planner::in_place(const KernelSpec& k, int ob, int ib) {
  if (itemsize(plan_.bufs[ob].type.dtype) != itemsize(plan_.bufs[ib].type.dtype)) return false;
  if (k.out_shift != 0) return false;  // writes at a shifted address
  for (const Stage& s : k.stages) {
    bool writer = s.out_buf == ob;
    if (writer && (s.reduce || s.out_offset != 0)) return false;
    Coords sc = stage_coords(s);
    Affine store = s.reduce ? Affine{} : linear(s.out_strides, sc, s.out_offset);
    bool ok = true;
    std::function<void(NodeId, const Coords&)> walk = [&](NodeId n, const Coords& c) {
      if (!ok) return;
      const ir::Node& node = g_.node(n);
      bool root = n == s.node && !s.reduce && plan_.buf_of[n] == s.out_buf;
      if (s.reduce && n == s.node) return walk(node.operands[0].node, c);
      if (has_buf_[n] && !root) {
        if (plan_.buf_of[n] == ib)
          ok = writer && linear(contiguous_strides(node.type.shape), c, 0) == store;
        return;
      }
      if (node.op == OpKind::Reshape && !trivial_reshape(g_, n)) {
        if (plan_.buf_of[node.operands[0].node] == ib)
          ok = writer && linear(contiguous_strides(node.type.shape), c, 0) == store;
        return;
      }
      for (size_t i = 0; i < node.operands.size(); ++i)
        walk(node.operands[i].node, operand_coords(g_, n, i, c));
    };
    walk(s.node, sc);
    if (!ok) return false;
  }
  return true;
}

}  // namespace loom::cpu::detail
