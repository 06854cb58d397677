// Planning: which values get buffers, and the step that fills each (a kernel's stage, a
// product, a loop, a fallback). Stages, epilogues and lifetimes have their own files.
#include "backend/cpu/plan.h"

#include <algorithm>

#include "backend/cpu/plan_impl.h"
#include "loom/core/error.h"

namespace loom::cpu {

using ir::OpKind;

namespace detail {

namespace {

// A shared subexpression this large is stored only when recomputing costs over kRecomputeLarge:
// later kernels would read it from memory, dearer than arithmetic in kernels that wait on memory
// anyway (the exact GELU's 1 + erf term; docs/architecture.md, "Measurements": kRecomputeLarge).
constexpr int64_t kRecomputeLargeBytes = int64_t{1} << 20;
constexpr int64_t kRecomputeLarge = 24;

}  // namespace

Plan Planner::run() {
  decide_buffers();
  assign_buffers();
  for (NodeId id = 0; id < n_; ++id) {
    if ((has_buf_[id] || attention_node(id)) && g_.node(id).op != OpKind::Parameter && !view_[id])
      plan_node(id);
  }
  for (auto& [node, buf] : output_copies_) add_copy(node, buf);
  compute_releases();
  plan_donation();
  return std::move(plan_);
}
void Planner::decide_buffers() {
  has_buf_.assign(n_, false);
  std::vector<int>& uses = uses_;
  uses.assign(n_, 0);
  std::vector<int64_t> cost(n_, 0), depth(n_, 0);
  for (NodeId id = 0; id < n_; ++id)
    for (const ir::Value& v : g_.node(id).operands) uses[v.node]++;
  for (const ir::Value& v : g_.outputs()) has_buf_[v.node] = true;
  mark_attention_chains();
  for (NodeId id = 0; id < n_; ++id) {
    const ir::Node& node = g_.node(id);
    OpKind op = node.op;
    if (stand_in_[id]) has_buf_[id] = true;  // filled by its multi-result node's step
    bool ref = !codegen_supports(g_, id);
    if (op == OpKind::Parameter || op == OpKind::MatMul || op == OpKind::Concat || ref ||
        ir::has_trait(op, ir::kReduce))
      has_buf_[id] = true;
    if (ref) {
      for (size_t k = 0; k < node.operands.size(); ++k) {
        const NodeId x = node.operands[k].node;
        if (has_buf_[x] || !attention_node(id) || !attention_viewed_slot(op, k)) {
          has_buf_[x] = true;
        } else if (!read_in_place(x, [&](NodeId y) {
                     BlasView v;
                     return attention_view(y, &v);
                   })) {
          copy_layout(x);
        }
      }
    } else if (op == OpKind::Reshape && !trivial_reshape(g_, id)) {
      if (!feeds_attention_[id]) has_buf_[node.operands[0].node] = true;
    } else if (op == OpKind::MatMul) {
      for (const ir::Value& v : node.operands) {
        // A layout op over a computed value (the transposed gradient of dW = dY^T X) reads
        // the value stored contiguously, rather than a transposing copy that writes with a
        // stride; a layout that is no strided matrix is copied after all.
        const bool read = read_in_place(v.node, [&](NodeId x) {
          BlasView bv;
          return blas_view(g_, has_buf_, x, &bv);
        });
        if (!read) has_buf_[v.node] = true;
      }
    }
    // Transcendentals expand to ~20 instructions: recomputing them costs code and time.
    const bool heavy = ir::has_trait(op, ir::kCostly);
    int64_t c = heavy ? 12 : 1, dep = 1;
    for (const ir::Value& v : node.operands) {
      c += has_buf_[v.node] ? 0 : cost[v.node];
      dep = std::max(dep, has_buf_[v.node] ? 1 : depth[v.node] + 1);
    }
    // Bounded expressions keep kernels small and the code generator's recursion shallow.
    if (!has_buf_[id] && (dep > 32 || c > 64)) has_buf_[id] = true;
    cost[id] = has_buf_[id] ? 0 : c;
    depth[id] = has_buf_[id] ? 0 : dep;
    // A shared subexpression is recomputed by each consumer unless that costs too much.
    const int64_t limit = node.type.nbytes() >= kRecomputeLargeBytes ? kRecomputeLarge : 8;
    if (!has_buf_[id] && uses[id] > 1 && c > limit && op != OpKind::Constant) {
      has_buf_[id] = true;
      cost[id] = 0;
    }
  }
  settle_attention_inputs();
  plan_epilogues();
  plan_attention_outputs();
  settle_attention_inputs();
  // Slices that are contiguous blocks of a buffer: views into it, not computed.
  view_.assign(n_, 0);
  if (!allow_views_) return;
  for (NodeId id = 0; id < n_; ++id) {
    const ir::Node& node = g_.node(id);
    if (node.op != OpKind::Slice || has_buf_[id] || stand_in_[id] || node.attrs.ints[2] != 1)
      continue;
    NodeId src = node.operands[0].node;
    if (!has_buf_[src]) continue;
    const Shape& xs = g_.node(src).type.shape;
    bool block = true;
    for (int64_t d = 0; d < node.attrs.i; ++d) block = block && xs[d] == 1;
    if (!block) continue;
    view_[id] = 1;
    has_buf_[id] = true;
  }
}
void Planner::assign_buffers() {
  plan_.buf_of.assign(n_, -1);
  for (size_t p = 0; p < g_.params().size(); ++p) {
    NodeId id = g_.params()[p];
    plan_.buf_of[id] = add_buf(BufferInfo::Input, g_.node(id).type, static_cast<int>(p));
  }
  for (NodeId id = 0; id < n_; ++id) {
    if (!has_buf_[id] || plan_.buf_of[id] >= 0 || epilogue_of_product(id)) continue;
    if (view_[id]) {
      const ir::Node& node = g_.node(id);
      int base = plan_.buf_of[node.operands[0].node];
      std::vector<int64_t> st = contiguous_strides(g_.type(node.operands[0]).shape);
      int64_t offset = node.attrs.ints[0] * st[node.attrs.i];
      if (plan_.bufs[base].kind == BufferInfo::View) {
        offset += plan_.bufs[base].offset;
        base = plan_.bufs[base].base;
      }
      plan_.buf_of[id] = add_buf(BufferInfo::View, node.type, -1);
      plan_.bufs.back().base = base;
      plan_.bufs.back().offset = offset;
      continue;
    }
    plan_.buf_of[id] = add_buf(BufferInfo::Temp, g_.node(id).type, -1);
  }
  for (size_t k = 0; k < g_.outputs().size(); ++k) {
    NodeId id = g_.outputs()[k].node;
    BufferInfo& b = plan_.bufs[plan_.buf_of[id]];
    if (b.kind == BufferInfo::Temp) {
      b.kind = BufferInfo::Output;
      b.index = static_cast<int>(k);
      plan_.output_bufs.push_back(plan_.buf_of[id]);
    } else {  // an input, or a value that is already another output: copy it
      int nb = add_buf(BufferInfo::Output, g_.node(id).type, static_cast<int>(k));
      plan_.output_bufs.push_back(nb);
      output_copies_.push_back({id, nb});
    }
  }
  for (const auto& [product, e] : epilogues_) plan_.buf_of[product] = plan_.buf_of[e.end];
}
int Planner::add_buf(BufferInfo::Kind kind, const TensorType& t, int index) {
  plan_.bufs.push_back(BufferInfo{kind, t, index});
  return static_cast<int>(plan_.bufs.size() - 1);
}
void Planner::plan_node(NodeId id) {
  const ir::Node& node = g_.node(id);
  if (stand_in_[id] || epilogue_of_product(id)) return;  // a product runs at its epilogue's end
  if (filled_.count(id)) return;                         // an attention step writes it
  if (auto it = epilogue_end_of_.find(id); it != epilogue_end_of_.end()) {
    plan_product(it->second);
  } else if (node.op == OpKind::MatMul && codegen_supports(g_, id)) {
    plan_product(id);
  } else if (!codegen_supports(g_, id)) {
    Step::Kind kind = ir::has_trait(node.op, ir::kRegion)                      ? Step::Loop
                      : lowering(node.op, node.type.dtype) == Lowering::Native ? Step::Native
                                                                               : Step::Ref;
    Step st{kind, -1, id, {}, {}};
    if (attention_node(id)) {
      attention_views(id, &st);
    } else {
      for (NodeId r : results_of(id)) st.outs.push_back(plan_.buf_of[r]);
    }
    for (int b : st.outs) {
      if (b < 0) continue;
      if (fallback_out_.size() <= static_cast<size_t>(b)) fallback_out_.resize(b + 1, false);
      fallback_out_[b] = kind == Step::Ref || kind == Step::Native;
    }
    plan_.steps.push_back(std::move(st));
  } else if (node.op == OpKind::Concat) {
    plan_concat(id);
  } else if (ir::has_trait(node.op, ir::kReduce)) {
    plan_reduce(id);
  } else {
    Stage s = elementwise_stage(id, plan_.buf_of[id]);
    add_stage(std::move(s));
  }
}
void Planner::plan_product(NodeId id) {
  const ir::Node& node = g_.node(id);
  Step st{Step::MatMul, -1, id, {}, {}, {}};
  for (const ir::Value& v : node.operands) {
    st.views.emplace_back();
    LOOM_ASSERT(blas_view(g_, has_buf_, v.node, &st.views.back()));
  }
  st.out = id;
  if (auto it = epilogues_.find(id); it != epilogues_.end()) {
    st.lib = Library::Onednn;
    st.post = it->second.post;
    st.out = it->second.end;
  } else {
    st.lib = product_library(id, st.views[0].trans, false);
  }
  plan_.steps.push_back(std::move(st));
  plan_.blas_calls++;
}
Library Planner::product_library(NodeId id, bool a_trans, bool epilogue) const {
  const ir::Node& node = g_.node(id);
  const Shape& os = node.type.shape;
  const size_t r = os.size();
  int64_t batches = 1;
  for (size_t d = 0; d + 2 < r; ++d) batches *= os[d];
  return choose_library(node.type.dtype, os[r - 2], os[r - 1],
                        g_.type(node.operands[0]).shape.back(), batches, a_trans, epilogue);
}

}  // namespace detail

Plan make_plan(const ir::Graph& g, const std::vector<std::vector<NodeId>>& results,
               bool allow_views) {
  return detail::Planner(g, results, allow_views).run();
}

ir::Graph split_results(const ir::Graph& g, std::vector<std::vector<NodeId>>* results) {
  ir::Graph out;
  out.reserve(g.size());
  results->clear();
  // first[id]: the new node of old id's result 0; its results k >= 1 follow it in order.
  std::vector<NodeId> first(g.size());
  auto map = [&](ir::Value v) { return ir::Value{first[v.node] + v.index, 0}; };
  auto convert = [&](ir::Value v, DType dt) {
    ir::Node c;
    c.op = OpKind::Convert;
    c.operands.push_back(v);
    c.type = TensorType{dt, out.type(v).shape};
    return ir::Value{out.add(std::move(c)), 0};
  };
  for (NodeId id = 0; id < g.size(); ++id) {
    ir::Node n = g.node(id);
    for (ir::Value& v : n.operands) v = map(v);
    // A half-precision product runs as a float32 one between conversions: BLAS has none,
    // and float32 accumulation rounded once to the result's type is PyTorch's CPU semantics
    // (the reference accumulates in double: the two agree but where float32's rounding
    // error crosses a rounding boundary of the result's type).
    if (n.op == OpKind::MatMul &&
        (n.type.dtype == DType::BFloat16 || n.type.dtype == DType::Float16)) {
      const DType dt = n.type.dtype;
      for (ir::Value& v : n.operands) v = convert(v, DType::Float32);
      n.type.dtype = DType::Float32;
      first[id] = convert(ir::Value{out.add(std::move(n)), 0}, dt).node;
      continue;
    }
    const size_t count = n.num_results();
    std::vector<TensorType> more = n.more_types;
    first[id] = out.add(std::move(n));
    if (count == 1) continue;
    results->resize(out.size() + count - 1);
    (*results)[first[id]].push_back(first[id]);
    for (const TensorType& t : more) {
      ir::Node stand_in;
      stand_in.op = g.node(id).op;
      stand_in.type = t;
      (*results)[first[id]].push_back(out.add(std::move(stand_in)));
    }
  }
  for (ir::Value v : g.outputs()) out.outputs().push_back(map(v));
  results->resize(out.size());
  return out;
}

}  // namespace loom::cpu
