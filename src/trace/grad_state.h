// The autograd tape of the thread's pending graph: which nodes may carry gradient, the leaves,
// grad mode, and backward() / gradients(). Private to the trace room; one per TraceContext,
// which it reads (graph, builder, slots) as a friend. Thread-safety: per thread, like its
// context.
//
// A node is "active" when it depends on a leaf that requires grad, resolved lazily when a
// tensor is wrapped (grad mode on); leaves are the parameters of such tensors (a slot of their
// own) or pending tensors marked by requires_grad_. Under NoGradGuard a result that would be
// active is cut off by an identity node, so hash-consing never shares a node between modes.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "loom/ir/graph.h"
#include "loom/trace/tensor.h"

namespace loom::detail {

class TraceContext;
struct TensorImpl;

class GradTape {
 public:
  enum : uint8_t { kUnknown = 0, kActive = 1, kInactive = 2 };
  explicit GradTape(TraceContext& ctx) : ctx_(ctx) {}

  bool enabled() const { return enabled_; }
  void set_enabled(bool on) { enabled_ = on; }
  // A leaf entered the pending graph since its last reset.
  bool any() const { return any_; }
  bool active(ir::Value v);
  // The node's state, resolving it (and its unresolved operands) on first use.
  uint8_t resolve(ir::NodeId id);
  // The value of a tensor that requires grad, made a leaf (its own data slot when materialized).
  ir::Value leaf_value(const std::shared_ptr<TensorImpl>& impl);
  // An identity node of v that is never merged with another node.
  ir::Value identity(ir::Value v);
  // Gives a pending tensor a node of its own, so that a leaf made of it shares its node with
  // no other tensor.
  void own_node(TensorImpl& impl);
  // v, or, when v is active, an identity of it that carries no gradient.
  ir::Value cut_gradient(ir::Value v);
  // Adjoints of `wrt` (leaves) for out with seed (undefined: ones, out must have one element).
  std::vector<Tensor> gradients(const Tensor& out, const Tensor& seed,
                                const std::vector<Tensor>& wrt, const char* what);
  // backward(): accumulates into the grad of every live leaf that out depends on.
  void backward(const Tensor& out, const Tensor& seed);

  // Whether a backward() ran through the node: torch frees that graph, so a read need not keep
  // the node's tensors pending for a later backward.
  bool consumed(ir::NodeId id) const { return id < consumed_.size() && consumed_[id]; }
  // The pending graph was dropped, or compacted (remap: old id -> new id or kNoNode).
  void reset();
  void remap(const std::vector<ir::NodeId>& remap, size_t fresh_size);

 private:
  std::vector<std::pair<ir::NodeId, std::shared_ptr<TensorImpl>>> live_leaves(ir::NodeId below);

  TraceContext& ctx_;
  std::vector<uint8_t> state_;     // per node of the pending graph
  std::vector<uint8_t> consumed_;  // per node: a backward() swept through it
  std::unordered_map<ir::NodeId, std::weak_ptr<TensorImpl>> leaves_;
  bool enabled_ = true;
  bool any_ = false;
};

}  // namespace loom::detail
