// Inlining: every call node is replaced by a copy of its body, so that the code generator
// fuses across what assume_pure cut apart for tracing. Calls inside an inlined body and
// inside loop bodies are inlined too (a loop body with calls becomes a new region).
#include <memory>
#include <utility>
#include <vector>

#include "passes/passes_impl.h"

namespace loom::passes::detail {

namespace {

bool has_call(const ir::Graph& g);

// Regions with calls inside, rewritten once each (regions are shared between nodes).
using RegionMemo = std::vector<std::pair<const ir::Graph*, std::shared_ptr<const ir::Graph>>>;

std::vector<ir::Value> emit(const ir::Graph& src, std::span<const ir::Value> args, ir::Graph& out,
                            bool top, RegionMemo& memo);

std::shared_ptr<const ir::Graph> inline_region(const std::shared_ptr<const ir::Graph>& r,
                                               RegionMemo& memo) {
  if (!has_call(*r)) return r;
  for (const auto& [from, to] : memo)
    if (from == r.get()) return to;
  auto g = std::make_shared<ir::Graph>();
  g->outputs() = emit(*r, {}, *g, true, memo);
  memo.emplace_back(r.get(), g);
  return g;
}

bool has_call(const ir::Graph& g) {
  for (const ir::Node& n : g.nodes()) {
    if (n.op == ir::OpKind::Call) return true;
    for (const auto& r : n.regions)
      if (has_call(*r)) return true;
  }
  return false;
}

// Appends the nodes of `src` to `out` and returns the values of src's outputs. At the top
// level parameters are kept; inside a body each parameter is the call's operand.
std::vector<ir::Value> emit(const ir::Graph& src, std::span<const ir::Value> args, ir::Graph& out,
                            bool top, RegionMemo& memo) {
  std::vector<std::vector<ir::Value>> vals(src.size());
  for (ir::NodeId id = 0; id < src.size(); ++id) {
    const ir::Node& n = src.node(id);
    if (n.op == ir::OpKind::Parameter && !top) {
      vals[id] = {args[static_cast<size_t>(n.attrs.i)]};
      continue;
    }
    std::vector<ir::Value> operands;
    for (ir::Value v : n.operands) operands.push_back(vals[v.node][v.index]);
    if (n.op == ir::OpKind::Call) {
      vals[id] = emit(*n.regions[0], operands, out, false, memo);
      continue;
    }
    ir::Node copy = n;
    for (size_t k = 0; k < operands.size(); ++k) copy.operands[k] = operands[k];
    for (auto& r : copy.regions) r = inline_region(r, memo);
    ir::NodeId nid = out.add(std::move(copy));
    for (uint32_t r = 0; r < out.node(nid).num_results(); ++r) vals[id].push_back({nid, r});
  }
  std::vector<ir::Value> res;
  for (ir::Value v : src.outputs()) res.push_back(vals[v.node][v.index]);
  return res;
}

class Inline final : public Pass {
 public:
  std::string_view name() const override { return "inline"; }

  bool run(ir::Graph& g) override {
    if (!has_call(g)) return false;
    ir::Graph out;
    out.reserve(g.size());
    RegionMemo memo;
    out.outputs() = emit(g, {}, out, true, memo);
    g = std::move(out);
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> make_inline() { return std::make_unique<Inline>(); }

}  // namespace loom::passes::detail
