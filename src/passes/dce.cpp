// Dead-code elimination: keeps what the outputs need, plus every parameter, since the
// parameters are the executable's calling convention even when unused.
#include "passes/passes_impl.h"

namespace loom::passes::detail {

namespace {

class Dce final : public Pass {
 public:
  std::string_view name() const override { return "dce"; }

  bool run(ir::Graph& g) override {
    std::vector<ir::Value> roots = g.outputs();
    const size_t num_outputs = roots.size();
    for (ir::NodeId p : g.params()) roots.push_back({p, 0});
    if (ir::count_live(g, roots) == g.size()) return false;  // the usual case: no copy
    ir::Graph out = ir::prune(g, roots);
    if (out.size() == g.size()) return false;
    out.outputs().resize(num_outputs);  // drop the parameter roots again
    g = std::move(out);
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> make_dce() { return std::make_unique<Dce>(); }

}  // namespace loom::passes::detail
