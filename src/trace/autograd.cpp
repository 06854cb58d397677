// Autograd on the pending graph: which nodes may carry gradient, leaves, backward() and the
// functional gradients behind loom::grad and loom::value_and_grad. The VJP rules and the
// sweep are the autodiff room's; this file decides what to differentiate and where the
// gradients go. Backward nodes join the pending graph, so a training step is one graph.
#include "loom/trace/autograd.h"

#include <algorithm>
#include <string_view>

#include "loom/autodiff/autodiff.h"
#include "trace/context.h"
#include "trace/grad_state.h"

namespace loom {

namespace detail {

// The call site of a while loop's body region (control_flow.cpp).
std::string while_site(const ir::Graph* body);

namespace {
// Per thread: the tensors backward() ran from. A second backward() of one of them raises when
// its graph holds a node that saved tensors, as torch without retain_graph. (Per tensor, not
// per node: hash-consing merges the nodes of a forward recomputed before a sync with the old
// ones, which torch would build afresh.)
thread_local std::vector<std::weak_ptr<TensorImpl>> backward_roots;

// Whether torch's node for this op keeps tensors for its backward (its second backward
// raises): not for sums, layout changes, conversions or products with a constant.
bool saves_tensors(const ir::Graph& g, const ir::Node& n) {
  switch (n.op) {
    case ir::OpKind::Add:
    case ir::OpKind::Sub:
    case ir::OpKind::Neg:
    case ir::OpKind::Convert:
    case ir::OpKind::ReduceSum:
    case ir::OpKind::Reshape:
    case ir::OpKind::Permute:
    case ir::OpKind::Expand:
    case ir::OpKind::Slice:
    case ir::OpKind::Concat: return false;
    case ir::OpKind::Mul:
    case ir::OpKind::Div:  // mean's 1/n, gelu's 0.5: composites' constants
      return g.node(n.operands[1].node).op != ir::OpKind::Constant &&
             !(n.op == ir::OpKind::Mul && g.node(n.operands[0].node).op == ir::OpKind::Constant);
    default: return true;
  }
}
// The active nodes that a backward sweep from root visits (up to the wrt values): a while
// loop on the way raises (no reverse rule: its trip count is known only at run time). Returns
// the nodes that save tensors.
std::vector<ir::NodeId> backward_path(const ir::Graph& graph, ir::Value root,
                                      const std::vector<ir::Value>& wrt,
                                      const std::vector<uint8_t>& act, const char* what,
                                      std::vector<uint8_t>& seen) {
  seen.assign(graph.size(), 0);
  for (ir::Value w : wrt) seen[w.node] = 1;
  std::vector<ir::NodeId> stack{root.node}, saving;
  while (!stack.empty()) {
    ir::NodeId id = stack.back();
    stack.pop_back();
    if (seen[id] || !act[id]) continue;
    seen[id] = 1;
    const ir::Node& n = graph.node(id);
    if (n.op == ir::OpKind::Parameter) continue;
    LOOM_CHECK_T(AutodiffError, n.op != ir::OpKind::While, "[", what,
                 "] cannot differentiate through the ", while_site(n.regions[1].get()),
                 ": a while loop has no reverse-mode gradient (its trip count is only known at "
                 "run time; fori_loop with tensor bounds is a while loop). Use fori_loop with "
                 "integer bounds or scan (both differentiable), or detach() what enters the loop");
    if (saves_tensors(graph, n)) saving.push_back(id);
    for (ir::Value v : n.operands) stack.push_back(v.node);
  }
  return saving;
}

}  // namespace

uint8_t GradTape::resolve(ir::NodeId id) {
  if (state_.size() < ctx_.graph_.size()) state_.resize(ctx_.graph_.size(), kUnknown);
  if (state_[id] != kUnknown) return state_[id];
  // Post-order over the unresolved operands (a traced op adds a few nodes at a time).
  std::vector<ir::NodeId> stack{id};
  while (!stack.empty()) {
    ir::NodeId n = stack.back();
    if (state_[n] != kUnknown) {
      stack.pop_back();
      continue;
    }
    bool ready = true, active = false;
    for (ir::Value v : ctx_.graph_.node(n).operands) {
      uint8_t st = state_[v.node];
      if (st == kUnknown) {
        stack.push_back(v.node);
        ready = false;
      }
      active = active || st == kActive;
    }
    if (!ready) continue;
    state_[n] = active ? kActive : kInactive;
    stack.pop_back();
  }
  return state_[id];
}

ir::Value GradTape::identity(ir::Value v) {
  ir::Node n;
  n.op = ir::OpKind::Convert;
  n.operands = {v};
  n.type = ctx_.graph_.type(v);
  return {ctx_.builder_.add(std::move(n)), 0};
}

void GradTape::own_node(TensorImpl& impl) { impl.value = identity(impl.value); }

bool GradTape::active(ir::Value v) { return any_ && resolve(v.node) == kActive; }

ir::Value GradTape::leaf_value(const std::shared_ptr<TensorImpl>& impl) {
  ir::Value v;
  if (impl->pending()) {
    v = impl->value;
  } else if (impl->data_epoch == ctx_.epoch_ && state_.size() > impl->data_value.node &&
             state_[impl->data_value.node] == kActive) {
    return ctx_.stored_layout(*impl, impl->data_value);
  } else {
    // A slot of its own: a parameter node no other tensor shares (of a copy for memory the
    // user may write before the graph runs).
    const bool shared = impl->buffer.shared();
    v = ctx_.data(shared ? snapshot(impl->buffer) : impl->buffer, impl->type);
    ctx_.slots_.back().owner = impl;
    impl->data_value = v;
    impl->data_epoch = shared ? 0 : ctx_.epoch_;
  }
  if (state_.size() < ctx_.graph_.size()) state_.resize(ctx_.graph_.size(), kUnknown);
  if (state_[v.node] != kActive) {
    state_[v.node] = kActive;
    leaves_[v.node] = impl;
  }
  any_ = true;
  return impl->pending() ? v : ctx_.stored_layout(*impl, v);
}

ir::Value GradTape::cut_gradient(ir::Value v) {
  if (!active(v)) return v;
  v = identity(v);
  state_.resize(std::max(state_.size(), ctx_.graph_.size()), kUnknown);
  state_[v.node] = kInactive;
  return v;
}

std::vector<std::pair<ir::NodeId, std::shared_ptr<TensorImpl>>> GradTape::live_leaves(
    ir::NodeId below) {
  std::vector<std::pair<ir::NodeId, std::shared_ptr<TensorImpl>>> r;
  for (auto& [id, w] : leaves_)
    if (auto impl = w.lock(); impl && id <= below) r.emplace_back(id, std::move(impl));
  std::sort(r.begin(), r.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return r;
}

std::vector<Tensor> GradTape::gradients(const Tensor& out, const Tensor& seed,
                                        const std::vector<Tensor>& wrt, const char* what) {
  LOOM_CHECK_T(TraceError, ctx_.scopes_.empty(), "[", what, "] cannot differentiate while tracing ",
               ctx_.scopes_.empty() ? std::string() : ctx_.scopes_.back().where(),
               "; differentiate the result of the call instead");
  LOOM_CHECK(out.defined(), "[", what, "] called on an undefined Tensor");
  TensorImpl& o = *out.impl();
  ctx_.check_owner(o, what);
  LOOM_CHECK_T(AutodiffError, o.scope == 0 && o.pending() && active(o.value), "[", what,
               "] the tensor ", o.type,
               " does not require grad: no tensor it was computed from requires grad "
               "(requires_grad_()), it was computed under NoGradGuard, sync() already ran its "
               "graph (call backward before sync), or it is the result of a compile()d step, "
               "whose graph is cut after it (differentiate inside the step: compile(grad(f))). "
               "Second derivatives (grad of grad) are not supported yet");
  ir::Value s;
  if (!seed.defined()) {
    LOOM_CHECK_T(AutodiffError, o.type.shape.numel() == 1, "[", what,
                 "] a gradient can be created implicitly only for a tensor with one element; "
                 "got ",
                 o.type, ": pass a gradient of that shape");
    s = ctx_.builder_.expand(ctx_.builder_.constant(1, o.type.dtype), o.type.shape);
  } else {
    LOOM_CHECK_T(ShapeError, seed.shape() == o.type.shape, "[", what, "] gradient ",
                 TensorType{seed.dtype(), seed.shape()}, " does not match the tensor ", o.type);
    bool prev = enabled_;
    enabled_ = false;
    s = ctx_.builder_.convert(ctx_.value_of(seed), o.type.dtype);
    enabled_ = prev;
  }
  std::vector<ir::Value> wrt_values;
  for (const Tensor& w : wrt) wrt_values.push_back(ctx_.value_of(w));
  std::vector<uint8_t> act(ctx_.graph_.size(), 0);
  for (ir::NodeId id = 0; id < ctx_.graph_.size(); ++id) act[id] = resolve(id) == kActive;
  std::vector<uint8_t> swept;
  std::vector<ir::NodeId> saving =
      backward_path(ctx_.graph_, o.value, wrt_values, act, what, swept);
  const bool is_backward = std::string_view(what) == "backward";
  bool again = false;
  for (const std::weak_ptr<TensorImpl>& r : backward_roots) again = again || r.lock().get() == &o;
  LOOM_CHECK_T(AutodiffError, !(is_backward && again && !saving.empty()),
               "[backward] trying to backward through the graph a second time: backward() already "
               "ran from this ",
               o.type, " tensor, and its graph's ",
               ir::op_name(ctx_.graph_.node(saving.empty() ? 0 : saving[0]).op),
               " node saved tensors for it (as torch without retain_graph); recompute the "
               "forward for a second backward, or add the losses and call backward() once");
  bool prev = enabled_;
  enabled_ = false;
  std::vector<Tensor> grads;
  try {
    ir::Value roots[] = {o.value}, seeds[] = {s};
    const size_t before = ctx_.graph_.size();
    std::vector<autodiff::Adjoint> adj =
        autodiff::backward(ctx_.builder_, roots, seeds, wrt_values, &act);
    // Gradients carry no gradient themselves (no higher order): the nodes the sweep added are
    // inactive, so wrapping them needs no cut.
    state_.resize(std::max(state_.size(), ctx_.graph_.size()), kUnknown);
    for (size_t id = before; id < ctx_.graph_.size(); ++id) state_[id] = kInactive;
    {
      TraceContext::CompactionHold hold(ctx_);
      for (const autodiff::Adjoint& a : adj) grads.push_back(a ? ctx_.wrap(*a) : Tensor());
    }
    if (is_backward) {
      consumed_.resize(std::max(consumed_.size(), swept.size()), 0);
      for (size_t id = 0; id < swept.size(); ++id) consumed_[id] |= swept[id];
    }
    if (is_backward && !again) {
      std::erase_if(backward_roots, [](const auto& r) { return r.expired(); });
      backward_roots.push_back(o.weak_from_this());
    }
  } catch (...) {
    enabled_ = prev;
    throw;
  }
  enabled_ = prev;
  return grads;
}

void GradTape::backward(const Tensor& out, const Tensor& seed) {
  LOOM_CHECK(out.defined(), "[backward] called on an undefined Tensor");
  ctx_.check_owner(*out.impl(), "backward");
  std::vector<Tensor> wrt;
  std::vector<std::shared_ptr<TensorImpl>> owners;
  const bool pending = out.impl()->pending() && out.impl()->scope == 0;
  for (auto& [id, impl] : live_leaves(pending ? out.impl()->value.node : 0)) {
    // The leaf's node, as a tensor: backward stops there.
    auto view = new_tensor_impl();
    view->type = impl->type;
    view->value = {id, 0};
    view->owner.store(ctx_.id(), std::memory_order_relaxed);
    wrt.emplace_back(std::move(view));
    owners.push_back(impl);
  }
  std::vector<Tensor> grads = gradients(out, seed, wrt, "backward");
  NoGradGuard guard;
  TraceContext::StepState* st = ctx_.step();
  for (size_t k = 0; k < grads.size(); ++k) {
    if (!grads[k].defined()) continue;
    if (st && st->recording) st->touch_grad(*owners[k], false);
    Tensor& g = owners[k]->grad;
    g = g.defined() ? g + grads[k] : grads[k];
  }
}

void GradTape::reset() {
  state_.clear();
  consumed_.clear();
  leaves_.clear();
  any_ = false;
}

void GradTape::remap(const std::vector<ir::NodeId>& remap, size_t fresh_size) {
  std::vector<uint8_t> state(fresh_size, kUnknown);
  for (size_t id = 0; id < state_.size() && id < remap.size(); ++id)
    if (remap[id] != kNoNode) state[remap[id]] = state_[id];
  state_ = std::move(state);
  std::vector<uint8_t> consumed(fresh_size, 0);
  for (size_t id = 0; id < consumed_.size() && id < remap.size(); ++id)
    if (remap[id] != kNoNode) consumed[remap[id]] = consumed_[id];
  consumed_ = std::move(consumed);
  std::unordered_map<ir::NodeId, std::weak_ptr<TensorImpl>> leaves;
  for (auto& [id, w] : leaves_) {
    auto impl = w.lock();
    if (!impl || remap[id] == kNoNode) continue;
    leaves[remap[id]] = w;
  }
  leaves_ = std::move(leaves);
}

}  // namespace detail

NoGradGuard::NoGradGuard() : previous_(detail::TraceContext::get().grad().enabled()) {
  detail::TraceContext::get().grad().set_enabled(false);
}
NoGradGuard::~NoGradGuard() { detail::TraceContext::get().grad().set_enabled(previous_); }

bool grad_enabled() { return detail::TraceContext::get().grad().enabled(); }

namespace detail {
std::vector<Tensor> functional_gradients(const Tensor& out, const std::vector<Tensor>& wrt) {
  return TraceContext::get().grad().gradients(out, Tensor(), wrt, "grad");
}
Tensor fresh_leaf(const Tensor& x) {
  LOOM_CHECK(x.defined(), "[grad] an argument leaf is an undefined Tensor");
  Tensor leaf = x.detach();
  leaf.requires_grad_();  // a pending leaf gets a node of its own: arguments never share one
  return leaf;
}
}  // namespace detail

}  // namespace loom
