// Materialization: the cut of the pending graph for the tensors a read or a sync needs (with
// what a read computes besides them), the run through the runtime, the write-back, and what a
// failed run poisons.
#include <algorithm>
#include <unordered_set>

#include "loom/core/half.h"
#include "loom/ir/op_kind.h"
#include "loom/runtime/metrics.h"
#include "loom/runtime/sync.h"
#include "trace/context.h"

namespace loom::detail {

std::vector<ir::NodeId> TraceContext::collect(const std::vector<ir::Value>& roots) {
  if (mark_.size() < graph_.size()) mark_.resize(graph_.size() * 2, 0);
  if (++stamp_ == 0) {
    std::fill(mark_.begin(), mark_.end(), 0);
    std::fill(slot_mark_.begin(), slot_mark_.end(), 0);
    stamp_ = 1;
  }
  std::vector<ir::NodeId> stack;
  ir::NodeId lo = UINT32_MAX;
  for (ir::Value r : roots) {
    if (mark_[r.node] != stamp_) {
      mark_[r.node] = stamp_;
      stack.push_back(r.node);
    }
  }
  while (!stack.empty()) {
    ir::NodeId id = stack.back();
    stack.pop_back();
    lo = std::min(lo, id);
    for (ir::Value v : graph_.node(id).operands) {
      if (mark_[v.node] != stamp_) {
        mark_[v.node] = stamp_;
        stack.push_back(v.node);
      }
    }
  }
  // Node ids are a topological order: a scan of the marked range beats sorting.
  std::vector<ir::NodeId> order;
  for (ir::NodeId id = lo; id < graph_.size(); ++id)
    if (mark_[id] == stamp_) order.push_back(id);
  return order;
}

ir::Graph TraceContext::cut(const std::vector<TensorImpl*>& impls, std::vector<uint32_t>* slots) {
  std::vector<ir::Value> roots;
  for (TensorImpl* p : impls)
    if (p->pending()) roots.push_back(p->value);
  std::vector<ir::NodeId> order = collect(roots);
  std::vector<ir::NodeId> remap(graph_.size(), kNoNode);
  if (slot_mark_.size() < slots_.size()) {
    slot_mark_.resize(slots_.size() * 2, 0);
    slot_node_.resize(slots_.size() * 2, 0);
  }
  ir::Graph out;
  out.reserve(order.size());
  for (ir::NodeId id : order) {
    const ir::Node& n = graph_.node(id);
    if (n.op == ir::OpKind::Parameter) {
      uint32_t slot = static_cast<uint32_t>(n.attrs.i);
      if (slot_mark_[slot] != stamp_) {  // first use of this slot in the cut
        slot_mark_[slot] = stamp_;
        slot_node_[slot] = out.add(n);
        out.mutable_node(slot_node_[slot]).attrs.i = static_cast<int64_t>(slots->size());
        slots->push_back(slot);
      }
      remap[id] = slot_node_[slot];
      continue;
    }
    remap[id] = out.add(n);
    for (ir::Value& v : out.mutable_node(remap[id]).operands) v.node = remap[v.node];
  }
  for (ir::Value r : roots) out.outputs().push_back({remap[r.node], r.index});
  return out;
}

std::vector<Buffer> TraceContext::bind(const std::vector<uint32_t>& slot_ids,
                                       std::vector<uint8_t>* donated) {
  std::vector<Buffer> inputs;
  inputs.reserve(slot_ids.size());
  // Before the copies below: a buffer only its slot holds belongs to a dead tensor.
  if (donated) {
    donated->clear();
    for (uint32_t s : slot_ids)
      donated->push_back(slots_[s].buffer.defined() && slots_[s].buffer.use_count() == 1);
  }
  for (uint32_t s : slot_ids) {
    DataSlot& d = slots_[s];
    if (d.is_scalar && !d.buffer.defined()) {
      d.buffer = Buffer::allocate(8);
      switch (d.type.dtype) {
        case DType::Float32: *d.buffer.as<float>() = static_cast<float>(d.f); break;
        case DType::Float64: *d.buffer.as<double>() = d.f; break;
        case DType::Int32: *d.buffer.as<int32_t>() = static_cast<int32_t>(d.i); break;
        case DType::Int64: *d.buffer.as<int64_t>() = d.i; break;
        case DType::Bool: *d.buffer.as<uint8_t>() = d.f != 0; break;
        case DType::BFloat16:
          *d.buffer.as<uint16_t>() = float_to_bf16(static_cast<float>(d.f));
          break;
        case DType::Float16:
          *d.buffer.as<uint16_t>() = float_to_f16(static_cast<float>(d.f));
          break;
      }
    }
    inputs.push_back(d.buffer);
  }
  return inputs;
}

Hash128 TraceContext::trace_key(const std::vector<TensorImpl*>& impls) const {
  Hasher128 h;
  h.add(runtime::cache_generation());
  h.add(impls.size());
  for (TensorImpl* p : impls) h.add(builder_.merkle(p->value));
  return h.finish();
}

// A cached plan binds the slots of the cut it was made for: they must still hold those types.
bool TraceContext::cached_plan_fits(const runtime::SyncPlan& plan) const {
  for (size_t k = 0; k < plan.slots.size(); ++k)
    if (plan.slots[k] >= slots_.size() || !(slots_[plan.slots[k]].type == plan.slot_types[k]))
      return false;
  return true;
}

// A partial read also outputs the live pending tensors that are results of nodes its cut
// computes anyway, so reading them next costs no second run (gradients read one by one).
void TraceContext::add_computed(std::vector<TensorImpl*>* impls) {
  size_t pending_count = 0;
  for (const TensorImpl* p = head_.next; p != &head_; p = p->next) ++pending_count;
  if (pending_count == impls->size()) return;
  std::vector<ir::Value> roots;
  for (TensorImpl* p : *impls) roots.push_back(p->value);
  collect(roots);
  std::unordered_set<TensorImpl*> in(impls->begin(), impls->end());
  for (TensorImpl* p = head_.next; p != &head_; p = p->next)
    if (mark_[p->value.node] == stamp_ && !in.count(p)) impls->push_back(p);
}

void TraceContext::materialize(const std::vector<TensorImpl*>& requested, bool all_pending) {
  check_readable("materialize");
  for (TensorImpl* p : requested) {
    check_owner(*p, "materialize");
    if (p->scope != 0) escaped(*p);
    if (p->error) [[unlikely]]
      std::rethrow_exception(p->error);
  }
  double t0 = now_seconds();
  std::vector<TensorImpl*> impls;
  if (all_pending) {
    impls = requested;
  } else {
    // Before add_computed walks the list (the callers hold the requested impls).
    if (has_handoffs_.load(std::memory_order_relaxed)) drain_handoffs();
    std::unordered_set<TensorImpl*> seen;
    for (TensorImpl* p : requested)
      if (p->pending() && seen.insert(p).second) impls.push_back(p);
    if (!impls.empty()) {
      if (step_)
        add_computed(&impls);  // compile(step)'s cuts stay where the step puts them
      else
        add_connected(&impls);
    }
  }
  if (impls.empty()) return;
  flush_counters();
  // A read of the last pending tensors drops the graph too, unless a backward() still to come
  // may differentiate through one of them.
  bool keep = false;
  if (!all_pending && grad_.any())
    for (TensorImpl* p : impls) keep = keep || kept_for_backward(*p);
  const bool full = all_pending || (!keep && full_sync(impls));
  const bool keyed = !converted_;
  Hash128 key = keyed ? trace_key(impls) : Hash128{};
  // The fast path: the outputs' Merkle hashes name the computation, so a hit needs no cut
  // and no fingerprint.
  runtime::SyncHit hit = keyed ? runtime::find_sync(key) : runtime::SyncHit{};
  if (hit && !cached_plan_fits(*hit.plan)) hit = {};
  std::vector<uint8_t> donated;
  std::vector<Buffer> inputs;
  const bool cached = static_cast<bool>(hit);
  if (cached) {
#ifndef NDEBUG
    std::vector<uint32_t> check_slots;
    LOOM_ASSERT(ir::fingerprint(cut(impls, &check_slots)) == hit.plan->fingerprint);
    LOOM_ASSERT(check_slots == hit.plan->slots);
#endif
  } else {
    std::vector<uint32_t> slot_ids;
    ir::Graph g = cut(impls, &slot_ids);
    std::vector<TensorType> types;
    types.reserve(slot_ids.size());
    for (uint32_t s : slot_ids) types.push_back(slots_[s].type);
    runtime::count_sync_seconds(now_seconds() - t0);
    hit = runtime::compile_sync(keyed ? &key : nullptr, g, std::move(slot_ids), std::move(types));
  }
  inputs = bind(hit.plan->slots, full && !hit.plan->calls_host ? &donated : nullptr);
  if (cached) runtime::count_sync_seconds(now_seconds() - t0);
  std::vector<Buffer> out;
  try {
    out = runtime::run_sync(hit, inputs, donated);
  } catch (const ExecError& e) {
    poison(impls, e, hit.plan->slots, donated);
  } catch (...) {
    // A host callback's own exception (a Python error): it propagates as itself, held by the
    // tensors that depend on the callback, as an ExecError would be.
    if (failing_nodes(impls, "pure_callback").empty()) throw;
    poison(impls, std::current_exception(), "pure_callback", hit.plan->slots, donated);
  }
  if (hit.plan->partition) last_partition_ = hit.plan->partition;
  write_back(impls, out, full, hit.plan->partition.get());
  if (!full) warn_growth();
}

bool TraceContext::kept_for_backward(const TensorImpl& p) {
  return grad_.any() && grad_.resolve(p.value.node) == GradTape::kActive &&
         !grad_.consumed(p.value.node);
}

// A partial read outside compile(step) also outputs the live pending tensors connected to what
// it reads, and every tensor updated in place (state: parameters, moments, step counters), so
// that nothing the next step builds on stays pending. Sources (data, constants, iota) and the
// layout changes of nothing but sources (a transposed weight, an expanded constant) are shared
// by unrelated work, so they connect nothing.
void TraceContext::add_connected(std::vector<TensorImpl*>* impls) {
  size_t pending_count = 0;
  for (const TensorImpl* p = head_.next; p != &head_; p = p->next) ++pending_count;
  if (pending_count == impls->size()) return;
  const size_t n = graph_.size();
  std::vector<uint32_t> parent(n);
  std::vector<uint8_t> shared(n, 0);
  auto find = [&](uint32_t x) {
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
  };
  for (ir::NodeId id = 0; id < n; ++id) {
    parent[id] = id;
    const ir::Node& node = graph_.node(id);
    bool all_shared = true;
    for (ir::Value v : node.operands) all_shared = all_shared && shared[v.node];
    switch (node.op) {
      case ir::OpKind::Expand:
      case ir::OpKind::Reshape:
      case ir::OpKind::Permute:
      case ir::OpKind::Convert:
      case ir::OpKind::Slice: shared[id] = all_shared; break;
      default: shared[id] = node.operands.empty();
    }
    if (shared[id]) continue;
    for (ir::Value v : node.operands) {
      if (shared[v.node]) continue;
      uint32_t a = find(id), b = find(v.node);
      if (a != b) parent[std::max(a, b)] = std::min(a, b);
    }
  }
  std::vector<uint8_t> wanted(n, 0);
  for (TensorImpl* p : *impls) wanted[find(p->value.node)] = 1;
  std::unordered_set<TensorImpl*> in(impls->begin(), impls->end());
  for (TensorImpl* p = head_.next; p != &head_; p = p->next)
    if ((wanted[find(p->value.node)] || p->updated_in_place) && !in.count(p)) impls->push_back(p);
}

// A pending graph whose live part is larger at each of several checks in a row (every 16th
// partial read) holds a history no read reaches (a tensor updated in every step and never
// read): said once, as it happens.
void TraceContext::warn_growth() {
  constexpr int kReadsPerCheck = 16, kChecks = 3;
  constexpr size_t kNodes = 2000;
  if (warned_growth_ || ++partial_reads_ % kReadsPerCheck != 0) return;
  std::vector<ir::Value> roots;
  for (const TensorImpl* p = head_.next; p != &head_; p = p->next) roots.push_back(p->value);
  const size_t live = collect(roots).size();
  if (live > live_at_check_) {
    if (growing_checks_++ == 0) grown_from_ = live_at_check_;
  } else {
    growing_checks_ = 0;
  }
  live_at_check_ = live;
  if (growing_checks_ < kChecks || live - grown_from_ < kNodes) return;
  warned_growth_ = true;
  warn(str_cat("the pending graph grew by ", live - grown_from_, " live nodes over the last ",
               growing_checks_ * kReadsPerCheck, " reads (now ", live,
               "; the latest read ran the graph '", runtime::current_graph_name(),
               "'): a tensor updated in every step but never read or synced keeps its whole "
               "history pending, and each read compiles anew. Call loom::sync() (loom.sync() in "
               "Python) once a step, or read that tensor too"));
}

// A failed run: the outputs that depend on the op that failed (found by the "[op]" its error
// names) take the error, with the op's trace site and the graph's name; the other outputs stay
// pending, so later syncs of unrelated work succeed. So do outputs that read a donated input
// (the run may have overwritten it); when the op cannot be told, every output of the run does.
void TraceContext::poison(const std::vector<TensorImpl*>& impls, const ExecError& e,
                          const std::vector<uint32_t>& slot_ids,
                          const std::vector<uint8_t>& donated) {
  const std::string& op = e.op();
  std::string sites;
  for (ir::NodeId id : failing_nodes(impls, op))
    for (const TraceSite& s : sites_)
      if (s.node == id && s.op == op && sites.find(file_line(s.loc)) == std::string::npos)
        sites += (sites.empty() ? "" : ", ") + file_line(s.loc);
  std::string msg = str_cat(e.what(), " (in the graph '", runtime::current_graph_name(), "'");
  if (!sites.empty()) msg += str_cat("; the ", op, " was traced at ", sites);
  msg += ")";
  poison(impls, std::make_exception_ptr(ExecError(op, msg)), op, slot_ids, donated);
}

// The nodes of op `op` in what impls read, and the loops whose bodies hold one with a site.
std::vector<ir::NodeId> TraceContext::failing_nodes(const std::vector<TensorImpl*>& impls,
                                                    const std::string& op) {
  std::vector<ir::Value> roots;
  for (TensorImpl* p : impls) roots.push_back(p->value);
  std::vector<ir::NodeId> failing;
  if (op.empty()) return failing;
  std::vector<uint8_t> in_cut(graph_.size(), 0);
  for (ir::NodeId id : collect(roots)) {
    in_cut[id] = 1;
    if (ir::op_name(graph_.node(id).op) == op) failing.push_back(id);
  }
  for (const TraceSite& s : sites_)
    if (s.op == op && in_cut[s.node] &&
        std::find(failing.begin(), failing.end(), s.node) == failing.end())
      failing.push_back(s.node);
  return failing;
}

void TraceContext::poison(const std::vector<TensorImpl*>& impls, std::exception_ptr error,
                          const std::string& op, const std::vector<uint32_t>& slot_ids,
                          const std::vector<uint8_t>& donated) {
  const std::vector<ir::NodeId> failing = failing_nodes(impls, op);
  std::vector<TensorImpl*> hit;
  if (failing.empty()) {
    hit = impls;
  } else {
    std::vector<uint8_t> failed(graph_.size(), 0), clobbered(slots_.size(), 0);
    for (ir::NodeId id : failing) failed[id] = 1;
    for (size_t k = 0; k < donated.size(); ++k)
      if (donated[k]) clobbered[slot_ids[k]] = 1;
    for (TensorImpl* p : impls) {
      bool depends = false;
      for (ir::NodeId id : collect({p->value})) {
        const ir::Node& n = graph_.node(id);
        depends = depends || failed[id] ||
                  (n.op == ir::OpKind::Parameter && clobbered[static_cast<size_t>(n.attrs.i)]);
      }
      if (depends) hit.push_back(p);
    }
  }
  for (TensorImpl* p : hit) {
    p->error = error;
    p->buffer = Buffer();
    p->value = {kNoNode, 0};
    p->data_epoch = 0;
    if (p->linked.load(std::memory_order_relaxed)) unlink(p);  // the last touch of p
  }
  std::rethrow_exception(error);
}

void TraceContext::note_site(ir::Value v, const CallSite& loc) {
  const CallSite at = user_site(loc);
  if (scopes_.empty()) {
    sites_.push_back({v.node, ir::op_name(graph_.node(v.node).op), at});
  } else {
    Scope& s = scopes_.back();
    s.sites.push_back({v.node, ir::op_name(s.graph->node(v.node).op), at});
  }
}

void TraceContext::note_body_sites(ir::Value v, const std::vector<TraceSite>& body_sites) {
  for (const TraceSite& b : body_sites) {  // a body inside a body: the outer body's sites
    if (scopes_.empty())
      sites_.push_back({v.node, b.op, b.loc});
    else
      scopes_.back().sites.push_back({v.node, b.op, b.loc});
  }
}

// Donation is safe only when this sync materializes every pending tensor: afterwards the
// pending graph, and with it every slot, is dropped.
bool TraceContext::full_sync(const std::vector<TensorImpl*>& impls) const {
  size_t pending_count = 0;
  for (const TensorImpl* p = head_.next; p != &head_; p = p->next) ++pending_count;
  return pending_count == impls.size();
}

void TraceContext::write_back(const std::vector<TensorImpl*>& impls, const std::vector<Buffer>& out,
                              bool all, const runtime::PartitionInfo* partition) {
  std::vector<ir::Value> done_values;
  for (size_t k = 0; k < impls.size(); ++k) {
    TensorImpl* p = impls[k];
    p->sharding = nullptr;
    if (partition && partition->outputs[k])
      p->sharding = std::make_shared<ir::Sharding>(*partition->outputs[k]);
    if (!all && kept_for_backward(*p)) {
      // A value backward() may still differentiate through: it keeps its node (and stays
      // pending), holding the computed buffer for reads.
      p->buffer = out[k];
      done_values.push_back({kNoNode, 0});
      continue;
    }
    done_values.push_back(p->value);
    p->buffer = out[k];
    p->value = {kNoNode, 0};
    p->data_epoch = 0;
    unlink(p);  // the last touch: p may be a dropped handle's impl (out[k] is read below)
  }
  if (all) {
    reset_graph();
    return;
  }
  // Partial: later cuts reuse the computed values instead of recomputing them. The nodes
  // change in place, so Merkle hashes no longer describe the graph until it is reset or
  // compacted: the trace cache stands aside meanwhile.
  for (size_t k = 0; k < impls.size(); ++k) {
    ir::Value v = done_values[k];
    if (v.node == kNoNode) continue;
    ir::Node& n = graph_.mutable_node(v.node);
    if (n.num_results() != 1 || n.op == ir::OpKind::Parameter) continue;
    // A block is no data for the global node: it is recomputed. (Read from the partition, not
    // the impl: the first loop's unlink was the impl's last touch.)
    if (partition && partition->outputs[k]) continue;
    uint32_t slot = static_cast<uint32_t>(slots_.size());
    slots_.push_back(DataSlot{out[k], n.type});
    slot_by_buffer_[out[k].id()] = slot;
    n.op = ir::OpKind::Parameter;
    n.operands.clear();
    n.attrs = ir::Attrs{};
    n.attrs.i = slot;
    converted_ = true;
    maybe_garbage_ = true;  // the node's operands lost a user
  }
}

std::vector<TensorImpl*> TraceContext::pending_impls() const {
  std::vector<TensorImpl*> r;
  for (TensorImpl* p = head_.next; p != &head_; p = p->next) r.push_back(p);
  return r;
}

void TraceContext::sync_all() {
  check_readable("sync");
  if (has_handoffs_.load(std::memory_order_relaxed)) drain_handoffs();  // before the walk
  flush_counters();
  std::vector<TensorImpl*> impls;
  for (TensorImpl* p = head_.next; p != &head_; p = p->next) impls.push_back(p);
  if (impls.empty()) {
    reset_graph();
    return;
  }
  materialize(impls, true);
}

}  // namespace loom::detail
