// Common-subexpression elimination: the graph is rebuilt through a hash-consing Builder, so
// a node identical to an earlier one (op, operands, attributes, type) becomes that node.
// Multi-result nodes are copied as they are.
#include "loom/ir/builder.h"
#include "passes/passes_impl.h"

namespace loom::passes::detail {

namespace {

class Cse final : public Pass {
 public:
  std::string_view name() const override { return "cse"; }

  bool run(ir::Graph& g) override {
    ir::Graph out;
    out.reserve(g.size());
    ir::Builder b(out, /*hash_cons=*/true);
    std::vector<ir::NodeId> map(g.size());
    for (ir::NodeId id = 0; id < g.size(); ++id) {
      const ir::Node& n = g.node(id);
      if (n.num_results() > 1 || !n.regions.empty()) {
        ir::Node copy = n;
        for (ir::Value& v : copy.operands) v.node = map[v.node];
        map[id] = b.add(std::move(copy));
        continue;
      }
      SmallVector<ir::Value, 3> operands = n.operands;
      for (ir::Value& v : operands) v.node = map[v.node];
      map[id] = b.make(n.op, operands, n.attrs, &n.type).node;
    }
    if (out.size() == g.size()) return false;
    for (ir::Value v : g.outputs()) out.outputs().push_back({map[v.node], v.index});
    g = std::move(out);
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> make_cse() { return std::make_unique<Cse>(); }

}  // namespace loom::passes::detail
