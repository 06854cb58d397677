// The thread's trace context: the pending graph, its data slots, the list of live pending
// tensors, and materialization (cut, run, write back). Private to the trace room.
//
// Pending values are nodes of one ir::Graph per thread, built by a hash-consing Builder.
// Materialized tensors and host scalars enter it as Parameter nodes whose index attribute is a
// data slot. A sync cuts the part that the requested tensors need into a compact graph whose
// parameters are renumbered in order of appearance, runs it through the runtime, and stores
// the results. The pending graph is garbage-collected (compacted to what live tensors need)
// when it grows, so loops without a sync stay bounded by what is live.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <source_location>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "loom/core/buffer.h"
#include "loom/ir/builder.h"
#include "loom/ir/sharding.h"
#include "loom/runtime/sync.h"
#include "loom/trace/control_flow.h"
#include "loom/trace/ops.h"
#include "loom/trace/tensor.h"
#include "trace/grad_state.h"

namespace loom::detail {

inline constexpr uint32_t kNoNode = UINT32_MAX;
inline constexpr uint32_t kOwnerExited = UINT32_MAX;  // TensorImpl::owner of a thread that ended

struct TensorImpl : std::enable_shared_from_this<TensorImpl> {
  TensorType type;
  Buffer buffer;  // the value, once materialized
  // How `buffer` is laid out over a mesh of the ranks (this rank's block of the global value
  // `type`); null: the whole value (loom/trace/sharding.h).
  std::shared_ptr<const ir::Sharding> sharding;
  ir::Value value{kNoNode, 0};  // the pending value, while pending
  // While materialized: its Parameter node in the pending graph, valid for data_epoch.
  ir::Value data_value{kNoNode, 0};
  uint64_t data_epoch = 0;
  bool requires_grad = false;
  // Updated in place at least once (a parameter, optimizer state, a counter): state that every
  // partial read computes too, so that no history of it stays pending.
  bool updated_in_place = false;
  uint32_t scope = 0;  // the trace scope whose graph holds `value` (0: the pending graph)
  // The id of the thread's TraceContext whose graph holds `value` (kOwnerExited once that
  // thread has ended); while materialized, the one context that may cache data_value (the
  // first to use it). Atomic only because threads may share a materialized tensor.
  std::atomic<uint32_t> owner{0};
  Tensor grad;  // accumulated by backward() (leaves that require grad)
  // Set when the run that would have produced the value failed: reading it rethrows.
  std::exception_ptr error;
  // Intrusive list of pending tensors of the owning context: only its thread touches prev,
  // next and the list. `linked` is atomic because a drop on another thread reads it to decide
  // whether the owner must do the unlinking (the hand-off in context.cpp); the owner's store
  // of false is the last thing it does to an impl it holds no reference to.
  TensorImpl* prev = nullptr;
  TensorImpl* next = nullptr;
  std::atomic<bool> linked{false};

  bool pending() const { return value.node != kNoNode; }
  ~TensorImpl();
};

// Creates a TensorImpl from a per-thread free list (tracing makes and drops one per op;
// the list saves the system allocator's round trip). Blocks freed on another thread join
// that thread's list. The last handle of a pending tensor dropped on a thread other than its
// owner's does not destroy it there: the owner's context receives it and destroys it on its
// own thread (TraceContext::drain_handoffs), so the owner's pending list is never written by
// two threads.
std::shared_ptr<TensorImpl> new_tensor_impl();

// A graph input held by the pending graph: a materialized buffer or a host scalar.
struct DataSlot {
  Buffer buffer;  // undefined for scalars until bound
  TensorType type;
  double f = 0;
  int64_t i = 0;
  bool is_scalar = false;
  bool is_rng = false;                           // a random key: compile's replay draws a fresh one
  std::weak_ptr<TensorImpl> owner;               // the tensor whose data this is (compile's replay)
  std::shared_ptr<const ir::Sharding> sharding;  // the buffer's layout (a block of `type`)
};

// What a traced body reads from outside it: each becomes a parameter of the body's region and
// an operand of the node that runs it, resolved in the enclosing scope when the body closes
// (and again on every assume_pure cache hit).
struct Capture {
  enum Kind { Impl, Scalar, Rng };
  Kind kind = Impl;
  std::shared_ptr<TensorImpl> impl;  // Impl: a tensor of an enclosing scope, or data
  loom::Scalar scalar{0.0};          // Scalar: a host number of a loop body (a graph input)
  DType dtype = DType::Float32;
  ir::Value param;  // its parameter in the scope's graph
};

// The call site of an op that can fail at run time (index_select, gather, ...): the node that
// runs it in the pending graph (the op's own node, or the scan/while node whose body holds
// it) and the op's name, which a run-time error names.
struct TraceSite {
  ir::NodeId node = 0;
  std::string_view op;
  CallSite loc;
};

// "the body of scan called at model.cpp:12 (in main)": a traced body, for error messages.
std::string site_text(const char* api, const char* role, const CallSite& loc);

// A body being traced: its own graph and builder, nested inside the pending graph or
// another scope. Loop bodies (scan, while, fori) forward host scalars and random keys to the
// enclosing scope as inputs; assume_pure bodies bake host scalars in as constants (they are
// part of what the cache assumes) and take random keys as inputs of every call.
struct Scope {
  uint32_t id = 0;
  ScopeKind kind = ScopeKind::Loop;
  // Where the body's tracing tool was called, formatted only for error messages by where().
  const char* api = "";
  const char* role = "";
  CallSite loc{"", "", 0};
  std::string where() const;  // "the body of scan called at model.cpp:12 (in main)"
  std::shared_ptr<ir::Graph> graph;
  std::unique_ptr<ir::Builder> builder;
  std::vector<ir::Value> params;  // the explicit parameters, in order
  std::vector<Capture> captures;
  std::unordered_map<const TensorImpl*, ir::Value> captured;
  ir::Value index{UINT32_MAX, 0};  // the iteration index (i64[]), when the body has one
  bool lazy_index = false;         // index created on demand (while: a hidden counter)
  std::vector<TraceSite> sites;    // of the ops in the body that can fail at run time
};

// A copy of b's bytes (a shared buffer's value at the time an op reads it).
Buffer snapshot(const Buffer& b);

class TraceContext;
// The calling thread's context once created (null before, and after the thread's exit has
// destroyed it). Constant-initialized: reading it needs no TLS wrapper call.
extern constinit thread_local TraceContext* tls_context;
// A new id for a pending graph (process-wide, never reused; tensor_handles.cpp).
uint64_t new_epoch();

class TraceContext {
 public:
  static TraceContext& get() {
    if (TraceContext* c = tls_context) [[likely]]
      return *c;
    return create();
  }
  ~TraceContext();

  // The builder of the innermost scope (the pending graph's outside any body).
  ir::Builder& builder() { return *active_; }
  // This context's id (unique in the process; TensorImpl::owner of its pending tensors).
  uint32_t id() const { return id_; }
  // Tensors belong to the thread that traces them: a TraceError when `impl` is pending in
  // the graph of another thread's context (or of a thread that has exited).
  void check_owner(const TensorImpl& impl, const char* what) const {
    if (impl.pending() && impl.owner.load(std::memory_order_relaxed) != id_) [[unlikely]]
      foreign(impl, what);
  }
  const ir::Graph& graph() const { return graph_; }

  // Trace scopes. push_scope opens a body: later ops record into its graph. `with_index`:
  // the body's first parameter is a loop index (scan). pop_scope closes the innermost one.
  Scope& push_scope(ScopeKind kind, const char* api, const char* role, const CallSite& loc,
                    bool with_index);
  Scope pop_scope();
  bool in_scope() const { return !scopes_.empty(); }
  // Throws a TraceError naming `what` and the innermost body when a value is read while a
  // body is being traced (its values do not exist yet).
  void check_readable(const char* what) const;
  // The iteration index of the innermost loop body (created on demand in while bodies).
  ir::Value loop_index();

  // The graph value of t: its pending node, or a Parameter node for its data. Inline: the
  // common cases (no body open, no autograd leaf, this thread's tensor: a pending one, or
  // data whose node it cached in the current graph).
  ir::Value value_of(const Tensor& t) {
    const TensorImpl* p = t.impl();
    if (p && scopes_.empty() && p->scope == 0 && !p->requires_grad && !p->error &&
        p->owner.load(std::memory_order_relaxed) == id_) [[likely]] {
      if (p->pending()) return p->value;
      if (p->data_epoch == epoch_ && !p->sharding) return p->data_value;
    }
    return value_of_slow(t);
  }
  // A host scalar as a 0-d graph input of dtype dt.
  ir::Value scalar(const Scalar& s, DType dt);
  // A 0-d constant (a number fixed by an op's definition), memoized for the graph's epoch.
  ir::Value constant(double v, DType dt);
  // A host buffer of type t as a graph input (used for rng keys and literal data).
  ir::Value data(Buffer b, const TensorType& t);
  // Wraps a pending value into a new tensor. A wrap may compact the pending graph, which
  // renumbers its nodes: a caller that wraps several raw values one by one holds a
  // CompactionHold meanwhile (the values not yet wrapped would go stale).
  Tensor wrap(ir::Value v);
  const std::shared_ptr<const runtime::PartitionInfo>& last_partition() const {
    return last_partition_;
  }
  void note_partition(std::shared_ptr<const runtime::PartitionInfo> p) {
    last_partition_ = std::move(p);
  }
  // Off while a hold lives; the next wrap after it compacts.
  class CompactionHold {
   public:
    explicit CompactionHold(TraceContext& c) : c_(c) { ++c_.compaction_holds_; }
    ~CompactionHold() { --c_.compaction_holds_; }
    CompactionHold(const CompactionHold&) = delete;
    CompactionHold& operator=(const CompactionHold&) = delete;

   private:
    TraceContext& c_;
  };
  // Makes `impl` pending on v (used by in-place ops); drops its old buffer.
  void rebind(TensorImpl& impl, ir::Value v);

  // Runs what the given tensors need and stores their buffers. `all_pending`: impls are the
  // whole pending list (sync), so they are distinct and the sync is full.
  void materialize(const std::vector<TensorImpl*>& impls, bool all_pending = false);
  void sync_all();
  // The compact graph (and its input slots) that materializing `impls` would run.
  ir::Graph cut(const std::vector<TensorImpl*>& impls, std::vector<uint32_t>* slots);

  void unlink(TensorImpl* impl);
  void link_pending(TensorImpl* impl) { link(impl); }
  // Pending tensors of this context whose last handle was dropped on another thread wait here
  // (undestroyed, still linked) until this thread destroys them: at its next op, sync or read,
  // or when it exits. Thread-safe (a process-wide lock; foreign drops are rare).
  static bool hand_off(TensorImpl* impl);
  void drain_handoffs();
  // The id of the innermost open scope (0: the pending graph).
  uint32_t current_scope() const { return scopes_.empty() ? 0 : scopes_.back().id; }
  // The next random key {seed, offset} as an i64[2] graph input.
  ir::Value next_rng_key();
  void manual_seed(uint64_t seed) {
    seed_ = seed;
    rng_offset_ = 0;
  }
  // Autograd: the tape of the pending graph (loom/trace/autograd.h's state).
  GradTape& grad() { return grad_; }
  // Remembers the call site that traced v (ops that can fail at run time: index_select,
  // gather and what is built on them), so that a failed run names it.
  void note_site(ir::Value v, const CallSite& loc);
  // The sites of a loop body's ops (Scope::sites), for the node v that runs the body.
  void note_body_sites(ir::Value v, const std::vector<TraceSite>& body_sites);

  // compile(): a step being traced. full_graph: reads raise; recording: tensors updated in
  // place are collected (trace_once).
  struct StepState {
    const std::string* name = nullptr;
    bool full_graph = false;
    bool recording = false;
    std::vector<std::shared_ptr<TensorImpl>> updated;
    // Leaves whose grad the step resets or writes, with the grad they had when first touched
    // (the step's start: a sync precedes it); reset: the first touch set it to none.
    struct GradTouch {
      std::shared_ptr<TensorImpl> leaf;
      std::shared_ptr<TensorImpl> start;
      bool reset = false;
    };
    std::vector<GradTouch> grads;
    void touch_grad(TensorImpl& leaf, bool reset);
  };
  StepState* step() { return step_; }
  void set_step(StepState* s) { step_ = s; }
  const std::vector<DataSlot>& slots() const { return slots_; }
  std::vector<TensorImpl*> pending_impls() const;
  // The buffers of data slots (host scalars written into fresh buffers).
  std::vector<Buffer> bind_slots(const std::vector<uint32_t>& slot_ids) {
    return bind(slot_ids, nullptr);
  }
  // A fresh random key {seed, offset} as a buffer (compile's replay).
  Buffer next_rng_buffer();

  // Per-thread trace counters, flushed into the process metrics at each sync.
  void flush_counters();
  int64_t ops_traced = 0;
  int64_t host_scalars = 0;
  uint64_t trace_ticks = 0;

 private:
  friend class GradTape;
  TraceContext();
  static TraceContext& create();
  ir::Value value_of_slow(const Tensor& t);
  // The partitioner's account of the last sharded graph this thread ran (sharding_report).
  std::shared_ptr<const runtime::PartitionInfo> last_partition_;
  ir::Value stored_layout(const TensorImpl& impl, ir::Value param);
  ir::Value scoped_value(const std::shared_ptr<TensorImpl>& impl);
  [[noreturn]] void escaped(const TensorImpl& impl) const;
  [[noreturn]] void foreign(const TensorImpl& impl, const char* what) const;
  Hash128 trace_key(const std::vector<TensorImpl*>& impls) const;
  bool cached_plan_fits(const runtime::SyncPlan& plan) const;
  void add_computed(std::vector<TensorImpl*>* impls);
  void add_connected(std::vector<TensorImpl*>* impls);
  // Whether a read must leave p pending for a backward() still to come.
  bool kept_for_backward(const TensorImpl& p);
  void warn_growth();
  [[noreturn]] void poison(const std::vector<TensorImpl*>& impls, const ExecError& e,
                           const std::vector<uint32_t>& slot_ids,
                           const std::vector<uint8_t>& donated);
  [[noreturn]] void poison(const std::vector<TensorImpl*>& impls, std::exception_ptr error,
                           const std::string& op, const std::vector<uint32_t>& slot_ids,
                           const std::vector<uint8_t>& donated);
  std::vector<ir::NodeId> failing_nodes(const std::vector<TensorImpl*>& impls,
                                        const std::string& op);
  // The input buffers of a cut; `donated`, when given, marks those of dead tensors.
  std::vector<Buffer> bind(const std::vector<uint32_t>& slot_ids, std::vector<uint8_t>* donated);
  bool full_sync(const std::vector<TensorImpl*>& impls) const;
  void write_back(const std::vector<TensorImpl*>& impls, const std::vector<Buffer>& out, bool all,
                  const runtime::PartitionInfo* partition);
  void link(TensorImpl* impl);
  void maybe_compact() {
    if (graph_.size() > gc_threshold_ || has_handoffs_.load(std::memory_order_relaxed)) [[unlikely]]
      collect_garbage();
  }
  void collect_garbage();
  void compact();
  void reset_graph();
  // Marks the nodes that `roots` need (mark_[id] == stamp_); returns them in id order.
  std::vector<ir::NodeId> collect(const std::vector<ir::Value>& roots);

  uint32_t id_;
  std::vector<TensorImpl*> handoffs_;      // guarded by the hand-off lock (context.cpp)
  std::atomic<bool> has_handoffs_{false};  // handoffs_ is not empty (a hint read without it)
  ir::Graph graph_;
  ir::Builder builder_;
  std::vector<DataSlot> slots_;
  std::vector<DataSlot> spare_slots_;  // compact()'s second vector, kept for its capacity
  std::unordered_map<const void*, uint32_t> slot_by_buffer_;
  TensorImpl head_;  // sentinel of the pending list
  size_t gc_threshold_ = 1 << 14;
  // Whether a node may have become garbage since the last compaction walk (a tensor dropped a
  // node nothing uses, an in-place update, a partial read), and the size that walk saw.
  bool maybe_garbage_ = false;
  size_t walked_ = 0;
  int compaction_holds_ = 0;
  // warn_growth's state: partial reads, the live nodes at its last check, checks in a row
  // that found more, and the count they started from.
  uint64_t partial_reads_ = 0;
  size_t live_at_check_ = 0;
  int growing_checks_ = 0;
  size_t grown_from_ = 0;
  bool warned_growth_ = false;
  std::vector<uint32_t> mark_;
  std::vector<uint32_t> slot_mark_, slot_node_;  // per cut: the parameter of each data slot
  uint32_t stamp_ = 0;
  bool converted_ = false;  // nodes were turned into data in place since the last reset
  uint64_t epoch_;  // renewed whenever node ids of the pending graph change; unique in the process
  struct ConstantEntry {
    uint64_t bits, epoch;
    DType dtype;
    ir::Value value;
  };
  std::vector<ConstantEntry> constants_;  // a handful: composites use few distinct numbers
  GradTape grad_{*this};
  // The trace sites of ops that can fail at run time, by node of the pending graph.
  std::vector<TraceSite> sites_;
  std::vector<Scope> scopes_;
  StepState* step_ = nullptr;
  ir::Builder* active_ = &builder_;
  uint32_t next_scope_id_ = 1;
  uint64_t seed_ = 0x5eed;
  uint64_t rng_offset_ = 0;
};

// Reads the cycle counter (cheap enough per recorded op).
uint64_t ticks();
double seconds_per_tick();

}  // namespace loom::detail
