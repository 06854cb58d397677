// Stages and kernels: each computed value becomes a stage, merged into the kernel before it
// when it reads only that kernel's current row.
#include <algorithm>
#include <climits>
#include <functional>
#include <set>

#include "backend/cpu/plan_impl.h"

namespace loom::cpu::detail {

using ir::OpKind;

namespace {

constexpr size_t kMaxStages = 6;

bool is_zero_on(const Affine& a, size_t lo, size_t hi) {
  for (size_t j = lo; j < std::min(hi, a.a.size()); ++j)
    if (a.a[j] != 0) return false;
  return true;
}
bool is_var(const Affine& a, size_t j) {
  if (a.c != 0 || j >= a.a.size() || a.a[j] != 1) return false;
  for (size_t k = 0; k < a.a.size(); ++k)
    if (k != j && a.a[k] != 0) return false;
  return true;
}

}  // namespace

Stage Planner::elementwise_stage(NodeId value, int out_buf) {
  Stage s;
  s.node = value;
  s.out_buf = out_buf;
  s.shape = g_.node(value).type.shape;
  s.out_strides = contiguous_strides(s.shape);
  return s;
}
void Planner::plan_concat(NodeId id) {
  const ir::Node& node = g_.node(id);
  int64_t axis = node.attrs.i, at = 0;
  std::vector<int64_t> st = contiguous_strides(node.type.shape);
  for (const ir::Value& v : node.operands) {
    const int64_t offset = at * st[axis];
    at += g_.type(v).shape[axis];
    if (filled_pieces_.count({id, v.node})) continue;  // an attention step writes it
    Stage s = elementwise_stage(v.node, plan_.buf_of[id]);
    s.out_strides = st;
    add_stage(std::move(s), /*mergeable=*/false);  // a kernel of its own
    plan_.kernels.back().out_shift = offset;
  }
}
void Planner::plan_reduce(NodeId id) {
  const ir::Node& node = g_.node(id);
  Stage s;
  s.reduce = true;
  s.node = id;
  s.out_buf = plan_.buf_of[id];
  s.shape = g_.type(node.operands[0]).shape;
  if (node.op == OpKind::ArgMax) {
    if (!s.shape.empty()) s.reduced = {node.attrs.i};
  } else {
    s.reduced.assign(node.attrs.ints.begin(), node.attrs.ints.end());
  }
  s.out_strides = contiguous_strides(node.type.shape);
  s.columns = column_block(s, node.op);
  bool columns = s.columns > 0;
  add_stage(std::move(s), /*mergeable=*/!columns);
}
// The column block of a reduction that keeps the last axis (0: a row reduction). Blocks of
// at most 256 columns, evenly sized in multiples of 8 (one AVX2 vector): the accumulator
// row stays in L1, and a wide row splits across threads.
int64_t Planner::column_block(const Stage& s, OpKind op) {
  if (op == OpKind::ArgMax || s.shape.empty()) return 0;
  const int64_t last = s.shape.rank() - 1;
  if (std::find(s.reduced.begin(), s.reduced.end(), last) != s.reduced.end()) return 0;
  const int64_t n = s.shape[last];
  if (n < 2 || s.shape.numel() == 0) return 0;
  constexpr int64_t kMaxBlock = 256;
  const int64_t blocks = (n + kMaxBlock - 1) / kMaxBlock;
  return std::min(n, ((n + blocks - 1) / blocks + 7) / 8 * 8);
}
Shape Planner::outer_of(const Stage& s) {
  Shape o;
  if (s.reduce) {
    for (int64_t d = 0; d < s.shape.rank(); ++d)
      if (std::find(s.reduced.begin(), s.reduced.end(), d) == s.reduced.end())
        o.push_back(s.shape[d]);
    if (s.columns > 0) o[o.size() - 1] = (o[o.size() - 1] + s.columns - 1) / s.columns;  // blocks
  } else if (!s.shape.empty()) {
    o = Shape(s.shape.begin(), s.shape.end() - 1);
  }
  return o;
}
// Reductions over trailing axes keep outer dims first, so a row can hold several stages.
bool Planner::trailing_reduction(const Stage& s) {
  int64_t r = s.shape.rank(), k = static_cast<int64_t>(s.reduced.size());
  for (int64_t i = 0; i < k; ++i)
    if (s.reduced[i] != r - k + i) return false;
  return true;
}
void Planner::add_stage(Stage s, bool mergeable) {
  Shape outer = outer_of(s);
  bool can_merge = mergeable && !plan_.steps.empty() && plan_.steps.back().kind == Step::Kernel &&
                   (!s.reduce || trailing_reduction(s));
  if (can_merge) {
    KernelSpec& k = plan_.kernels[plan_.steps.back().kernel];
    // A few stages per kernel: a row stays in cache, and functions stay small to compile.
    can_merge = k.chunk == 0 && mergeable_kernel_[plan_.steps.back().kernel] && k.outer == outer &&
                k.stages.size() < kMaxStages && row_local(k, s) && !adds_fallback_wait(k, s);
  }
  if (can_merge) {
    plan_.kernels[plan_.steps.back().kernel].stages.push_back(std::move(s));
    return;
  }
  KernelSpec k;
  k.outer = outer;
  if (!s.reduce && !s.shape.empty()) {
    int64_t inner = s.shape.back(), rows = outer.numel();
    constexpr int64_t kChunk = 16384;
    if (rows < 64 && inner > 2 * kChunk) {  // a long row: split it so threads share it
      k.chunk = kChunk;
      k.outer.push_back((inner + kChunk - 1) / kChunk);
    }
  }
  k.stages.push_back(std::move(s));
  k.name = "k" + std::to_string(plan_.kernels.size());
  plan_.kernels.push_back(std::move(k));
  mergeable_kernel_.push_back(mergeable);
  plan_.steps.push_back(Step{Step::Kernel, static_cast<int>(plan_.kernels.size() - 1), 0, {}, {}});
}
// Stage s reads a buffer that a reference fallback fills and no stage of k reads: merged,
// k's other stages would wait for the fallback too. The MLP's cross entropy counted its
// labels in the kernel that sums the loss behind the labels' gather, and the whole
// backward waited for that gather.
bool Planner::adds_fallback_wait(const KernelSpec& k, const Stage& s) {
  if (fallback_out_.empty()) return false;  // no fallback (nor loop) step yet: no walks
  auto reads = [&](const Stage& st) {
    std::vector<int> bufs;
    const bool computes = !st.reduce && plan_.buf_of[st.node] == st.out_buf;
    collect_leaf_bufs(st.reduce ? g_.node(st.node).operands[0].node : st.node, &bufs,
                      computes ? static_cast<int>(st.node) : -1);
    return bufs;
  };
  std::vector<int> waits;
  for (int b : reads(s))
    if (b >= 0 && static_cast<size_t>(b) < fallback_out_.size() && fallback_out_[b])
      waits.push_back(b);
  if (waits.empty()) return false;
  for (const Stage& st : k.stages)
    for (int b : reads(st)) waits.erase(std::remove(waits.begin(), waits.end(), b), waits.end());
  return !waits.empty();
}
// Stage coordinates as loop variables: outer dims first, then the inner ones.
Coords Planner::stage_coords(const Stage& s) {
  size_t r = s.shape.size();
  Coords c(r);
  std::vector<size_t> order;
  for (size_t d = 0; d < r; ++d)
    if (!s.reduce || std::find(s.reduced.begin(), s.reduced.end(), d) == s.reduced.end())
      order.push_back(d);
  if (s.reduce)
    for (int64_t d : s.reduced) order.push_back(static_cast<size_t>(d));
  if (!s.reduce && r > 0) {  // elementwise: outer = all but the last, inner = the last
    order.clear();
    for (size_t d = 0; d < r; ++d) order.push_back(d);
  }
  for (size_t j = 0; j < order.size(); ++j) c[order[j]] = var(j, r);
  return c;
}
// Every read of a value that kernel k produces must stay in the same outer row.
bool Planner::row_local(const KernelSpec& k, const Stage& s) {
  std::set<NodeId> produced;
  for (const Stage& st : k.stages) produced.insert(st.node);
  size_t nout = k.outer.size();
  bool ok = true;
  std::set<std::pair<NodeId, std::vector<int64_t>>> seen;
  std::function<void(NodeId, const Coords&)> walk = [&](NodeId n, const Coords& c) {
    if (!ok) return;
    const ir::Node& node = g_.node(n);
    bool computed_here = s.node == n && !s.reduce && plan_.buf_of[n] == s.out_buf;
    if (has_buf_[n] && !computed_here) {
      if (produced.count(n)) ok = ok && row_local_read(n, c, nout);
      return;
    }
    if (s.reduce && n == s.node) {
      walk(node.operands[0].node, c);
      return;
    }
    if (node.op == OpKind::Reshape && !trivial_reshape(g_, n)) {
      if (produced.count(node.operands[0].node)) ok = false;
      return;
    }
    std::vector<int64_t> key;
    for (const Affine& a : c) {
      key.push_back(a.c);
      key.insert(key.end(), a.a.begin(), a.a.end());
      key.push_back(INT64_MIN);
    }
    if (!seen.insert({n, key}).second) return;
    for (size_t i = 0; i < node.operands.size(); ++i)
      walk(node.operands[i].node, operand_coords(g_, n, i, c));
  };
  walk(s.node, stage_coords(s));
  return ok;
}
bool Planner::row_local_read(NodeId x, const Coords& c, size_t nout) {
  const ir::Node& node = g_.node(x);
  std::vector<size_t> outer_dims;
  if (ir::has_trait(node.op, ir::kReduce)) {
    const Shape& in = g_.type(node.operands[0]).shape;
    std::vector<int64_t> red;
    if (node.op == OpKind::ArgMax)
      red = {node.attrs.i};
    else
      red.assign(node.attrs.ints.begin(), node.attrs.ints.end());
    size_t od = 0;
    for (int64_t d = 0; d < in.rank(); ++d) {
      bool r = std::find(red.begin(), red.end(), d) != red.end();
      if (!r) outer_dims.push_back(od);
      if (!r || node.attrs.flag) ++od;
    }
  } else {
    for (size_t d = 0; d < nout && d < node.type.shape.size(); ++d) outer_dims.push_back(d);
  }
  if (outer_dims.size() != nout) return false;
  for (size_t d = 0; d < c.size(); ++d) {
    auto it = std::find(outer_dims.begin(), outer_dims.end(), d);
    if (it != outer_dims.end()) {
      if (!is_var(c[d], static_cast<size_t>(it - outer_dims.begin()))) return false;
    } else if (!is_zero_on(c[d], 0, nout)) {
      return false;
    }
  }
  return true;
}

}  // namespace loom::cpu::detail
