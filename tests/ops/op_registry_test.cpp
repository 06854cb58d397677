// The registry test: every op of ops.def has what each room keys by op (STYLE.md, "one op
// list"): a parseable name, a reference kernel, a VJP answer (a rule, or kNoGrad), and a
// declared CPU lowering that the planner follows (computed natively, or a declared fallback
// to the reference kernel). The sample graphs use every op, so a new op without an entry
// fails here rather than at run time.
#include <gtest/gtest.h>

#include <set>

#include "backend/cpu/plan.h"
#include "backend/ref/ref_impl.h"
#include "ir/sample_graphs.h"
#include "loom/autodiff/autodiff.h"
#include "loom/backend/cpu_backend.h"
#include "loom/ir/builder.h"

namespace loom {
namespace {

using ir::OpKind;

std::vector<OpKind> all_ops() {
  std::vector<OpKind> ops;
  for (int k = 0; k < ir::kNumOps; ++k) ops.push_back(static_cast<OpKind>(k));
  return ops;
}

// Every node of a graph and of its regions, recursively.
void each_node(const ir::Graph& g, const std::function<void(const ir::Graph&, ir::NodeId)>& f) {
  for (ir::NodeId id = 0; id < g.size(); ++id) {
    f(g, id);
    for (const auto& r : g.node(id).regions) each_node(*r, f);
  }
}

// Whether a node's regions hold a while loop (which has no reverse rule), at any depth.
bool holds_while(const ir::Node& n) {
  bool found = false;
  for (const auto& r : n.regions)
    each_node(*r,
              [&](const ir::Graph& g, ir::NodeId id) { found |= g.node(id).op == OpKind::While; });
  return found;
}

TEST(OpRegistry, EveryOpHasAUniqueNameThatParses) {
  std::set<std::string_view> names;
  for (OpKind op : all_ops()) {
    const std::string_view name = ir::op_name(op);
    ASSERT_FALSE(name.empty());
    EXPECT_TRUE(names.insert(name).second) << "duplicate name " << name;
    OpKind back{};
    ASSERT_TRUE(ir::parse_op(name, &back)) << name;
    EXPECT_EQ(back, op);
    // Attribute names printed in IR text are never placeholders.
    for (std::string_view a :
         {ir::info(op).ints_name, ir::info(op).i_name, ir::info(op).flag_name, ir::info(op).f_name})
      EXPECT_TRUE(a.empty() || a[0] != '_') << name;
  }
}

TEST(OpRegistry, TheSampleGraphsUseEveryOp) {
  std::set<OpKind> used;
  for (const ir::Graph& g : ir::testing::sample_graphs())
    each_node(g, [&](const ir::Graph& gr, ir::NodeId id) { used.insert(gr.node(id).op); });
  for (OpKind op : all_ops())
    EXPECT_TRUE(used.count(op)) << ir::op_name(op) << " is in no sample graph";
}

TEST(OpRegistry, EveryOpHasAReferenceKernel) {
  for (OpKind op : all_ops()) {
    const bool has = ir::several_results(op) ? detail::ref::find_region_kernel(op) != nullptr
                                             : detail::ref::find_kernel(op) != nullptr;
    EXPECT_TRUE(has) << ir::op_name(op) << " has no reference kernel";
  }
}

// Each differentiable node of the sample graphs gets an adjoint of its operand's type for
// every floating operand; kNoGrad ops give none; while loops, attention_grad (no second
// derivative) and pure_callback (host code: its VJP is the user's, through custom_vjp) refuse.
TEST(OpRegistry, EveryDifferentiableOpHasAVjpRule) {
  std::set<OpKind> checked;
  // The samples and every region graph in them (a call may sit only inside a loop body).
  std::vector<ir::Graph> graphs;
  for (const ir::Graph& sample : ir::testing::sample_graphs()) {
    graphs.push_back(sample);
    each_node(sample, [&](const ir::Graph& g, ir::NodeId id) {
      for (const auto& r : g.node(id).regions) graphs.push_back(*r);
    });
  }
  {  // a call of a float body (the sample's call runs a while loop)
    ir::Graph g;
    ir::Builder b(g);
    const TensorType row{DType::Float32, {3}};
    auto body = ir::testing::region({row, row}, [](ir::Builder& rb, std::vector<ir::Value> p) {
      return std::vector<ir::Value>{rb.binary(OpKind::Mul, p[0], rb.unary(OpKind::Tanh, p[1]))};
    });
    ir::Value ops[] = {b.parameter(row), b.parameter(row)};
    g.outputs() = {b.make_region(OpKind::Call, ops, {}, {body})[0]};
    graphs.push_back(g);
  }
  for (const ir::Graph& sample : graphs) {
    ir::Graph g = sample;
    ir::Builder b(g, /*hash_cons=*/false);
    const ir::NodeId n = static_cast<ir::NodeId>(sample.size());
    for (ir::NodeId id = 0; id < n; ++id) {
      const ir::Node node = g.node(id);
      if (!is_floating(node.type.dtype)) continue;
      std::vector<autodiff::Adjoint> radj;
      for (uint32_t r = 0; r < node.num_results(); ++r) {
        const TensorType t = node.result_type(r);
        radj.push_back(is_floating(t.dtype) ? autodiff::Adjoint{autodiff::zeros(b, t)}
                                            : autodiff::Adjoint{});
      }
      const std::string what(ir::op_name(node.op));
      if (node.op == OpKind::While || node.op == OpKind::AttentionGrad ||
          node.op == OpKind::PureCallback || holds_while(node)) {
        EXPECT_THROW(autodiff::vjp(b, id, radj), AutodiffError) << what;
        continue;
      }
      std::vector<autodiff::Adjoint> adj = autodiff::vjp(b, id, radj);
      ASSERT_EQ(adj.size(), node.operands.size()) << what;
      checked.insert(node.op);
      for (size_t k = 0; k < adj.size(); ++k) {
        const TensorType& ot = g.type(node.operands[k]);
        // A custom VJP (a call with a vjp region) gives adjoints to its arguments only.
        const bool extra =
            node.regions.size() == 2 && static_cast<int64_t>(k) >= node.attrs.ints[1];
        if (ir::has_trait(node.op, ir::kNoGrad) || !is_floating(ot.dtype) || extra) {
          EXPECT_FALSE(adj[k].has_value()) << what << " operand " << k;
        } else if (node.op != OpKind::Parameter) {
          ASSERT_TRUE(adj[k].has_value()) << what << " operand " << k << " got no adjoint";
          EXPECT_EQ(g.type(*adj[k]), ot) << what << " operand " << k;
        }
      }
    }
  }
  for (OpKind op : all_ops()) {
    if (ir::has_trait(op, ir::kNoGrad) || op == OpKind::While || op == OpKind::AttentionGrad ||
        op == OpKind::PureCallback)
      continue;
    EXPECT_TRUE(checked.count(op))
        << ir::op_name(op) << ": no float sample node was differentiated";
  }
}

// The planner runs exactly the declared fallbacks on the reference kernels and the declared
// native ops (indexing, attention) as native steps, and every sample graph compiles on the
// CPU backend.
TEST(OpRegistry, EveryOpLowersOnTheCpuBackendAsDeclared) {
  for (const ir::Graph& sample : ir::testing::sample_graphs()) {
    std::vector<std::vector<ir::NodeId>> results;
    const ir::Graph g = cpu::split_results(sample, &results);
    const cpu::Plan plan = cpu::make_plan(g, results);
    std::set<ir::NodeId> ref_steps, native_steps, stand_ins;
    for (const cpu::Step& st : plan.steps) {
      if (st.kind == cpu::Step::Ref) ref_steps.insert(st.node);
      if (st.kind == cpu::Step::Native) native_steps.insert(st.node);
    }
    for (const auto& rs : results)
      for (size_t k = 1; k < rs.size(); ++k) stand_ins.insert(rs[k]);
    for (ir::NodeId id = 0; id < g.size(); ++id) {
      const ir::Node& node = g.node(id);
      if (plan.buf_of[id] < 0 && node.regions.empty()) continue;  // computed inline
      if (stand_ins.count(id)) continue;  // result k >= 1 of a node, filled by its step
      const cpu::Lowering l = cpu::lowering(node.op, node.type.dtype);
      if (node.op == OpKind::Parameter) continue;
      EXPECT_EQ(ref_steps.count(id) == 1, l == cpu::Lowering::Fallback)
          << ir::op_name(node.op) << " of " << node.type.dtype;
      EXPECT_EQ(native_steps.count(id) == 1, l == cpu::Lowering::Native)
          << ir::op_name(node.op) << " of " << node.type.dtype;
    }
    EXPECT_NO_THROW(backend::make_cpu_backend()->compile(sample, {})) << ir::to_text(sample);
  }
}

}  // namespace
}  // namespace loom
