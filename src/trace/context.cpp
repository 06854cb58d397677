// The trace context: the pending graph and the door to the runtime (values of tensors, data
// slots, constants, random keys, scopes of bodies, in-place rebinding). Handle lifetime is in
// tensor_handles.cpp, materialization in materialize.cpp, compaction in compaction.cpp.
#include "trace/context.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <unordered_set>

#include "loom/core/half.h"
#include "loom/ir/op_kind.h"
#include "loom/runtime/metrics.h"
#include "loom/runtime/sync.h"

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace loom::detail {

uint64_t ticks() {
#if defined(__x86_64__)
  return __rdtsc();
#else
  return static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
#endif
}

double seconds_per_tick() {
  static const double spt = [] {
    double t0 = now_seconds();
    uint64_t c0 = ticks();
    while (now_seconds() - t0 < 0.002) {
    }
    return (now_seconds() - t0) / static_cast<double>(ticks() - c0);
  }();
  return spt;
}

ir::Value TraceContext::data(Buffer b, const TensorType& t) {
  if (!scopes_.empty()) {
    auto impl = new_tensor_impl();
    impl->type = t;
    impl->buffer = std::move(b);
    return scoped_value(impl);
  }
  uint32_t slot = static_cast<uint32_t>(slots_.size());
  slots_.push_back(DataSlot{std::move(b), t});
  return builder_.parameter(t, slot);
}

Buffer snapshot(const Buffer& b) {
  Buffer copy = Buffer::allocate_uninitialized(b.nbytes());
  if (b.nbytes() != 0) std::memcpy(copy.data(), b.data(), b.nbytes());
  return copy;
}

ir::Value TraceContext::value_of_slow(const Tensor& t) {
  LOOM_CHECK(t.defined(), "[trace] an operand is an undefined (default-constructed) Tensor");
  TensorImpl& impl = *t.impl();
  check_owner(impl, "trace");
  if (impl.error) [[unlikely]]
    std::rethrow_exception(impl.error);
  if (!scopes_.empty()) return scoped_value(t.impl_ptr());
  if (impl.scope != 0) escaped(impl);
  if (impl.requires_grad && grad_.enabled()) return grad_.leaf_value(t.impl_ptr());
  if (impl.pending()) return impl.value;
  // A materialized tensor may be shared by threads: only the context that claimed it caches
  // its node in it; the others find it by buffer.
  uint32_t owner = impl.owner.load(std::memory_order_relaxed);
  const bool mine = owner == id_ || (owner == 0 && impl.owner.compare_exchange_strong(owner, id_));
  if (impl.buffer.shared()) [[unlikely]] {
    // Memory the user may refill before the op runs (a reused batch buffer): every use reads
    // a copy of its value now, as torch's eager op would have.
    ir::Value v = data(snapshot(impl.buffer), impl.type);
    slots_.back().owner = t.impl_ptr();
    return stored_layout(impl, v);
  }
  if (mine && impl.data_epoch == epoch_) return stored_layout(impl, impl.data_value);
  ir::Value v;
  auto it = slot_by_buffer_.find(impl.buffer.id());
  if (it != slot_by_buffer_.end() && slots_[it->second].type == impl.type) {
    v = builder_.parameter(impl.type, it->second);  // hash-consed to the node
  } else {
    slot_by_buffer_[impl.buffer.id()] = static_cast<uint32_t>(slots_.size());
    v = data(impl.buffer, impl.type);
    slots_.back().owner = t.impl_ptr();
  }
  if (mine) {  // the parameter: each use adds its stored layout (hash-consed to one node)
    impl.data_value = v;
    impl.data_epoch = epoch_;
  }
  return stored_layout(impl, v);
}

// A sharded tensor's data node: its block, as the stored layout of the global value.
ir::Value TraceContext::stored_layout(const TensorImpl& impl, ir::Value param) {
  if (!impl.sharding) [[likely]]
    return param;
  const ir::Node& p = builder().graph().node(param.node);
  if (scopes_.empty() && p.op == ir::OpKind::Parameter)
    slots_[static_cast<size_t>(p.attrs.i)].sharding = impl.sharding;
  return builder().make(ir::OpKind::Shard, std::span<const ir::Value>(&param, 1),
                        ir::encode_sharding(*impl.sharding, /*stored=*/true));
}

// Inside a body: its own tensors are its values; anything else (a tensor of an enclosing
// scope or the pending graph, or data) becomes a captured parameter, once per tensor.
ir::Value TraceContext::scoped_value(const std::shared_ptr<TensorImpl>& impl) {
  Scope& s = scopes_.back();
  if (impl->scope == s.id) return impl->value;
  if (impl->scope != 0) {
    bool open = false;
    for (const Scope& o : scopes_) open = open || o.id == impl->scope;
    if (!open) escaped(*impl);
  }
  auto it = s.captured.find(impl.get());
  if (it != s.captured.end()) return it->second;
  Capture c;
  c.kind = Capture::Impl;
  c.impl = impl;
  c.param = s.builder->parameter(impl->type);
  s.captures.push_back(c);
  s.captured.emplace(impl.get(), c.param);
  return c.param;
}

void TraceContext::foreign(const TensorImpl& impl, const char* what) const {
  const bool exited = impl.owner.load(std::memory_order_relaxed) == kOwnerExited;
  throw TraceError(str_cat(
      "[", what, "] this tensor ", impl.type,
      " is pending in the trace of another thread; sync() it on that thread first, or pass "
      "materialized tensors between threads",
      exited ? " (the thread that traced it has exited, so its value was never computed)" : ""));
}

void TraceContext::escaped(const TensorImpl& impl) const {
  throw TraceError(
      str_cat("[trace] a tensor ", impl.type,
              " created while tracing a loop body or an assume_pure "
              "function is used outside of it, where it has no value; return it from the function "
              "instead (scan ys, a carry, or the function's result)"));
}

std::string site_text(const char* api, const char* role, const CallSite& loc) {
  return str_cat("the ", role, " of ", api, " called at ", file_line(loc), " (in ", loc.function,
                 ")");
}

std::string Scope::where() const { return site_text(api, role, loc); }

Scope& TraceContext::push_scope(ScopeKind kind, const char* api, const char* role,
                                const CallSite& loc, bool with_index) {
  LOOM_CHECK_T(TraceError, scopes_.size() < 64, "[trace] more than 64 nested bodies while tracing ",
               site_text(api, role, loc));
  Scope& s = scopes_.emplace_back();
  s.id = next_scope_id_++;
  s.kind = kind;
  s.api = api;
  s.role = role;
  s.loc = loc;
  s.graph = std::make_shared<ir::Graph>();
  s.builder = std::make_unique<ir::Builder>(*s.graph);
  if (with_index) {
    s.index = s.builder->parameter(TensorType{DType::Int64, {}});
    s.params.push_back(s.index);
  }
  active_ = s.builder.get();
  return s;
}

Scope TraceContext::pop_scope() {
  LOOM_ASSERT(!scopes_.empty());
  Scope s = std::move(scopes_.back());
  scopes_.pop_back();
  active_ = scopes_.empty() ? &builder_ : scopes_.back().builder.get();
  return s;
}

void TraceContext::check_readable(const char* what) const {
  if (step_ && step_->full_graph)
    throw TraceError(
        str_cat("[", what, "] the compiled step '", *step_->name,
                "' has full_graph = true, but reading a tensor's value inside it forces "
                "a graph cut; return the tensor from the step and read it after"));
  if (scopes_.empty()) return;
  throw TraceError(str_cat("[", what, "] cannot read a tensor's value while tracing ",
                           scopes_.back().where(),
                           ": the body is traced once and its values do not exist yet; return "
                           "the tensor from the function and read it after the call"));
}

ir::Value TraceContext::loop_index() {
  for (size_t k = scopes_.size(); k-- > 0;) {
    Scope& s = scopes_[k];
    if (s.kind != ScopeKind::Loop) continue;
    LOOM_ASSERT(k + 1 == scopes_.size());
    if (s.index.node == kNoNode) {
      s.index = s.builder->parameter(TensorType{DType::Int64, {}});
      s.lazy_index = true;
    }
    return s.index;
  }
  LOOM_ASSERT(false);
  return {};
}

ir::Value TraceContext::constant(double v, DType dt) {
  if (!scopes_.empty()) return active_->constant(v, dt);
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  for (ConstantEntry& e : constants_)
    if (e.bits == bits && e.dtype == dt && e.epoch == epoch_) return e.value;
  ir::Value c = builder_.constant(v, dt);
  if (constants_.size() >= 32) constants_.erase(constants_.begin());
  constants_.push_back({bits, epoch_, dt, c});
  return c;
}

ir::Value TraceContext::scalar(const Scalar& s, DType dt) {
  if (!scopes_.empty()) {
    Scope& sc = scopes_.back();
    // assume_pure: the number is part of what the cache assumes (the purity check compares it).
    if (sc.kind == ScopeKind::Pure)
      return sc.builder->constant(s.is_int ? static_cast<double>(s.ivalue) : s.value, dt);
    Capture c;
    c.kind = Capture::Scalar;
    c.scalar = s;
    c.dtype = dt;
    c.param = sc.builder->parameter(TensorType{dt, {}});
    sc.captures.push_back(c);
    return c.param;
  }
  uint32_t slot = static_cast<uint32_t>(slots_.size());
  DataSlot& d = slots_.emplace_back();
  d.type.dtype = dt;
  d.f = s.value;
  d.i = s.is_int ? s.ivalue : static_cast<int64_t>(s.value);
  d.is_scalar = true;
  ++host_scalars;
  return builder_.unique_parameter(d.type, slot);  // a fresh slot: no other node reads it
}

ir::Value TraceContext::next_rng_key() {
  if (!scopes_.empty()) {
    Scope& sc = scopes_.back();
    Capture c;
    c.kind = Capture::Rng;
    c.param = sc.builder->parameter(TensorType{DType::Int64, {2}});
    sc.captures.push_back(c);
    if (sc.kind == ScopeKind::Pure) return c.param;  // a fresh key operand on every call
    // A loop body draws from key {seed, offset * M + i + 1} in iteration i: fresh numbers
    // in every iteration (M odd, so distinct iterations give distinct offsets).
    ir::Builder& b = *sc.builder;
    constexpr double kMix = static_cast<double>(0x9E3779B97F4A7ULL);  // odd, exact in double
    ir::Value seed = b.slice(c.param, 0, 0, 1), offset = b.slice(c.param, 0, 1, 2);
    ir::Value i1 = b.binary(ir::OpKind::Add, loop_index(), b.constant(1, DType::Int64));
    ir::Value mixed =
        b.binary(ir::OpKind::Add, b.binary(ir::OpKind::Mul, offset, b.constant(kMix, DType::Int64)),
                 b.reshape(i1, Shape{1}));
    ir::Value parts[] = {seed, mixed};
    return b.concat(parts, 0);
  }
  ir::Value v = data(next_rng_buffer(), TensorType{DType::Int64, {2}});
  slots_.back().is_rng = true;
  return v;
}

void TraceContext::StepState::touch_grad(TensorImpl& leaf, bool reset) {
  for (const GradTouch& t : grads)
    if (t.leaf.get() == &leaf) return;
  grads.push_back({leaf.shared_from_this(),
                   leaf.grad.defined() ? leaf.grad.impl()->shared_from_this() : nullptr, reset});
}

Buffer TraceContext::next_rng_buffer() {
  Buffer b = Buffer::allocate(16);
  b.as<int64_t>()[0] = static_cast<int64_t>(seed_);
  b.as<int64_t>()[1] = static_cast<int64_t>(rng_offset_++);
  return b;
}

Tensor TraceContext::wrap(ir::Value v) {
  auto impl = new_tensor_impl();
  if (!scopes_.empty()) {  // a body's tensor: not pending work of the thread
    impl->type = scopes_.back().graph->type(v);
    impl->value = v;
    impl->scope = scopes_.back().id;
    impl->owner.store(id_, std::memory_order_relaxed);
    return Tensor(std::move(impl));
  }
  if (grad_.any() && !grad_.enabled()) v = grad_.cut_gradient(v);  // NoGradGuard: no gradient flows
  impl->type = graph_.type(v);
  impl->value = v;
  link(impl.get());
  maybe_compact();
  return Tensor(std::move(impl));
}

void TraceContext::rebind(TensorImpl& impl, ir::Value v) {
  check_owner(impl, "in-place");
  if (!scopes_.empty()) {
    LOOM_CHECK_T(TraceError, impl.scope == scopes_.back().id, "[in-place] cannot update a tensor ",
                 impl.type, " from outside ", scopes_.back().where(),
                 " in place inside it: pass it in the carry and return its new value");
    impl.buffer = Buffer();
    impl.value = v;
    return;
  }
  if (impl.scope != 0) escaped(impl);
  LOOM_ASSERT(graph_.type(v) == impl.type);
  maybe_garbage_ = true;  // the old value may be needed by nothing now
  if (step_ && step_->recording && !impl.pending())
    step_->updated.push_back(impl.shared_from_this());
  if (grad_.any() && grad_.resolve(v.node) == GradTape::kActive) {
    LOOM_CHECK_T(AutodiffError, !(grad_.enabled() && impl.requires_grad),
                 "[in-place] a leaf tensor ", impl.type,
                 " that requires grad cannot be updated in place outside NoGradGuard (its "
                 "gradient would refer to the old value); update it under loom::NoGradGuard");
    if (!grad_.enabled()) v = grad_.cut_gradient(v);
  }
  if (impl.sharding && !impl.pending())  // an update keeps a sharded tensor's layout
    v = builder_.make(ir::OpKind::Shard, std::span<const ir::Value>(&v, 1),
                      ir::encode_sharding(*impl.sharding, /*stored=*/false));
  impl.buffer = Buffer();
  impl.sharding = nullptr;
  impl.error = nullptr;  // a new value replaces a failed one
  impl.value = v;
  impl.updated_in_place = true;
  impl.data_epoch = 0;                           // its old data node no longer holds its value
  if (impl.requires_grad) grad_.own_node(impl);  // a leaf shares its node with no other tensor
  if (!impl.linked.load(std::memory_order_relaxed)) link(&impl);
  maybe_compact();
}

void TraceContext::flush_counters() {
  runtime::count_traced(ops_traced, host_scalars,
                        static_cast<double>(trace_ticks) * seconds_per_tick());
  host_scalars = 0;
  ops_traced = 0;
  trace_ticks = 0;
}

}  // namespace loom::detail
