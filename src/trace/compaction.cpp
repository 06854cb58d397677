// Garbage collection and compaction of the pending graph: dropping what no live tensor needs
// and renumbering the rest, so that a loop without syncs keeps a bounded graph.
#include <algorithm>

#include "loom/runtime/metrics.h"
#include "trace/context.h"

namespace loom::detail {

void TraceContext::reset_graph() {
  grad_.reset();
  sites_.clear();
  converted_ = false;
  epoch_ = new_epoch();
  graph_.clear();
  builder_.reindex();
  slots_.clear();
  slot_by_buffer_.clear();
  gc_threshold_ = 1 << 14;
  maybe_garbage_ = false;
  walked_ = 0;
  growing_checks_ = 0;
  live_at_check_ = 0;
}

void TraceContext::collect_garbage() {
  if (has_handoffs_.load(std::memory_order_relaxed)) drain_handoffs();
  if (graph_.size() <= gc_threshold_ || compaction_holds_ != 0) return;
  // Garbage needs a node that nothing uses and no tensor holds. When no tensor dropped such a
  // node and no read cut the graph since the last walk, every node is still needed (a chain
  // like x = x * c + y): skip the walk, up to 4x the size last walked (a backstop for the
  // nodes of an op that threw halfway).
  if (!maybe_garbage_ && graph_.size() < 4 * std::max<size_t>(walked_, 1 << 14)) {
    gc_threshold_ = graph_.size() * 2;
    return;
  }
  compact();
}

void TraceContext::compact() {
  std::vector<TensorImpl*> live;
  std::vector<ir::Value> roots;
  for (TensorImpl* p = head_.next; p != &head_; p = p->next) {
    live.push_back(p);
    roots.push_back(p->value);
  }
  maybe_garbage_ = false;
  walked_ = graph_.size();
  std::vector<ir::NodeId> order = collect(roots);
  if (order.size() * 2 > graph_.size()) {  // mostly live: a copy would free little
    gc_threshold_ = graph_.size() * 2;
    return;
  }
  // In place: the graph's chunks and the slot vectors keep their memory for the nodes the
  // trace adds next (memory the allocator hands back to the system costs a page fault per
  // 4 KiB when it is taken again).
  std::vector<ir::NodeId> remap;
  graph_.compact(order, remap);
  // A slot may have two parameter nodes (a node made data by a partial read, and the node a
  // later use of the materialized tensor adds): it moves once, and both keep it.
  std::vector<uint32_t> slot_remap(slots_.size(), UINT32_MAX);
  spare_slots_.clear();
  for (ir::NodeId id : graph_.params()) {
    ir::Node& n = graph_.mutable_node(id);
    uint32_t& fresh_slot = slot_remap[static_cast<size_t>(n.attrs.i)];
    if (fresh_slot == UINT32_MAX) {
      fresh_slot = static_cast<uint32_t>(spare_slots_.size());
      spare_slots_.push_back(std::move(slots_[n.attrs.i]));
    }
    n.attrs.i = fresh_slot;
  }
  slots_.swap(spare_slots_);
  spare_slots_.clear();
  for (TensorImpl* p : live) p->value.node = remap[p->value.node];
  grad_.remap(remap, graph_.size());
  std::vector<TraceSite> sites;
  for (const TraceSite& s : sites_)
    if (remap[s.node] != kNoNode) sites.push_back({remap[s.node], s.op, s.loc});
  sites_ = std::move(sites);
  slot_by_buffer_.clear();
  for (uint32_t s = 0; s < slots_.size(); ++s)
    if (!slots_[s].is_scalar && slots_[s].buffer.defined())
      slot_by_buffer_[slots_[s].buffer.id()] = s;
  builder_.reindex();  // Merkle hashes describe the graph again
  converted_ = false;
  epoch_ = new_epoch();
  gc_threshold_ = std::max<size_t>(1 << 14, graph_.size() * 2);
  runtime::count_compaction();
}

}  // namespace loom::detail
