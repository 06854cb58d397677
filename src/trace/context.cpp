// The trace context: pending graph, data slots, materialization and garbage collection.
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

namespace {
// The thread's allocation state of tensor impls, in one trivially destructible,
// constant-initialized thread_local: the hot paths (an impl made and dropped per traced op)
// reach it with one TLS address and no wrapper or guard call, which a thread_local with a
// destructor costs on every access. ImplCacheOwner frees the cached blocks at thread exit.
struct ImplCache {
  void** blocks = nullptr;  // free impl blocks (kImplBlock bytes each)
  uint32_t size = 0, cap = 0;
  // Set when the cache is released at thread exit: impls released later in thread exit (weak
  // references held by the trace context) go straight back to the system allocator.
  bool gone = false;
  // The calling thread's context id (0 before its first trace and after it exits).
  uint32_t context_id = 0;
};
constinit thread_local ImplCache impl_cache;
struct ImplCacheOwner {
  bool armed = false;  // set at the first growth: the use that constructs this thread's owner
  ~ImplCacheOwner() {
    ImplCache& c = impl_cache;
    for (uint32_t i = 0; i < c.size; ++i) ::operator delete(c.blocks[i]);
    std::free(c.blocks);
    c.blocks = nullptr;
    c.size = c.cap = 0;
    c.gone = true;
  }
};
thread_local ImplCacheOwner impl_cache_owner;  // constructed at the cache's first growth

// The live contexts by id, for drops on other threads, and the lock that guards every
// context's hand-off list. A context's pending list is detached under it when its thread
// exits, so a dropping thread that finds an impl linked under the lock finds its owner here.
struct HandoffRegistry {
  std::mutex mu;
  std::unordered_map<uint32_t, TraceContext*> live;
};
HandoffRegistry& handoff_registry() {
  static HandoffRegistry r;
  return r;
}

constexpr size_t kImplBlock = 256;  // TensorImpl plus shared_ptr's control block
constexpr uint32_t kImplCacheMax = 4096;

// Keeps a freed block for reuse; false when the cache is full or gone.
bool cache_block(void* p) {
  ImplCache& c = impl_cache;
  if (c.gone) return false;
  if (c.size == c.cap) [[unlikely]] {
    if (c.cap == kImplCacheMax) return false;
    if (c.cap == 0) impl_cache_owner.armed = true;  // registers the release at thread exit
    const uint32_t cap = c.cap ? 2 * c.cap : 64;
    void** grown = static_cast<void**>(std::realloc(c.blocks, cap * sizeof(void*)));
    if (!grown) return false;
    c.blocks = grown;
    c.cap = cap;
  }
  c.blocks[c.size++] = p;
  return true;
}

template <class T>
struct ImplAllocator {
  using value_type = T;
  ImplAllocator() = default;
  template <class U>
  ImplAllocator(const ImplAllocator<U>&) {}  // NOLINT
  T* allocate(size_t n) {
    static_assert(sizeof(T) <= kImplBlock);
    LOOM_ASSERT(n == 1);
    ImplCache& c = impl_cache;
    if (c.size > 0) return static_cast<T*>(c.blocks[--c.size]);  // size is 0 once gone
    return static_cast<T*>(::operator new(kImplBlock));
  }
  // allocate_shared destroys the impl through this (C++20 [util.smartptr.shared.create]). A
  // linked impl of another thread's context is handed to that context instead: it stays
  // alive, and so does its block, which its own weak self-reference (enable_shared_from_this)
  // keeps until the owner runs the destructor.
  void destroy(TensorImpl* p) {
    if (p->linked.load(std::memory_order_acquire) &&
        p->owner.load(std::memory_order_relaxed) != impl_cache.context_id) [[unlikely]]
      if (TraceContext::hand_off(p)) return;
    std::destroy_at(p);
  }
  void deallocate(T* p, size_t) {
    if (!cache_block(p)) ::operator delete(p);
  }
  template <class U>
  bool operator==(const ImplAllocator<U>&) const {
    return true;
  }
};
}  // namespace

std::shared_ptr<TensorImpl> new_tensor_impl() {
  return std::allocate_shared<TensorImpl>(ImplAllocator<TensorImpl>());
}

// Only the owner's thread destroys a linked impl (ImplAllocator::destroy hands the others
// off), so tls_context is the owner.
TensorImpl::~TensorImpl() {
  if (linked.load(std::memory_order_relaxed)) {
    LOOM_ASSERT(tls_context && owner.load(std::memory_order_relaxed) == tls_context->id());
    tls_context->unlink(this);
  }
}

constinit thread_local TraceContext* tls_context = nullptr;

TraceContext& TraceContext::create() {
  thread_local TraceContext ctx;  // sets tls_context
  return ctx;
}

namespace {
// Process-wide: ids of contexts and epochs of pending graphs are never reused, so a tensor's
// cached node (data_value, data_epoch) never matches another thread's graph.
std::atomic<uint32_t> next_context_id{1};
std::atomic<uint64_t> next_epoch{1};
uint64_t new_epoch() { return next_epoch.fetch_add(1, std::memory_order_relaxed); }
}  // namespace

TraceContext::TraceContext()
    : id_(next_context_id.fetch_add(1, std::memory_order_relaxed)),
      builder_(graph_),
      epoch_(new_epoch()) {
  LOOM_ASSERT(id_ != kOwnerExited);
  head_.prev = head_.next = &head_;
  tls_context = this;
  impl_cache.context_id = id_;
  {
    HandoffRegistry& r = handoff_registry();
    std::lock_guard lock(r.mu);
    r.live.emplace(id_, this);
  }
  runtime::prepare_backend();  // created now, it prepares while this thread traces
}

TraceContext::~TraceContext() {
  std::vector<TensorImpl*> handed;
  {
    HandoffRegistry& r = handoff_registry();
    std::lock_guard lock(r.mu);
    // Tensors may outlive the thread's context (static tensors, tensors of other threads):
    // detach them. Under the lock, so a drop on another thread sees them either linked with
    // this context still registered, or unlinked.
    for (TensorImpl* p = head_.next; p != &head_;) {
      TensorImpl* n = p->next;
      p->prev = p->next = nullptr;
      p->owner.store(kOwnerExited, std::memory_order_relaxed);  // its value is never computed
      p->linked.store(false, std::memory_order_release);        // the last write to p
      p = n;
    }
    head_.prev = head_.next = &head_;
    r.live.erase(id_);
    handed.swap(handoffs_);
  }
  for (TensorImpl* p : handed) std::destroy_at(p);  // unlinked above: no list to touch
  tls_context = nullptr;
  impl_cache.context_id = 0;
}

void TraceContext::link(TensorImpl* impl) {
  impl->prev = head_.prev;
  impl->next = &head_;
  head_.prev->next = impl;
  head_.prev = impl;
  impl->owner.store(id_, std::memory_order_relaxed);
  impl->linked.store(true, std::memory_order_relaxed);
}

// Release: once a foreign drop sees false it may destroy impl, so nothing here touches impl
// after the store, and callers that hold no reference to impl unlink it last.
void TraceContext::unlink(TensorImpl* impl) {
  // A dropped node that no node uses may be garbage now (another tensor may still hold it).
  const ir::NodeId n = impl->value.node;
  if (n >= graph_.size() || !builder_.used(n)) maybe_garbage_ = true;
  impl->prev->next = impl->next;
  impl->next->prev = impl->prev;
  impl->prev = impl->next = nullptr;
  impl->linked.store(false, std::memory_order_release);
}

bool TraceContext::hand_off(TensorImpl* impl) {
  HandoffRegistry& r = handoff_registry();
  std::lock_guard lock(r.mu);
  // Read again under the lock: the owner may have unlinked it meanwhile (then this thread
  // destroys it), and an owner that exits detaches its list under this lock.
  if (!impl->linked.load(std::memory_order_acquire)) return false;
  auto it = r.live.find(impl->owner.load(std::memory_order_relaxed));
  LOOM_ASSERT(it != r.live.end());
  it->second->handoffs_.push_back(impl);
  it->second->has_handoffs_.store(true, std::memory_order_relaxed);
  return true;
}

void TraceContext::drain_handoffs() {
  std::vector<TensorImpl*> handed;
  {
    HandoffRegistry& r = handoff_registry();
    std::lock_guard lock(r.mu);
    handed.swap(handoffs_);
    has_handoffs_.store(false, std::memory_order_relaxed);
  }
  // Outside the lock: a destructor may drop other threads' tensors, which takes it.
  for (TensorImpl* p : handed) std::destroy_at(p);  // unlinks p (this is its thread)
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
    return v;
  }
  if (mine && impl.data_epoch == epoch_) return impl.data_value;
  ir::Value v;
  auto it = slot_by_buffer_.find(impl.buffer.id());
  if (it != slot_by_buffer_.end() && slots_[it->second].type == impl.type) {
    v = builder_.parameter(impl.type, it->second);  // hash-consed to the node
  } else {
    slot_by_buffer_[impl.buffer.id()] = static_cast<uint32_t>(slots_.size());
    v = data(impl.buffer, impl.type);
    slots_.back().owner = t.impl_ptr();
  }
  if (mine) {
    impl.data_value = v;
    impl.data_epoch = epoch_;
  }
  return v;
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
  impl.buffer = Buffer();
  impl.error = nullptr;  // a new value replaces a failed one
  impl.value = v;
  impl.updated_in_place = true;
  impl.data_epoch = 0;                           // its old data node no longer holds its value
  if (impl.requires_grad) grad_.own_node(impl);  // a leaf shares its node with no other tensor
  if (!impl.linked.load(std::memory_order_relaxed)) link(&impl);
  maybe_compact();
}

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
  if (hit) {
#ifndef NDEBUG
    std::vector<uint32_t> check_slots;
    LOOM_ASSERT(ir::fingerprint(cut(impls, &check_slots)) == hit.plan->fingerprint);
    LOOM_ASSERT(check_slots == hit.plan->slots);
#endif
    inputs = bind(hit.plan->slots, full ? &donated : nullptr);
    runtime::count_sync_seconds(now_seconds() - t0);
  } else {
    std::vector<uint32_t> slot_ids;
    ir::Graph g = cut(impls, &slot_ids);
    inputs = bind(slot_ids, full ? &donated : nullptr);
    std::vector<TensorType> types;
    types.reserve(slot_ids.size());
    for (uint32_t s : slot_ids) types.push_back(slots_[s].type);
    runtime::count_sync_seconds(now_seconds() - t0);
    hit = runtime::compile_sync(keyed ? &key : nullptr, g, std::move(slot_ids), std::move(types));
  }
  std::vector<Buffer> out;
  try {
    out = runtime::run_sync(hit, inputs, donated);
  } catch (const ExecError& e) {
    poison(impls, e, hit.plan->slots, donated);
  }
  write_back(impls, out, full);
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
  std::string_view what = e.what();
  std::string_view op;
  if (what.size() > 2 && what[0] == '[' && what.find(']') != std::string_view::npos)
    op = what.substr(1, what.find(']') - 1);
  std::vector<ir::Value> roots;
  for (TensorImpl* p : impls) roots.push_back(p->value);
  // The failing nodes: ops of that name, and the loops whose bodies hold one with a site.
  std::vector<ir::NodeId> failing;
  std::vector<uint8_t> in_cut(graph_.size(), 0);
  for (ir::NodeId id : collect(roots)) {
    in_cut[id] = 1;
    if (!op.empty() && ir::op_name(graph_.node(id).op) == op) failing.push_back(id);
  }
  for (const TraceSite& s : sites_)
    if (!op.empty() && s.op == op && in_cut[s.node] &&
        std::find(failing.begin(), failing.end(), s.node) == failing.end())
      failing.push_back(s.node);
  std::string sites;
  for (ir::NodeId id : failing)
    for (const TraceSite& s : sites_)
      if (s.node == id && s.op == op && sites.find(file_line(s.loc)) == std::string::npos)
        sites += (sites.empty() ? "" : ", ") + file_line(s.loc);
  std::string msg = str_cat(what, " (in the graph '", runtime::current_graph_name(), "'");
  if (!sites.empty()) msg += str_cat("; the ", op, " was traced at ", sites);
  msg += ")";
  auto error = std::make_exception_ptr(ExecError(msg));
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
                              bool all) {
  std::vector<ir::Value> done_values;
  for (size_t k = 0; k < impls.size(); ++k) {
    TensorImpl* p = impls[k];
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

void TraceContext::flush_counters() {
  runtime::count_traced(ops_traced, host_scalars,
                        static_cast<double>(trace_ticks) * seconds_per_tick());
  host_scalars = 0;
  ops_traced = 0;
  trace_ticks = 0;
}

}  // namespace loom::detail
