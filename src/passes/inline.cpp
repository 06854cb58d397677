// Inlining: every call node of the graph (not those inside loop bodies, which run as
// regions) is replaced by a copy of its body, so that the code generator fuses across what
// assume_pure cut apart for tracing. Calls inside an inlined body are inlined too.
#include "passes/passes_impl.h"

namespace loom::passes::detail {

namespace {

// Appends the nodes of `src` to `out` and returns the values of src's outputs. At the top
// level parameters are kept; inside a body each parameter is the call's operand.
std::vector<ir::Value> emit(const ir::Graph& src, std::span<const ir::Value> args, ir::Graph& out,
                            bool top) {
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
      vals[id] = emit(*n.regions[0], operands, out, false);
      continue;
    }
    ir::Node copy = n;
    for (size_t k = 0; k < operands.size(); ++k) copy.operands[k] = operands[k];
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
    bool any = false;
    for (const ir::Node& n : g.nodes()) any = any || n.op == ir::OpKind::Call;
    if (!any) return false;
    ir::Graph out;
    out.reserve(g.size());
    out.outputs() = emit(g, {}, out, true);
    g = std::move(out);
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> make_inline() { return std::make_unique<Inline>(); }

}  // namespace loom::passes::detail
