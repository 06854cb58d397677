// Tier-up: fast modules whose kernels have run long enough are generated again with the full
// code generator on a background thread of idle priority (codegen.h, KernelCode).
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "backend/cpu/codegen_impl.h"
#include "backend/cpu/epilogue.h"
#include "backend/cpu/jit.h"

namespace loom::cpu {

namespace {

// The optimized IR kept for tier-ups, in all: past this, new modules keep none (and stay fast
// code).
constexpr size_t kMaxKeptBitcode = size_t{64} << 20;
std::atomic<size_t> g_kept_bitcode{0};
std::atomic<int64_t> g_tier_up_us{-1};  // -1: LOOM_TIER_UP_MS not read yet
std::atomic<int64_t> g_tier_ups{0};

// Programs in their first run (FirstRunScope): tier-ups wait while there are any.
class FirstRuns {
 public:
  static FirstRuns& get() {
    static FirstRuns f;
    return f;
  }
  void add(int delta) {
    std::lock_guard lock(mu_);
    count_ += delta;
    if (count_ == 0) over_.notify_all();
  }
  // Returns when no first run is in flight, `most` has passed, or wake_all() was called.
  void wait(std::chrono::milliseconds most) {
    std::unique_lock lock(mu_);
    over_.wait_for(lock, most, [&] { return count_ == 0 || woken_; });
  }
  void wake_all() {
    std::lock_guard lock(mu_);
    woken_ = true;
    over_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable over_;
  int count_ = 0;
  bool woken_ = false;  // the worker stops: nothing waits any more
};

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
    FirstRuns::get().wake_all();
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
      FirstRuns::get().wait(std::chrono::seconds(1));
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

}  // namespace

bool detail::may_keep_bitcode() {
  return g_kept_bitcode.load(std::memory_order_relaxed) < kMaxKeptBitcode;
}

void detail::keep_for_tier_up(std::unique_ptr<TierUp> t, Jit::TierUpSource&& source) {
  g_kept_bitcode.fetch_add(source.bitcode.size(), std::memory_order_relaxed);
  t->bitcode = std::move(source.bitcode);
  t->key = source.key;
  TierUp* raw = t.get();
  {
    std::lock_guard lock(g_records_mu);
    records().push_back(std::move(t));
  }
  for (KernelCode* code : raw->codes) code->tier.store(raw, std::memory_order_release);
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

FirstRunScope::FirstRunScope() { FirstRuns::get().add(1); }
FirstRunScope::~FirstRunScope() { FirstRuns::get().add(-1); }

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

}  // namespace loom::cpu
