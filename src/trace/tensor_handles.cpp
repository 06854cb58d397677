// Tensor handles' lifetime: the per-thread free lists of impls, the hand-off of pending impls
// dropped on another thread, the context's creation and exit, and the list of pending tensors.
#include <mutex>
#include <unordered_map>
#include <vector>

#include "trace/context.h"

namespace loom::detail {

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
}  // namespace

uint64_t new_epoch() { return next_epoch.fetch_add(1, std::memory_order_relaxed); }

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

}  // namespace loom::detail
