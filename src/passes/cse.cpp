// Common-subexpression elimination: the graph is rebuilt through a hash-consing Builder, so
// a node identical to an earlier one (op, operands, attributes, type) becomes that node.
// Multi-result nodes are copied as they are.
#include <cstring>
#include <vector>

#include "loom/core/hash.h"
#include "loom/ir/builder.h"
#include "passes/passes_impl.h"

namespace loom::passes::detail {

namespace {

// True when two single-result, region-free nodes have the same op, operands, attributes and
// type. Without such a pair the rebuild merges nothing: its first merge, in topological
// order, needs two nodes whose operands are already the same nodes.
bool has_direct_duplicate(const ir::Graph& g) {
  auto hash = [](const ir::Node& n) {
    uint64_t h = static_cast<uint64_t>(n.op) | (static_cast<uint64_t>(n.type.dtype) << 8) |
                 (uint64_t{n.attrs.flag} << 16);
    for (int64_t d : n.type.shape) h = hash_combine(h, static_cast<uint64_t>(d));
    for (ir::Value v : n.operands) h = hash_combine(h, (uint64_t{v.node} << 8) | v.index);
    for (int64_t x : n.attrs.ints) h = hash_combine(h, static_cast<uint64_t>(x));
    h = hash_combine(h, static_cast<uint64_t>(n.attrs.i));
    uint64_t fbits = 0;  // 0.0 and -0.0 compare equal, so they hash alike
    if (n.attrs.f != 0) std::memcpy(&fbits, &n.attrs.f, sizeof fbits);
    return hash_combine(h, fbits);
  };
  // An open-addressing table of (hash, node): one probe sequence per node, no allocation
  // but the table.
  size_t cap = 16;
  while (cap < 2 * g.size()) cap *= 2;
  std::vector<std::pair<uint64_t, ir::NodeId>> table(cap, {0, ir::NodeId(-1)});
  for (ir::NodeId id = 0; id < g.size(); ++id) {
    const ir::Node& n = g.node(id);
    if (n.num_results() != 1 || !n.regions.empty()) continue;
    const uint64_t h = hash(n);
    for (size_t i = h & (cap - 1);; i = (i + 1) & (cap - 1)) {
      auto& [th, tid] = table[i];
      if (tid == ir::NodeId(-1)) {
        table[i] = {h, id};
        break;
      }
      if (th != h) continue;
      const ir::Node& m = g.node(tid);
      if (m.op == n.op && m.type == n.type && m.operands == n.operands && m.attrs == n.attrs)
        return true;
    }
  }
  return false;
}

class Cse final : public Pass {
 public:
  std::string_view name() const override { return "cse"; }

  bool run(ir::Graph& g) override {
    if (!has_direct_duplicate(g)) return false;  // the usual case for a traced graph
    ir::Graph out;
    out.reserve(g.size());
    ir::Builder b(out, /*hash_cons=*/true);
    std::vector<ir::NodeId> map(g.size());
    for (ir::NodeId id = 0; id < g.size(); ++id) {
      const ir::Node& n = g.node(id);
      if (ir::several_results(n.op)) {  // built by make_region: copied (a one-result one too)
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
