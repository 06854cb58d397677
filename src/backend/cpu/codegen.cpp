// Code generation: one LLVM function per kernel, all kernels of a plan in one module.
#include "backend/cpu/codegen.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "backend/cpu/codegen_impl.h"
#include "backend/cpu/epilogue.h"
#include "backend/cpu/jit.h"
#include "backend/cpu/math.h"
#include "backend/cpu/thread_pool.h"
#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/Intrinsics.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/Module.h"
#include "loom/core/error.h"
#include "loom/core/philox.h"
#include "loom/core/profile.h"

namespace loom::cpu {

thread_local backend::CodeInfo* t_code_info = nullptr;

namespace {

using ir::OpKind;
using llvm::Value;

struct Cache {
  std::mutex mu;
  // Entries are never removed: programs hold their addresses.
  std::unordered_map<std::string, std::unique_ptr<KernelCode>> fns;
  // Kernels another compile_kernels call is compiling now (a loop's regions compile beside
  // their program's kernels, and separate threads trace at once): a call that needs one
  // waits for it after compiling its own, rather than compiling it a second time.
  std::unordered_map<std::string, std::shared_future<KernelCode*>> in_flight;
  KernelCacheStats stats;
  // The entry for `text` holding `fn`, unless another compile stored one first (then its entry;
  // `fresh` tells which). Called with `mu` held.
  KernelCode* enter(const std::string& text, void* fn, bool* fresh) {
    auto [it, added] = fns.try_emplace(text, nullptr);
    if (added) {
      it->second = std::make_unique<KernelCode>();
      it->second->fn.store(reinterpret_cast<KernelFn>(fn), std::memory_order_release);
    }
    (added ? stats.compiled : stats.raced)++;
    *fresh = added;
    return it->second.get();
  }
};
Cache& cache() {
  static Cache c;
  return c;
}

// The optimized IR kept for tier-ups, in all: past this, new modules keep none (and stay fast
// code).
constexpr size_t kMaxKeptBitcode = size_t{64} << 20;
std::atomic<size_t> g_kept_bitcode{0};
std::atomic<int64_t> g_tier_up_us{-1};  // -1: LOOM_TIER_UP_MS not read yet
std::atomic<int64_t> g_tier_ups{0};

}  // namespace

// A fast module that can tier up: its optimized IR, the kernels it defines and their run time.
struct TierUp {
  std::atomic<int64_t> ran_ns{0};
  std::string bitcode;
  std::optional<Hash128> key;      // where its tiered-up code goes in the persistent cache
  std::vector<std::string> names;  // the functions to take from it, in order of `codes`
  std::vector<KernelCode*> codes;
  std::atomic<bool> requested{false};
};

namespace {

// The tier-up thread. Made after a full-selector compile has built LLVM's code generator tables, so
// it is destroyed before them, and stopped at exit: a compile still running as exit destroyed them
// crashed (docs/architecture.md, "Measurements": TierUpWorker).
class TierUpWorker {
 public:
  static TierUpWorker& get() {
    static const bool built = (build_code_generator_tables(), true);
    (void)built;
    static TierUpWorker w;
    return w;
  }
  // Serves no more requests and waits for the one being served (idempotent).
  void stop_and_wait() {
    std::unique_lock lock(mu_);
    stop_ = true;
    wake_.notify_all();
    idle_.wait(lock, [&] { return !busy_ || owner_ != ::getpid(); });
  }
  void push(TierUp* t) {
    std::lock_guard lock(mu_);
    queue_.push_back(t);
    if (!thread_) {
      owner_ = ::getpid();
      thread_ = std::make_unique<std::thread>([this] {
        // Only cycles nothing else wants: the pool's threads and the caller's keep their cores.
        sched_param none{};
        pthread_setschedparam(pthread_self(), SCHED_IDLE, &none);
        loop();
      });
    }
    wake_.notify_one();
  }
  void wait_idle() {
    std::unique_lock lock(mu_);
    if (thread_ && owner_ != ::getpid()) return;  // a forked child: never served
    idle_.wait(lock, [&] { return queue_.empty() && !busy_; });
  }
  ~TierUpWorker() {
    stop_and_wait();
    if (!thread_) return;
    if (owner_ == ::getpid())
      thread_->join();
    else
      (void)thread_.release();  // the parent's thread: not this process's to join or detach
  }

 private:
  void loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      TierUp* t = queue_.front();
      queue_.pop_front();
      busy_ = true;
      lock.unlock();
      if (generate(*t)) std::atexit([] { TierUpWorker::get().stop_and_wait(); });
      lock.lock();
      busy_ = false;
      idle_.notify_all();
    }
  }
  // A failure keeps the fast code (it is correct); the kernels stop counting either way.
  static bool generate(TierUp& t) {
    bool done = false;
    try {
      std::vector<void*> fns = Jit::instance().codegen_optimized(t.bitcode, t.names, t.key);
      for (size_t i = 0; i < t.codes.size(); ++i)
        t.codes[i]->fn.store(reinterpret_cast<KernelFn>(fns[i]), std::memory_order_release);
      g_tier_ups.fetch_add(1, std::memory_order_relaxed);
      done = true;
    } catch (...) {
    }
    for (KernelCode* c : t.codes) c->tier.store(nullptr, std::memory_order_release);
    g_kept_bitcode.fetch_sub(t.bitcode.size(), std::memory_order_relaxed);
    std::string().swap(t.bitcode);
    return done;
  }

  std::mutex mu_;
  std::condition_variable wake_, idle_;
  std::deque<TierUp*> queue_;
  bool busy_ = false, stop_ = false;
  std::unique_ptr<std::thread> thread_;
  pid_t owner_ = 0;  // the process that started thread_
};

// Owns every TierUp record (small once its bitcode is dropped; one per fast module).
std::mutex g_records_mu;
std::vector<std::unique_ptr<TierUp>>& records() {
  static auto* r = new std::vector<std::unique_ptr<TierUp>>;  // never destroyed: codes point here
  return *r;
}

class Emitter {
 public:
  Emitter(const ir::Graph& g, const Plan& p, llvm::Module& m)
      : g_(g), p_(p), m_(m), ctx_(m.getContext()), b_(ctx_), math_(b_, m, &group_) {}

  // `inlined`: an internal function always inlined into its caller (a native loop's body).
  void emit(const KernelSpec& k, const detail::KernelDescription& d, const std::string& name,
            bool inlined = false) {
    k_ = &k;
    local_.clear();
    for (size_t j = 0; j < d.bufs.size(); ++j) local_[d.bufs[j]] = static_cast<int>(j);
    auto* i64 = b_.getInt64Ty();
    auto* ptr = b_.getPtrTy();
    auto* fty = llvm::FunctionType::get(b_.getVoidTy(), {ptr, i64, i64}, false);
    fn_ = llvm::Function::Create(
        fty, inlined ? llvm::Function::InternalLinkage : llvm::Function::ExternalLinkage, name, m_);
    fn_->addFnAttr(llvm::Attribute::NoUnwind);
    if (inlined) fn_->addFnAttr(llvm::Attribute::AlwaysInline);
    auto* entry = llvm::BasicBlock::Create(ctx_, "entry", fn_);
    b_.SetInsertPoint(entry);
    ptrs_.clear();
    for (size_t j = 0; j < d.bufs.size(); ++j) {
      Value* slot = b_.CreateConstInBoundsGEP1_64(ptr, fn_->getArg(0), j);
      ptrs_.push_back(b_.CreateLoad(ptr, slot));
    }
    alloca_point_ = b_.GetInsertBlock();
    loop(fn_->getArg(1), fn_->getArg(2), [&](Value* o) { outer_body(o); });
    b_.CreateRetVoid();
  }

 private:
  // ---- loops -------------------------------------------------------------------------
  // A loop over [lo, hi). `parallel`: its iterations touch buffers independently (each
  // writes its own elements and reads nothing another one writes), which the loop metadata
  // tells the vectorizer, so it needs no runtime alias checks (and in-place updates of a
  // donated input vectorize too).
  template <class Body>
  void loop(Value* lo, Value* hi, Body&& body, bool parallel = false) {
    llvm::MDNode* saved_group = group_;
    if (parallel) group_ = llvm::MDNode::getDistinct(ctx_, {});
    detail::emit_counted_loop(b_, fn_, lo, hi, parallel ? group_ : nullptr, {}, body);
    group_ = saved_group;
  }

  llvm::AllocaInst* entry_alloca(llvm::Type* t) {
    llvm::IRBuilder<> eb(alloca_point_, alloca_point_->begin());
    return eb.CreateAlloca(t);
  }

  // ---- the outer loop body: delinearize, then the stages ------------------------------
  void outer_body(Value* o) {
    const Shape& outer = k_->outer;
    std::vector<Value*> oc(outer.size());
    Value* rest = o;
    for (size_t d = outer.size(); d-- > 0;) {
      if (d == 0) {
        oc[d] = rest;
      } else {
        oc[d] = b_.CreateSRem(rest, b_.getInt64(outer[d]));
        rest = b_.CreateSDiv(rest, b_.getInt64(outer[d]));
      }
    }
    row_scalars_.clear();
    for (size_t si = 0; si < k_->stages.size(); ++si) {
      const Stage& s = k_->stages[si];
      if (s.columns > 0)
        column_stage(s, oc);
      else if (s.reduce)
        reduce_stage(s, oc);
      else
        elementwise_stage(s, oc);
    }
  }

  void elementwise_stage(const Stage& s, const std::vector<Value*>& oc) {
    size_t r = s.shape.size();
    bool computes = p_.buf_of[s.node] == s.out_buf;
    if (r == 0) {
      vars_.clear();
      memo_.clear();
      Value* v = computes ? compute(s.node, {}) : eval(s.node, {});
      store(s.out_buf, s.out_offset, s.out_strides, {}, v, g_.node(s.node).type.dtype);
      return;
    }
    int64_t n = s.shape.back();
    Value *lo = b_.getInt64(0), *hi = b_.getInt64(n), *base = b_.getInt64(0);
    if (k_->chunk > 0) {  // the last outer coordinate numbers a chunk of the last axis
      base = b_.CreateMul(oc.back(), b_.getInt64(k_->chunk));
      hi = b_.CreateBinaryIntrinsic(llvm::Intrinsic::smin, b_.getInt64(k_->chunk),
                                    b_.CreateSub(b_.getInt64(n), base));
    }
    hoisting([&] {
      loop(
          lo, hi,
          [&](Value* i) {
            vars_.assign(oc.begin(), oc.begin() + static_cast<long>(r - 1));
            vars_.push_back(k_->chunk > 0 ? b_.CreateAdd(base, i) : i);
            memo_.clear();
            Coords c(r);
            for (size_t d = 0; d < r; ++d) c[d] = var(d, r);
            Value* v = computes ? compute(s.node, c) : eval(s.node, c);
            store(s.out_buf, s.out_offset, s.out_strides, c, v, g_.node(s.node).type.dtype);
          },
          /*parallel=*/true);
    });
  }

  // ---- reductions --------------------------------------------------------------------
  void reduce_stage(const Stage& s, const std::vector<Value*>& oc) {
    const ir::Node& red = g_.node(s.node);
    NodeId in = red.operands[0].node;
    DType dt = g_.node(in).type.dtype;
    llvm::Type* ct = compute_type(dt);
    size_t r = s.shape.size();
    std::vector<size_t> order;  // stage coords as vars: outer dims, then reduced dims
    for (size_t d = 0; d < r; ++d)
      if (!is_reduced(s, d)) order.push_back(d);
    for (int64_t d : s.reduced) order.push_back(static_cast<size_t>(d));
    // argmax runs two passes that both vectorize: the maximum (NaN wins), then the first
    // index holding it, an integer min over a select (a running index and value compared
    // element by element kept the loop scalar: 14 ms over [2048,1000]).
    bool argmax = red.op == OpKind::ArgMax;
    auto* acc = entry_alloca(ct);
    auto* idx = argmax ? entry_alloca(b_.getInt64Ty()) : nullptr;
    b_.CreateStore(reduce_init(red.op, dt, ct), acc);
    if (argmax) b_.CreateStore(b_.getInt64(INT64_MAX), idx);
    std::vector<Value*> rv(s.reduced.size());
    Value* best = nullptr;  // argmax's second pass: the maximum
    std::function<void(size_t, Value*)> nest = [&](size_t level, Value* flat) {
      if (level == s.reduced.size()) {
        vars_.assign(oc.begin(), oc.begin() + static_cast<long>(r - s.reduced.size()));
        vars_.insert(vars_.end(), rv.begin(), rv.end());
        memo_.clear();
        Coords c(r);
        for (size_t j = 0; j < order.size(); ++j) c[order[j]] = var(j, r);
        Value* x = eval(in, c);
        if (best) {
          Value* at = b_.CreateSelect(argmax_hit(x, best, dt), flat ? flat : b_.getInt64(0),
                                      b_.getInt64(INT64_MAX));
          Value* i = b_.CreateLoad(b_.getInt64Ty(), idx);
          b_.CreateStore(b_.CreateBinaryIntrinsic(llvm::Intrinsic::smin, i, at), idx);
        } else {
          Value* a = b_.CreateLoad(ct, acc);
          b_.CreateStore(combine(argmax ? OpKind::ReduceMax : red.op, dt, a, x), acc);
        }
        return;
      }
      int64_t ext = s.shape[s.reduced[level]];
      loop(
          b_.getInt64(0), b_.getInt64(ext),
          [&](Value* iv) {
            rv[level] = iv;
            Value* f = level ? b_.CreateAdd(b_.CreateMul(flat, b_.getInt64(ext)), iv) : iv;
            nest(level + 1, f);
          },
          /*parallel=*/level + 1 == s.reduced.size());
    };
    hoisting([&] { nest(0, nullptr); });
    if (argmax) {
      best = b_.CreateLoad(ct, acc);
      hoisting([&] { nest(0, nullptr); });
    }
    Value* result = argmax ? b_.CreateLoad(b_.getInt64Ty(), idx) : b_.CreateLoad(ct, acc);
    if (!argmax) result = round_to(result, red.type.dtype);
    row_scalars_[s.node] = result;
    if (s.out_buf >= 0) {
      vars_.assign(oc.begin(), oc.begin() + static_cast<long>(r - s.reduced.size()));
      store(s.out_buf, 0, s.out_strides, output_coords(s), result, red.type.dtype);
    }
  }

  static bool is_reduced(const Stage& s, size_t d) {
    return std::find(s.reduced.begin(), s.reduced.end(), static_cast<int64_t>(d)) !=
           s.reduced.end();
  }

  // A reduction's output coordinates over vars_ holding its kept dims in order: those vars,
  // and 0 for reduced dims kept as size 1 (keepdim).
  Coords output_coords(const Stage& s) const {
    const size_t r = s.shape.size(), kept = r - s.reduced.size();
    Coords c;
    for (size_t d = 0, j = 0; d < r; ++d) {
      if (!is_reduced(s, d))
        c.push_back(var(j++, kept));
      else if (g_.node(s.node).attrs.flag)
        c.push_back(Affine{});
    }
    return c;
  }

  // A column reduction (Stage::columns): oc is the kept dims but the last, then the column
  // block. An accumulator row of the block's columns (compute type, on the stack) takes each
  // reduced point's contiguous block in turn, the column loop innermost; the row is stored
  // once at the end. Each column adds in the reduced points' order, as the row walk did.
  void column_stage(const Stage& s, const std::vector<Value*>& oc) {
    const ir::Node& red = g_.node(s.node);
    NodeId in = red.operands[0].node;
    DType dt = g_.node(in).type.dtype;
    llvm::Type* ct = compute_type(dt);
    const size_t r = s.shape.size(), nr = s.reduced.size(), nk = r - nr;
    const int64_t n = s.shape[r - 1];
    auto* acc = entry_alloca(llvm::ArrayType::get(ct, static_cast<uint64_t>(s.columns)));
    Value* j0 = b_.CreateMul(oc.back(), b_.getInt64(s.columns));
    Value* width = b_.CreateBinaryIntrinsic(llvm::Intrinsic::smin, b_.getInt64(s.columns),
                                            b_.CreateSub(b_.getInt64(n), j0));
    auto slot = [&](Value* j) { return b_.CreateInBoundsGEP(ct, acc, j); };
    auto get = [&](Value* j) { return in_group(b_.CreateLoad(ct, slot(j))); };
    auto set = [&](Value* j, Value* v) { in_group(b_.CreateStore(v, slot(j))); };
    loop(
        b_.getInt64(0), width, [&](Value* j) { set(j, reduce_init(red.op, dt, ct)); },
        /*parallel=*/true);
    // Loop variables: the kept dims but the last (outer), the reduced dims, the column.
    std::vector<size_t> var_of(r);
    for (size_t d = 0, kept = 0; d < r; ++d) {
      auto it = std::find(s.reduced.begin(), s.reduced.end(), static_cast<int64_t>(d));
      var_of[d] = it != s.reduced.end() ? nk - 1 + static_cast<size_t>(it - s.reduced.begin())
                  : d + 1 == r          ? r - 1
                                        : kept++;
    }
    std::vector<Value*> rv(nr);
    std::function<void(size_t)> nest = [&](size_t level) {
      if (level < nr) {
        loop(b_.getInt64(0), b_.getInt64(s.shape[s.reduced[level]]), [&](Value* iv) {
          rv[level] = iv;
          nest(level + 1);
        });
        return;
      }
      loop(
          b_.getInt64(0), width,
          [&](Value* j) {
            vars_.assign(oc.begin(), oc.end() - 1);
            vars_.insert(vars_.end(), rv.begin(), rv.end());
            vars_.push_back(b_.CreateAdd(j0, j));
            memo_.clear();
            Coords c(r);
            for (size_t d = 0; d < r; ++d) c[d] = var(var_of[d], r);
            set(j, combine(red.op, dt, get(j), eval(in, c)));
          },
          /*parallel=*/true);
    };
    hoisting([&] { nest(0); });
    // The output row (the last dim is the last kept one).
    const Coords out = output_coords(s);
    loop(
        b_.getInt64(0), width,
        [&](Value* j) {
          vars_.assign(oc.begin(), oc.end() - 1);
          vars_.push_back(b_.CreateAdd(j0, j));
          store(s.out_buf, 0, s.out_strides, out, round_to(get(j), red.type.dtype), red.type.dtype);
        },
        /*parallel=*/true);
  }

  Value* reduce_init(OpKind op, DType dt, llvm::Type* ct) {
    bool fl = is_floating(dt);
    switch (op) {
      case OpKind::ReduceSum:
        return fl ? llvm::ConstantFP::get(ct, 0.0) : llvm::ConstantInt::get(ct, 0);
      case OpKind::ReduceMin:
        if (dt == DType::Bool) return b_.getTrue();
        return fl ? llvm::ConstantFP::getInfinity(ct, false)
                  : llvm::ConstantInt::get(
                        ct, llvm::APInt::getSignedMaxValue(ct->getIntegerBitWidth()));
      default:  // max, argmax
        if (dt == DType::Bool) return b_.getFalse();
        return fl ? llvm::ConstantFP::getInfinity(ct, true)
                  : llvm::ConstantInt::get(
                        ct, llvm::APInt::getSignedMinValue(ct->getIntegerBitWidth()));
    }
  }

  Value* combine(OpKind op, DType dt, Value* a, Value* x) {
    bool fl = is_floating(dt);
    if (op == OpKind::ReduceSum) {
      if (!fl) return b_.CreateAdd(a, x);
      llvm::IRBuilder<>::FastMathFlagGuard guard(b_);
      llvm::FastMathFlags f;
      f.setAllowReassoc();  // lets the sum vectorize; the order of additions is unspecified
      f.setAllowContract();
      b_.setFastMathFlags(f);
      return b_.CreateFAdd(a, x);
    }
    bool mx = op == OpKind::ReduceMax;
    if (dt == DType::Bool) return mx ? b_.CreateOr(a, x) : b_.CreateAnd(a, x);
    // llvm.maximum / llvm.minimum: NaN wins, which the loop vectorizer reduces in vectors
    // (float_extremum's selects keep the loop scalar: log_softmax over [2048,1000] 6.8 ->
    // 3.1 ms). Unlike the reference it orders -0 below +0 (IEEE 754-2019), and a NaN result
    // need not be the first NaN's bits.
    if (fl)
      return b_.CreateBinaryIntrinsic(mx ? llvm::Intrinsic::maximum : llvm::Intrinsic::minimum, a,
                                      x);
    return b_.CreateBinaryIntrinsic(mx ? llvm::Intrinsic::smax : llvm::Intrinsic::smin, a, x);
  }

  // The reference's maximum/minimum: a NaN operand wins (the first one), else the larger
  // (smaller) value, else b. Selects, so it vectorizes and matches bit for bit.
  Value* float_extremum(bool mx, Value* a, Value* b) {
    Value* pick_a = mx ? b_.CreateFCmpOGT(a, b) : b_.CreateFCmpOLT(a, b);
    Value* r = b_.CreateSelect(pick_a, a, b);
    r = b_.CreateSelect(b_.CreateFCmpUNO(b, b), b, r);
    return b_.CreateSelect(b_.CreateFCmpUNO(a, a), a, r);
  }

  // argmax's second pass: x is the maximum `best` (the first such index wins). A NaN maximum
  // is matched by any NaN, so the first NaN wins.
  Value* argmax_hit(Value* x, Value* best, DType dt) {
    if (!is_floating(dt)) return b_.CreateICmpEQ(x, best);
    Value* both_nan = b_.CreateAnd(b_.CreateFCmpUNO(x, x), b_.CreateFCmpUNO(best, best));
    return b_.CreateOr(b_.CreateFCmpOEQ(x, best), both_nan);
  }

  // ---- expressions -------------------------------------------------------------------
  Value* affine(const Affine& a) {
    Value* v = b_.getInt64(a.c);
    for (size_t j = 0; j < a.a.size(); ++j) {
      if (a.a[j] == 0) continue;
      Value* t = a.a[j] == 1 ? vars_[j] : b_.CreateMul(vars_[j], b_.getInt64(a.a[j]));
      v = a.c == 0 && v == b_.getInt64(0) ? t : b_.CreateAdd(v, t);
    }
    return v;
  }

  Value* address(int plan_buf, int64_t offset, const std::vector<int64_t>& strides, const Coords& c,
                 DType dt) {
    return b_.CreateInBoundsGEP(storage_type(dt), ptrs_[local_.at(plan_buf)],
                                affine(linear(strides, c, offset)));
  }

  // A memory access of the innermost parallel loop's body joins its access group.
  llvm::Instruction* in_group(llvm::Instruction* i) {
    if (group_) i->setMetadata(llvm::LLVMContext::MD_access_group, group_);
    return i;
  }

  void store(int plan_buf, int64_t offset, const std::vector<int64_t>& strides, const Coords& c,
             Value* v, DType dt) {
    in_group(b_.CreateStore(to_storage(v, dt), address(plan_buf, offset, strides, c, dt)));
  }

  Value* load(int plan_buf, const std::vector<int64_t>& strides, const Coords& c, DType dt) {
    return from_storage(
        in_group(b_.CreateLoad(storage_type(dt), address(plan_buf, 0, strides, c, dt))), dt);
  }

  std::string memo_key(NodeId n, const Coords& c) {
    std::string k = std::to_string(n);
    for (const Affine& a : c) {
      k += ";" + std::to_string(a.c);
      for (int64_t x : a.a) k += "," + std::to_string(x);
    }
    return k;
  }

  // The value of node n at coordinates c (a load when n has a buffer).
  Value* eval(NodeId n, const Coords& c) {
    auto rs = row_scalars_.find(n);
    if (rs != row_scalars_.end()) return rs->second;
    if (hoist_ && g_.node(n).type.shape.empty() && g_.node(n).op != OpKind::Constant)
      return hoisted(n);
    if (p_.buf_of[n] >= 0)
      return load(p_.buf_of[n], contiguous_strides(g_.node(n).type.shape), c,
                  g_.node(n).type.dtype);
    return compute(n, c);
  }

  // A rank-0 value read inside a stage's loops is the same on every trip: it is computed once,
  // in hoist_ (the block before the stage's loops), with its rank-0 operands. LICM cannot do
  // it: the loads it reads may alias the loop's stores as far as LLVM knows, so an AdamW's bias
  // corrections (pow or exp of the step count) were evaluated per element.
  Value* hoisted(NodeId n) {
    auto it = hoisted_.find(n);
    if (it != hoisted_.end()) return it->second;
    llvm::IRBuilderBase::InsertPointGuard guard(b_);
    // Before the branch into the loops; with no loop yet (a reduction of no dims), right here.
    if (llvm::Instruction* end = hoist_->getTerminator()) b_.SetInsertPoint(end);
    llvm::BasicBlock* at = std::exchange(hoist_, nullptr);
    llvm::MDNode* group = std::exchange(group_, nullptr);
    const bool squares = std::exchange(squares_, false);  // runs whatever the exponents are
    std::unordered_map<std::string, Value*> memo;
    memo.swap(memo_);
    Value* v = eval(n, {});
    memo.swap(memo_);
    squares_ = squares;
    group_ = group;
    hoist_ = at;
    hoisted_[n] = v;
    return v;
  }

  // Runs `loops` (a stage's loop nest, emitted at the current block) with rank-0 values hoisted
  // in front of it.
  template <class Loops>
  void hoisting(Loops&& loops) {
    hoist_ = b_.GetInsertBlock();
    hoisted_.clear();
    square_exponents_.clear();
    loops();
    // (A reduction of no dims emits no loop: its code is the hoist block's own.)
    if (!square_exponents_.empty() && hoist_->getTerminator()) squares_version(loops);
    hoist_ = nullptr;
    hoisted_.clear();
  }

  // The loops just emitted raise to powers that are the same on every trip (a host number
  // is a graph input, so `x ** 2` and `x ** 3` share an executable); a second copy of them
  // squares instead, taken when every such exponent is 2 at run time: x * x is pow(x, 2)
  // correctly rounded, NaN, infinities and signed zeros included, and the general float32
  // pow costs a float64 log and exp an element (1.8 against 0.14 ms over 2^20 elements).
  template <class Loops>
  void squares_version(Loops&& loops) {
    llvm::BasicBlock* general_exit = b_.GetInsertBlock();
    llvm::Instruction* into = hoist_->getTerminator();  // the branch into the general loops
    b_.SetInsertPoint(into);
    Value* all_two = b_.getTrue();
    for (Value* y : square_exponents_)
      all_two =
          b_.CreateAnd(all_two, b_.CreateFCmpOEQ(y, llvm::ConstantFP::get(y->getType(), 2.0)));
    auto* squares = llvm::BasicBlock::Create(ctx_, "squares", fn_);
    auto* join = llvm::BasicBlock::Create(ctx_, "joined", fn_);
    b_.CreateCondBr(all_two, squares, into->getSuccessor(0));
    into->eraseFromParent();
    b_.SetInsertPoint(squares);
    squares_ = true;
    loops();
    squares_ = false;
    b_.CreateBr(join);
    b_.SetInsertPoint(general_exit);
    b_.CreateBr(join);
    b_.SetInsertPoint(join);
  }

  // pow(x, y) as x * x where that is known to be it: y the constant 2, or, in the squares
  // copy of a stage's loops, y hoisted (null otherwise, and the exponent noted for the copy).
  Value* square(Value* x, Value* y) {
    if (auto* k = llvm::dyn_cast<llvm::ConstantFP>(y))
      return k->isExactlyValue(2.0) ? b_.CreateFMul(x, x) : nullptr;
    if (!hoist_ || std::none_of(hoisted_.begin(), hoisted_.end(),
                                [y](const auto& h) { return h.second == y; }))
      return nullptr;
    if (std::find(square_exponents_.begin(), square_exponents_.end(), y) == square_exponents_.end())
      square_exponents_.push_back(y);
    return squares_ ? b_.CreateFMul(x, x) : nullptr;
  }

  Value* compute(NodeId n, const Coords& c) {
    std::string key = memo_key(n, c);
    auto it = memo_.find(key);
    if (it != memo_.end()) return it->second;
    Value* v = compute_uncached(n, c);
    memo_[key] = v;
    return v;
  }

  Value* compute_uncached(NodeId n, const Coords& c) {
    const ir::Node& node = g_.node(n);
    DType dt = node.type.dtype;
    switch (node.op) {
      case OpKind::Constant: return constant(node, dt);
      case OpKind::Iota: return int_to(affine(c.empty() ? Affine{} : c[node.attrs.i]), dt);
      case OpKind::Reshape:
        if (!trivial_reshape(g_, n)) {  // a contiguous buffer read in the new shape's order
          NodeId src = node.operands[0].node;
          return load(p_.buf_of[src], contiguous_strides(node.type.shape), c, dt);
        }
        return eval(node.operands[0].node, operand_coords(g_, n, 0, c));
      case OpKind::Permute:
      case OpKind::Expand:
      case OpKind::Slice: return eval(node.operands[0].node, operand_coords(g_, n, 0, c));
      case OpKind::RandUniform:
      case OpKind::RandNormal: return random(node, c);
      default: break;
    }
    std::vector<Value*> xs;
    for (size_t k = 0; k < node.operands.size(); ++k)
      xs.push_back(eval(node.operands[k].node, operand_coords(g_, n, k, c)));
    if (node.op == OpKind::Convert) return convert(xs[0], g_.type(node.operands[0]).dtype, dt);
    DType in = g_.type(node.operands[node.op == OpKind::Where ? 1 : 0]).dtype;
    if (node.op == OpKind::Pow && is_floating(in))
      if (Value* sq = square(xs[0], xs[1])) return round_to(sq, dt);
    return round_to(elementwise(node.op, in, xs), dt);
  }

  // ---- random numbers: Philox 4x32-10, bit for bit as core/philox.h -------------------
  std::array<Value*, 4> philox(std::array<Value*, 4> ctr, Value* k0, Value* k1) {
    auto* i64 = b_.getInt64Ty();
    auto* i32 = b_.getInt32Ty();
    for (int round = 0; round < 10; ++round) {
      Value* p0 = b_.CreateMul(b_.CreateZExt(ctr[0], i64), b_.getInt64(0xD2511F53u));
      Value* p1 = b_.CreateMul(b_.CreateZExt(ctr[2], i64), b_.getInt64(0xCD9E8D57u));
      Value* hi0 = b_.CreateTrunc(b_.CreateLShr(p0, 32), i32);
      Value* hi1 = b_.CreateTrunc(b_.CreateLShr(p1, 32), i32);
      ctr = {b_.CreateXor(b_.CreateXor(hi1, ctr[1]), k0), b_.CreateTrunc(p1, i32),
             b_.CreateXor(b_.CreateXor(hi0, ctr[3]), k1), b_.CreateTrunc(p0, i32)};
      k0 = b_.CreateAdd(k0, b_.getInt32(0x9E3779B9u));
      k1 = b_.CreateAdd(k1, b_.getInt32(0xBB67AE85u));
    }
    return ctr;
  }

  Value* lane(const std::array<Value*, 4>& r, Value* which) {  // r[which], which in 0..3
    Value* v = r[0];
    for (int k = 1; k < 4; ++k)
      v = b_.CreateSelect(b_.CreateICmpEQ(which, b_.getInt64(k)), r[k], v);
    return v;
  }

  // philox_normal_from_words (core/philox.cpp), operation for operation: its log and cos are
  // polynomials on integer-reduced arguments with explicit fused multiply-adds (llvm.fma, never
  // contracted otherwise), so a kernel's normals are the reference's bits and vectorize
  // (libm's scalar log and cos in float64 took 19 ms for 2^20 normals on 2 threads).
  Value* normal_from_words(Value* w1, Value* w2) {
    using K = loom::detail::NormalConstants;
    auto* i64 = b_.getInt64Ty();
    auto* f64 = b_.getDoubleTy();
    auto c = [&](double v) { return llvm::ConstantFP::get(f64, v); };
    // log u1 = (k - 24) ln 2 + log f, n = (w1 >> 8) + 1 = f 2^k.
    Value* n = b_.CreateAdd(b_.CreateLShr(w1, 8), b_.getInt32(1));
    Value* k = b_.CreateSub(b_.getInt32(31),
                            b_.CreateBinaryIntrinsic(llvm::Intrinsic::ctlz, n, b_.getTrue()));
    Value* scale = b_.CreateBitCast(
        b_.CreateShl(b_.CreateZExt(b_.CreateSub(b_.getInt32(1023), k), i64), 52), f64);
    Value* f = b_.CreateFMul(b_.CreateUIToFP(n, f64), scale);
    Value* log_u1 = math_.log_f64_reduced(f, b_.CreateSub(k, b_.getInt32(24)));
    Value* radius = b_.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, b_.CreateFMul(c(-2.0), log_u1));
    // cos(2 pi m 2^-24), m = w2 >> 8: quarter turn q, the rest folded to [0, pi/4].
    Value* m = b_.CreateLShr(w2, 8);
    Value* q = b_.CreateLShr(m, 22);
    Value* rest = b_.CreateAnd(m, b_.getInt32(0x3fffff));
    Value* fold = b_.CreateICmpUGT(rest, b_.getInt32(1 << 21));
    Value* folded = b_.CreateSelect(fold, b_.CreateSub(b_.getInt32(1 << 22), rest), rest);
    Value* x = b_.CreateFMul(b_.CreateUIToFP(folded, f64), c(K::kTurn));
    Value* sin_x = math_.sin_kernel(x);
    Value* cos_x = math_.cos_kernel(x);
    Value* odd = b_.CreateICmpNE(b_.CreateAnd(q, b_.getInt32(1)), b_.getInt32(0));
    Value* v = b_.CreateSelect(b_.CreateXor(odd, fold), sin_x, cos_x);
    Value* negative = b_.CreateICmpEQ(b_.CreateAnd(b_.CreateAdd(q, b_.getInt32(1)), b_.getInt32(2)),
                                      b_.getInt32(2));  // q is 1 or 2
    return b_.CreateFMul(radius, b_.CreateSelect(negative, b_.CreateFNeg(v), v));
  }

  Value* random(const ir::Node& node, const Coords& c) {
    auto* i32 = b_.getInt32Ty();
    auto* f64 = b_.getDoubleTy();
    NodeId key = node.operands[0].node;
    Value* seed = eval(key, Coords{Affine{0, {}}});
    Value* offset = eval(key, Coords{Affine{1, {}}});
    Value* e = affine(linear(contiguous_strides(node.type.shape), c, 0));
    bool normal = node.op == OpKind::RandNormal;
    Value* block = b_.CreateLShr(e, normal ? 1 : 2);
    auto r = philox({b_.CreateTrunc(block, i32), b_.CreateTrunc(b_.CreateLShr(block, 32), i32),
                     b_.CreateTrunc(offset, i32), b_.CreateTrunc(b_.CreateLShr(offset, 32), i32)},
                    b_.CreateTrunc(seed, i32), b_.CreateTrunc(b_.CreateLShr(seed, 32), i32));
    auto to_unit = [&](Value* bits) {  // (bits >> 8) * 2^-24, exact in double
      Value* v = b_.CreateUIToFP(b_.CreateLShr(bits, 8), f64);
      return b_.CreateFMul(v, llvm::ConstantFP::get(f64, 1.0 / 16777216.0));
    };
    Value* x;
    if (!normal) {
      x = to_unit(lane(r, b_.CreateAnd(e, b_.getInt64(3))));
    } else {
      Value* first = b_.CreateShl(b_.CreateAnd(e, b_.getInt64(1)), 1);
      x = normal_from_words(lane(r, first), lane(r, b_.CreateAdd(first, b_.getInt64(1))));
    }
    return convert(x, DType::Float64, node.type.dtype);
  }

  Value* constant(const ir::Node& node, DType dt) {
    double f = node.attrs.f;
    if (dt == DType::Bool) return b_.getInt1(f != 0);
    if (is_integral(dt))
      return llvm::ConstantInt::get(compute_type(dt), static_cast<uint64_t>(std::llround(f)), true);
    return round_to(llvm::ConstantFP::get(compute_type(dt), f), dt);
  }

  Value* int_to(Value* i64v, DType dt) {
    if (dt == DType::Bool) return b_.CreateICmpNE(i64v, b_.getInt64(0));
    if (is_integral(dt)) return b_.CreateSExtOrTrunc(i64v, compute_type(dt));
    return round_to(b_.CreateSIToFP(i64v, compute_type(dt)), dt);
  }

  Value* elementwise(OpKind op, DType in, const std::vector<Value*>& x) {
    bool fl = is_floating(in);
    switch (op) {
      case OpKind::Neg: return fl ? b_.CreateFNeg(x[0]) : b_.CreateNeg(x[0]);
      case OpKind::Abs:
        return fl ? b_.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, x[0])
                  : b_.CreateBinaryIntrinsic(llvm::Intrinsic::abs, x[0], b_.getFalse());
      case OpKind::Exp: return math_.exp(x[0]);
      case OpKind::Log: return math_.log(x[0]);
      case OpKind::Sqrt: return b_.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, x[0]);
      case OpKind::Tanh: return math_.tanh(x[0]);
      case OpKind::Sin: return math_.sin(x[0]);
      case OpKind::Cos: return math_.cos(x[0]);
      case OpKind::Erf: return math_.erf(x[0]);
      case OpKind::Not: return b_.CreateNot(x[0]);
      case OpKind::Add: return fl ? fop(llvm::Instruction::FAdd, x) : b_.CreateAdd(x[0], x[1]);
      case OpKind::Sub: return fl ? fop(llvm::Instruction::FSub, x) : b_.CreateSub(x[0], x[1]);
      case OpKind::Mul: return fl ? fop(llvm::Instruction::FMul, x) : b_.CreateMul(x[0], x[1]);
      case OpKind::Div: return fl ? b_.CreateFDiv(x[0], x[1]) : int_div(x[0], x[1]);
      case OpKind::Pow: return math_.pow(x[0], x[1]);
      case OpKind::Rem: return fl ? b_.CreateFRem(x[0], x[1]) : int_rem(x[0], x[1]);
      case OpKind::Maximum:
      case OpKind::Minimum: {
        bool mx = op == OpKind::Maximum;
        if (in == DType::Bool) return mx ? b_.CreateOr(x[0], x[1]) : b_.CreateAnd(x[0], x[1]);
        if (fl) return float_extremum(mx, x[0], x[1]);
        return b_.CreateBinaryIntrinsic(mx ? llvm::Intrinsic::smax : llvm::Intrinsic::smin, x[0],
                                        x[1]);
      }
      case OpKind::And: return b_.CreateAnd(x[0], x[1]);
      case OpKind::Or: return b_.CreateOr(x[0], x[1]);
      case OpKind::Eq: return fl ? b_.CreateFCmpOEQ(x[0], x[1]) : b_.CreateICmpEQ(x[0], x[1]);
      case OpKind::Ne: return fl ? b_.CreateFCmpUNE(x[0], x[1]) : b_.CreateICmpNE(x[0], x[1]);
      case OpKind::Lt:
        return fl                  ? b_.CreateFCmpOLT(x[0], x[1])
               : in == DType::Bool ? b_.CreateICmpULT(x[0], x[1])
                                   : b_.CreateICmpSLT(x[0], x[1]);
      case OpKind::Le:
        return fl                  ? b_.CreateFCmpOLE(x[0], x[1])
               : in == DType::Bool ? b_.CreateICmpULE(x[0], x[1])
                                   : b_.CreateICmpSLE(x[0], x[1]);
      case OpKind::Gt:
        return fl                  ? b_.CreateFCmpOGT(x[0], x[1])
               : in == DType::Bool ? b_.CreateICmpUGT(x[0], x[1])
                                   : b_.CreateICmpSGT(x[0], x[1]);
      case OpKind::Ge:
        return fl                  ? b_.CreateFCmpOGE(x[0], x[1])
               : in == DType::Bool ? b_.CreateICmpUGE(x[0], x[1])
                                   : b_.CreateICmpSGE(x[0], x[1]);
      case OpKind::Where: return b_.CreateSelect(x[0], x[1], x[2]);
      default: break;
    }
    throw CompileError(loom::detail::str_cat("[cpu] no code generator for ", ir::op_name(op)));
  }

  Value* fop(llvm::Instruction::BinaryOps op, const std::vector<Value*>& x) {
    llvm::IRBuilder<>::FastMathFlagGuard guard(b_);
    llvm::FastMathFlags f;
    f.setAllowContract();
    b_.setFastMathFlags(f);
    return b_.CreateBinOp(op, x[0], x[1]);
  }

  // Integer division truncates toward zero; by zero gives 0 and INT_MIN / -1 wraps (the
  // reference interpreter's definition), without undefined behaviour.
  // a % d; 0 where d is 0 or -1 (srem of INT_MIN by -1 is undefined).
  Value* int_rem(Value* a, Value* d) {
    auto* t = a->getType();
    Value* zero = llvm::ConstantInt::get(t, 0);
    Value* bad = b_.CreateOr(b_.CreateICmpEQ(d, zero),
                             b_.CreateICmpEQ(d, llvm::ConstantInt::getSigned(t, -1)));
    Value* r = b_.CreateSRem(a, b_.CreateSelect(bad, llvm::ConstantInt::get(t, 1), d));
    return b_.CreateSelect(bad, zero, r);
  }

  Value* int_div(Value* a, Value* d) {
    auto* t = a->getType();
    Value* zero = llvm::ConstantInt::get(t, 0);
    Value* minus1 = llvm::ConstantInt::getSigned(t, -1);
    Value* is_zero = b_.CreateICmpEQ(d, zero);
    Value* is_m1 = b_.CreateICmpEQ(d, minus1);
    Value* safe = b_.CreateSelect(b_.CreateOr(is_zero, is_m1), llvm::ConstantInt::get(t, 1), d);
    Value* q = b_.CreateSDiv(a, safe);
    q = b_.CreateSelect(is_m1, b_.CreateNeg(a), q);
    return b_.CreateSelect(is_zero, zero, q);
  }

  Value* convert(Value* v, DType from, DType to) {
    if (from == to) return v;
    llvm::Type* tt = compute_type(to);
    if (to == DType::Bool) {
      if (is_floating(from)) return b_.CreateFCmpUNE(v, llvm::ConstantFP::get(v->getType(), 0.0));
      return b_.CreateICmpNE(v, llvm::ConstantInt::get(v->getType(), 0));
    }
    if (from == DType::Bool) return is_floating(to) ? b_.CreateUIToFP(v, tt) : b_.CreateZExt(v, tt);
    if (is_integral(to)) {
      if (is_integral(from)) return b_.CreateSExtOrTrunc(v, tt);
      // Truncation toward zero, NaN -> 0, saturating: the reference's definition.
      return b_.CreateIntrinsic(llvm::Intrinsic::fptosi_sat, {tt, v->getType()}, {v});
    }
    if ((to == DType::Float16 || to == DType::BFloat16) && from != DType::Float32 &&
        from != DType::Float16 && from != DType::BFloat16) {
      Value* d = is_integral(from) ? b_.CreateSIToFP(v, b_.getDoubleTy()) : v;
      return double_to_half(d, to);
    }
    Value* r = is_integral(from) ? b_.CreateSIToFP(v, tt) : b_.CreateFPCast(v, tt);
    return round_to(r, to);
  }

  // double -> float16/bfloat16 with one rounding (through float it could round twice).
  // float16: the hardware conversion rounds once. bfloat16: round to float by "round to
  // odd" (truncate, then set the sticky bit when inexact), then to bfloat16 to nearest even.
  Value* double_to_half(Value* d, DType to) {
    if (to == DType::Float16)
      return b_.CreateFPExt(b_.CreateFPTrunc(d, b_.getHalfTy()), b_.getFloatTy());
    Value* f = b_.CreateFPTrunc(d, b_.getFloatTy());
    Value* back = b_.CreateFPExt(f, b_.getDoubleTy());
    Value* ad = b_.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, d);
    Value* aback = b_.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, back);
    Value* bits = b_.CreateBitCast(f, b_.getInt32Ty());
    Value* too_big = b_.CreateFCmpOGT(aback, ad);
    bits = b_.CreateSub(bits, b_.CreateZExt(too_big, b_.getInt32Ty()));
    Value* inexact = b_.CreateFCmpONE(back, d);
    bits = b_.CreateOr(bits, b_.CreateZExt(inexact, b_.getInt32Ty()));
    Value* odd = b_.CreateBitCast(bits, b_.getFloatTy());
    odd = b_.CreateSelect(b_.CreateFCmpUNO(d, d), f, odd);
    return round_to(odd, to);
  }

  // Values of 16-bit float dtypes compute in float32 but round to their dtype after each op,
  // as the reference does.
  Value* round_to(Value* v, DType dt) {
    if (dt == DType::Float16) {
      return b_.CreateFPExt(b_.CreateFPTrunc(v, b_.getHalfTy()), b_.getFloatTy());
    }
    if (dt == DType::BFloat16) return from_storage(to_storage(v, dt), dt);
    return v;
  }

  llvm::Type* compute_type(DType dt) {
    switch (dt) {
      case DType::Bool: return b_.getInt1Ty();
      case DType::Int32: return b_.getInt32Ty();
      case DType::Int64: return b_.getInt64Ty();
      case DType::Float64: return b_.getDoubleTy();
      default: return b_.getFloatTy();
    }
  }
  llvm::Type* storage_type(DType dt) {
    switch (dt) {
      case DType::Bool: return b_.getInt8Ty();
      case DType::BFloat16: return b_.getInt16Ty();
      case DType::Float16: return b_.getHalfTy();
      default: return compute_type(dt);
    }
  }
  Value* from_storage(Value* v, DType dt) {
    switch (dt) {
      case DType::Bool: return b_.CreateICmpNE(v, b_.getInt8(0));
      case DType::BFloat16:
        return b_.CreateBitCast(b_.CreateShl(b_.CreateZExt(v, b_.getInt32Ty()), 16),
                                b_.getFloatTy());
      case DType::Float16: return b_.CreateFPExt(v, b_.getFloatTy());
      default: return v;
    }
  }
  Value* to_storage(Value* v, DType dt) {
    switch (dt) {
      case DType::Bool: return b_.CreateZExt(v, b_.getInt8Ty());
      case DType::Float16: return b_.CreateFPTrunc(v, b_.getHalfTy());
      case DType::BFloat16: {  // round to nearest even; NaN stays a quiet NaN
        Value* u = b_.CreateBitCast(v, b_.getInt32Ty());
        Value* lsb = b_.CreateAnd(b_.CreateLShr(u, 16), b_.getInt32(1));
        Value* rounded = b_.CreateLShr(b_.CreateAdd(u, b_.CreateAdd(b_.getInt32(0x7fff), lsb)), 16);
        Value* nan = b_.CreateOr(b_.CreateLShr(u, 16), b_.getInt32(0x40));
        Value* is_nan = b_.CreateFCmpUNO(v, v);
        return b_.CreateTrunc(b_.CreateSelect(is_nan, nan, rounded), b_.getInt16Ty());
      }
      default: return v;
    }
  }

  const ir::Graph& g_;
  const Plan& p_;
  llvm::Module& m_;
  llvm::LLVMContext& ctx_;
  llvm::IRBuilder<> b_;
  Math math_;
  const KernelSpec* k_ = nullptr;
  llvm::Function* fn_ = nullptr;
  llvm::BasicBlock* alloca_point_ = nullptr;
  llvm::MDNode* group_ = nullptr;  // access group of the innermost parallel loop
  std::map<int, int> local_;
  std::vector<Value*> ptrs_, vars_;
  std::unordered_map<std::string, Value*> memo_;
  std::map<NodeId, Value*> row_scalars_;
  llvm::BasicBlock* hoist_ = nullptr;  // set while a stage's loops are emitted (hoisted())
  std::map<NodeId, Value*> hoisted_;
  std::vector<Value*> square_exponents_;  // hoisted exponents of the loops' pows (square())
  bool squares_ = false;                  // emitting the squares copy (squares_version())
};

int64_t work_per_outer(const KernelSpec& k) {
  int64_t w = 0;
  for (const Stage& s : k.stages) {
    int64_t per = s.shape.empty() ? 1 : s.shape.numel() / std::max<int64_t>(1, k.outer.numel());
    w += std::max<int64_t>(per, 1);
  }
  return k.chunk > 0 ? k.chunk : w;
}

}  // namespace

// From this many new functions a module is compiled in two parts at once: even two kernels
// of a graph are worth two modules (a fwd+bwd module holds 5-7, 40 ms of LLVM).
constexpr size_t kSplitFunctions = 2;

namespace {

// A compiled fast module's optimized IR (empty when loaded or not kept) with its persistent-cache
// key for tiered-up code, and the functions it defines: `of[j]` (an index into `first`) is
// function names[j].
struct ModuleIr {
  Jit::TierUpSource source;
  std::vector<std::string> names;
  std::vector<size_t> of;
};

// Compiles kernels first[f] of `plan` (distinct descriptions), returns their functions in order;
// new ones as two modules at once (two cache entries), as LLVM's time grows with a module's
// functions (docs/architecture.md, "Measurements": kSplitFunctions). `irs` gets their IR.
std::vector<void*> compile_functions(const ir::Graph& g, const Plan& plan,
                                     const std::vector<detail::KernelDescription>& descs,
                                     const std::vector<size_t>& first, std::vector<ModuleIr>* irs) {
  const int parts = first.size() >= kSplitFunctions && ThreadPool::instance().size() > 1 ? 2 : 1;
  // Balanced by description length (a proxy for the IR each function expands to): the
  // longest first, each to the lighter part; each part keeps its functions in order.
  std::vector<int> part_of(first.size(), 0);
  if (parts == 2) {
    std::vector<size_t> by_size(first.size());
    for (size_t f = 0; f < by_size.size(); ++f) by_size[f] = f;
    std::stable_sort(by_size.begin(), by_size.end(), [&](size_t a, size_t b) {
      return descs[first[a]].text.size() > descs[first[b]].text.size();
    });
    size_t load[2] = {0, 0};
    for (size_t f : by_size) {
      const int p = load[1] < load[0] ? 1 : 0;
      part_of[f] = p;
      load[p] += descs[first[f]].text.size();
    }
  }
  std::vector<void*> fns(first.size());
  std::vector<int> loaded(static_cast<size_t>(parts), 0);
  irs->assign(static_cast<size_t>(parts), {});
  const bool keep = g_kept_bitcode.load(std::memory_order_relaxed) < kMaxKeptBitcode;
  auto compile_part = [&](int part) {
    // Names only need to be unique within a module (each object is linked on its own), so
    // the same kernels give the same module text in every process: the persistent-cache key.
    std::vector<size_t> mine;
    for (size_t f = 0; f < first.size(); ++f)
      if (part_of[f] == part) mine.push_back(f);
    std::vector<std::string> names;
    std::string what;
    for (size_t f : mine) {
      names.push_back("k" + std::to_string(names.size()));
      (what += descs[first[f]].text) += '\n';
    }
    bool hit = false;
    ModuleIr& ir = (*irs)[static_cast<size_t>(part)];
    ir.source.want_bitcode = keep;
    std::vector<void*> got = Jit::instance().compile(
        what, names,
        [&](llvm::Module& module) {
          Emitter e(g, plan, module);
          for (size_t k = 0; k < mine.size(); ++k)
            e.emit(plan.kernels[first[mine[k]]], descs[first[mine[k]]], names[k]);
        },
        &hit, Codegen::Fast, tier_up_after_us() > 0 ? &ir.source : nullptr);
    for (size_t k = 0; k < mine.size(); ++k) fns[mine[k]] = got[k];
    loaded[static_cast<size_t>(part)] = hit;
    ir.names = std::move(names);
    ir.of = std::move(mine);
  };
  if (parts == 1) {
    compile_part(0);
  } else {
    std::exception_ptr err;
    std::thread other([&] {
      try {
        compile_part(1);
      } catch (...) {
        err = std::current_exception();
      }
    });
    try {
      compile_part(0);
    } catch (...) {
      other.join();
      throw;
    }
    other.join();
    if (err) std::rethrow_exception(err);
  }
  if (t_code_info)
    for (int hit : loaded) (hit ? t_code_info->modules_loaded : t_code_info->modules_compiled)++;
  return fns;
}

}  // namespace

std::vector<CompiledKernel> compile_kernels(const ir::Graph& g, const Plan& plan) {
  std::vector<CompiledKernel> out(plan.kernels.size());
  std::vector<detail::KernelDescription> descs;
  {
    profile::Scope ps("compile", "describe kernels");
    descs = detail::describe_all(g, plan);
  }
  // Kernels that another call is compiling: (kernel, its future), waited for at the end.
  std::vector<std::pair<size_t, std::shared_future<KernelCode*>>> waits;
  // The distinct descriptions this call compiles, in order of first use (concat pieces of
  // one shape share one): the kernel that defines each, and the promise other calls wait on.
  struct Claim {
    size_t kernel;
    std::promise<KernelCode*> done;
    bool listed = false;         // entered in the in-flight table (all but after an error)
    KernelCode* code = nullptr;  // once compiled: the cache's entry for it
    bool fresh = false;          // the entry is this call's (not another's that raced it)
  };
  std::vector<Claim> claims;
  std::map<std::string_view, size_t> claim_of;  // description -> claim
  std::vector<std::pair<size_t, size_t>> mine;  // (kernel, its claim)
  // The claims leave the in-flight table however this call ends: with their functions, or
  // with the error that a waiting call then rethrows.
  auto settle = [&](const std::vector<void*>* fns, std::exception_ptr err) {
    std::lock_guard lock(cache().mu);
    for (size_t c = 0; c < claims.size(); ++c) {
      const std::string& text = descs[claims[c].kernel].text;
      if (claims[c].listed) cache().in_flight.erase(text);
      if (err) {
        claims[c].done.set_exception(err);
        continue;
      }
      claims[c].code = cache().enter(text, (*fns)[c], &claims[c].fresh);
      claims[c].done.set_value(claims[c].code);
    }
  };
  try {
    std::lock_guard lock(cache().mu);
    for (size_t i = 0; i < plan.kernels.size(); ++i) {
      out[i].bufs = descs[i].bufs;
      out[i].outer = plan.kernels[i].outer.numel();
      out[i].work = work_per_outer(plan.kernels[i]);
      if (const KernelSpec& k = plan.kernels[i]; k.out_shift != 0) {
        const int b = k.stages[0].out_buf;
        for (size_t j = 0; j < out[i].bufs.size(); ++j)
          if (out[i].bufs[j] == b) out[i].out_arg = static_cast<int>(j);
        LOOM_ASSERT(out[i].out_arg >= 0);
        out[i].out_shift_bytes =
            k.out_shift * static_cast<int64_t>(itemsize(plan.bufs[b].type.dtype));
      }
      out[i].name = plan.kernels[i].name;
      const std::string& text = descs[i].text;
      if (auto it = cache().fns.find(text); it != cache().fns.end()) {
        out[i].code = it->second.get();
        cache().stats.hits++;
      } else if (auto c = claim_of.find(text); c != claim_of.end()) {
        mine.emplace_back(i, c->second);
      } else if (auto f = cache().in_flight.find(text); f != cache().in_flight.end()) {
        waits.emplace_back(i, f->second);
      } else {
        claims.push_back({i, {}});
        claim_of.emplace(text, claims.size() - 1);
        mine.emplace_back(i, claims.size() - 1);
        cache().in_flight.emplace(text, claims.back().done.get_future().share());
        claims.back().listed = true;
      }
    }
  } catch (...) {
    settle(nullptr, std::current_exception());
    throw;
  }
  if (!claims.empty()) {
    std::vector<size_t> first;
    for (const Claim& c : claims) first.push_back(c.kernel);
    std::vector<void*> fns;
    std::vector<ModuleIr> irs;
    try {
      fns = compile_functions(g, plan, descs, first, &irs);
      settle(&fns, nullptr);
    } catch (...) {
      settle(nullptr, std::current_exception());
      throw;
    }
    for (auto [i, c] : mine) out[i].code = claims[c].code;
    // Each fast module's kernels that are this call's entries may tier up (KernelCode).
    for (ModuleIr& ir : irs) {
      if (ir.source.bitcode.empty()) continue;
      auto t = std::make_unique<TierUp>();
      for (size_t j = 0; j < ir.of.size(); ++j) {
        if (!claims[ir.of[j]].fresh) continue;
        t->names.push_back(ir.names[j]);
        t->codes.push_back(claims[ir.of[j]].code);
      }
      if (t->codes.empty()) continue;
      g_kept_bitcode.fetch_add(ir.source.bitcode.size(), std::memory_order_relaxed);
      t->bitcode = std::move(ir.source.bitcode);
      t->key = ir.source.key;
      TierUp* raw = t.get();
      {
        std::lock_guard lock(g_records_mu);
        records().push_back(std::move(t));
      }
      for (KernelCode* code : raw->codes) code->tier.store(raw, std::memory_order_release);
    }
  }
  for (auto& [i, fut] : waits) out[i].code = fut.get();  // rethrows the other call's error
  if (!waits.empty()) {
    std::lock_guard lock(cache().mu);
    cache().stats.hits += static_cast<int64_t>(waits.size());
  }
  return out;
}

void detail::emit_counted_loop(llvm::IRBuilderBase& b, llvm::Function* fn, llvm::Value* lo,
                               llvm::Value* hi, llvm::MDNode* group,
                               std::span<llvm::Metadata* const> extra,
                               const std::function<void(llvm::Value*)>& body) {
  llvm::LLVMContext& ctx = b.getContext();
  auto* pre = b.GetInsertBlock();
  auto* head = llvm::BasicBlock::Create(ctx, "head", fn);
  auto* bodyb = llvm::BasicBlock::Create(ctx, "body", fn);
  auto* exit = llvm::BasicBlock::Create(ctx, "exit", fn);
  b.CreateBr(head);
  b.SetInsertPoint(head);
  auto* iv = b.CreatePHI(b.getInt64Ty(), 2);
  iv->addIncoming(lo, pre);
  b.CreateCondBr(b.CreateICmpSLT(iv, hi), bodyb, exit);
  b.SetInsertPoint(bodyb);
  body(iv);
  Value* next = b.CreateAdd(iv, b.getInt64(1), "", true, true);
  iv->addIncoming(next, b.GetInsertBlock());
  llvm::BranchInst* latch = b.CreateBr(head);
  if (group) {
    llvm::Metadata* pa[] = {llvm::MDString::get(ctx, "llvm.loop.parallel_accesses"), group};
    std::vector<llvm::Metadata*> ops = {nullptr, llvm::MDNode::get(ctx, pa)};
    ops.insert(ops.end(), extra.begin(), extra.end());
    llvm::MDNode* id = llvm::MDNode::getDistinct(ctx, ops);
    id->replaceOperandWith(0, id);
    latch->setMetadata(llvm::LLVMContext::MD_loop, id);
  }
  b.SetInsertPoint(exit);
}

// ---- native loops (native_loop.cpp) -------------------------------------------------------

void detail::emit_inlined_kernel(llvm::Module& m, const ir::Graph& g, const Plan& p,
                                 const KernelSpec& k, const KernelDescription& d,
                                 const std::string& name) {
  Emitter(g, p, m).emit(k, d, name, /*inlined=*/true);
}

KernelFn detail::cached_function(const std::string& text,
                                 const std::function<void(llvm::Module&)>& emit, Codegen codegen) {
  {
    std::lock_guard lock(cache().mu);
    auto it = cache().fns.find(text);
    if (it != cache().fns.end()) {
      cache().stats.hits++;
      return it->second->get();
    }
  }
  bool loaded = false;
  std::vector<void*> fns = Jit::instance().compile(text + '\n', {"k0"}, emit, &loaded, codegen);
  if (t_code_info) (loaded ? t_code_info->modules_loaded : t_code_info->modules_compiled)++;
  std::lock_guard lock(cache().mu);
  bool fresh = false;
  return cache().enter(text, fns[0], &fresh)->get();
}

void KernelCode::ran(TierUp* t, int64_t ns) {
  const int64_t after = tier_up_after_us();
  if (after <= 0 || t->ran_ns.fetch_add(ns, std::memory_order_relaxed) + ns < after * 1000) return;
  if (t->requested.exchange(true, std::memory_order_acq_rel)) return;
  try {
    TierUpWorker::get().push(t);
  } catch (...) {  // called from a destructor: a failure turns tier-ups off, fast code stays
    set_tier_up_after_us(0);
  }
}

int64_t tier_up_after_us() {
  int64_t v = g_tier_up_us.load(std::memory_order_relaxed);
  if (v >= 0) return v;
  v = 20000;
  if (const char* e = std::getenv("LOOM_TIER_UP_MS"); e && *e)
    v = static_cast<int64_t>(std::max(0.0, std::atof(e)) * 1000);
  g_tier_up_us.store(v, std::memory_order_relaxed);
  return v;
}
void set_tier_up_after_us(int64_t us) { g_tier_up_us.store(std::max<int64_t>(0, us)); }
void wait_for_tier_ups() { TierUpWorker::get().wait_idle(); }
int64_t tier_ups() { return g_tier_ups.load(std::memory_order_relaxed); }

KernelCacheStats kernel_cache_stats() {
  std::lock_guard lock(cache().mu);
  return cache().stats;
}

}  // namespace loom::cpu
