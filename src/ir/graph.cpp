// Graph storage and pruning. prune runs on every sync of a lazy tensor, so it makes one
// backward marking sweep (operands always precede their users) and one forward copy.
#include "loom/ir/graph.h"

#include <cstring>
#include <limits>

#include "loom/core/error.h"

namespace loom::ir {

bool operator==(const Attrs& a, const Attrs& b) {
  // f compares by bits: a NaN constant equals itself, and 0.0 differs from -0.0.
  return a.i == b.i && a.flag == b.flag && std::memcmp(&a.f, &b.f, sizeof a.f) == 0 &&
         a.ints == b.ints;
}

NodeId Graph::add(Node&& n) {
  auto id = static_cast<NodeId>(nodes_.size());
  if (n.op == OpKind::Parameter) params_.push_back(id);
  nodes_.push_back(std::move(n));
  return id;
}

Node& Graph::emplace_back(OpKind op) {
  auto id = static_cast<NodeId>(nodes_.size());
  if (op == OpKind::Parameter) params_.push_back(id);
  Node& n = nodes_.emplace_back();
  n.op = op;
  return n;
}

void Graph::pop_back() {
  if (nodes_.back().op == OpKind::Parameter) params_.pop_back();
  nodes_.pop_back();
}

void Graph::clear() {
  nodes_.clear();
  params_.clear();
  outputs_.clear();
}

namespace {
// Marks map[id] = 1 for every node the roots need (map: zeros of g.size()); returns how many.
size_t mark_live(const Graph& g, std::span<const Value> roots, std::vector<NodeId>& map) {
  for (Value v : roots) {
    LOOM_ASSERT(v.node < g.size());
    map[v.node] = 1;
  }
  size_t live = 0;
  for (size_t id = g.size(); id-- > 0;) {
    if (!map[id]) continue;
    ++live;
    for (Value v : g.node(static_cast<NodeId>(id)).operands) map[v.node] = 1;
  }
  return live;
}
}  // namespace

size_t count_live(const Graph& g, std::span<const Value> roots) {
  std::vector<NodeId> map(g.size(), 0);
  return mark_live(g, roots, map);
}

Graph prune(const Graph& g, std::span<const Value> roots, bool renumber_params,
            std::vector<NodeId>* remap) {
  constexpr NodeId kDropped = std::numeric_limits<NodeId>::max();
  const size_t n = g.size();
  // One table marks and then remaps: 0 = dead, 1 = live, then the new id (or kDropped).
  std::vector<NodeId> map(n, 0);
  const size_t live = mark_live(g, roots, map);
  Graph out;
  if (live == n && !renumber_params) {  // nothing to drop: a plain copy is the fastest
    out = g;
    out.outputs().assign(roots.begin(), roots.end());
    if (remap) {
      remap->resize(n);
      for (size_t id = 0; id < n; ++id) (*remap)[id] = static_cast<NodeId>(id);
    }
    return out;
  }
  out.reserve(live);
  int64_t next_param = 0;
  for (size_t id = 0; id < n; ++id) {
    if (!map[id]) {
      map[id] = kDropped;
      continue;
    }
    // Copy straight into the arena, then rewire: one Node copy per kept node.
    NodeId new_id = out.add(g.node(static_cast<NodeId>(id)));
    Node& node = out.mutable_node(new_id);
    for (Value& v : node.operands) v.node = map[v.node];
    if (node.op == OpKind::Parameter && renumber_params) node.attrs.i = next_param++;
    map[id] = new_id;
  }
  out.outputs().reserve(roots.size());
  for (Value v : roots) out.outputs().push_back({map[v.node], v.index});
  if (remap) *remap = std::move(map);
  return out;
}

}  // namespace loom::ir
