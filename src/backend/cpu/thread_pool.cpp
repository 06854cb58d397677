// ThreadPool implementation: a generation counter wakes sleeping workers; tasks are taken
// from a shared counter under the lock (jobs are a few coarse chunks, so contention is nil).
#include "backend/cpu/thread_pool.h"

#include <immintrin.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "loom/core/fp_mode.h"
#include "loom/core/profile.h"

namespace loom::cpu {

namespace {
thread_local bool in_worker = false;
thread_local int worker_index = 0;

// How long a thread spins before it sleeps: LOOM_SPIN_US, default 200 (0: never spin).
int spin_micros() {
  static const int us = [] {
    const char* v = std::getenv("LOOM_SPIN_US");
    return v && *v ? std::max(0, std::atoi(v)) : 200;
  }();
  return us;
}

// Spins (with pause) until done() or spin_micros() pass; true when done() held.
template <class Done>
bool spin_until(Done done) {
  if (spin_micros() == 0) return done();
  const auto limit = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_micros());
  for (int i = 0;; ++i) {
    if (done()) return true;
    _mm_pause();
    if ((i & 63) == 63 && std::chrono::steady_clock::now() > limit) return done();
  }
}

int default_threads() {
  if (const char* v = std::getenv("LOOM_NUM_THREADS")) {
    int n = std::atoi(v);
    if (n >= 1) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}
}  // namespace

ThreadPool& ThreadPool::instance() {
  static ThreadPool pool(default_threads());
  return pool;
}

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < threads; ++i)
    workers_.emplace_back([this, i] {
      worker_index = i;
      profile::name_thread("loom worker " + std::to_string(i));
      worker_loop();
    });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

int ThreadPool::thread_index() { return worker_index; }
bool ThreadPool::runs_inline_here() { return in_worker || instance().workers_.empty(); }

// Claims tasks of the current job; the job and the index are read under one lock, and run()
// waits for every claimed task, so a late worker never runs a finished job's function.
void ThreadPool::work() {
  for (;;) {
    const std::function<void(int)>* fn;
    int i;
    uint32_t fp;
    {
      std::lock_guard lock(mu_);
      if (!job_ || next_ >= n_) return;
      fn = job_;
      i = next_++;
      fp = fp_control_;
    }
    if (detail::fp_control() != fp) detail::set_fp_control(fp);
    (*fn)(i);
    std::lock_guard lock(mu_);
    if (finished_.fetch_add(1) + 1 == n_) done_.notify_all();
  }
}

void ThreadPool::worker_loop() {
  in_worker = true;
  uint64_t seen = 0;
  for (;;) {
    spin_until([&] { return stop_.load() || generation_.load() != seen; });
    {
      std::unique_lock lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    work();
  }
}

void ThreadPool::run(int n, const std::function<void(int)>& fn) {
  if (n <= 0) return;
  if (n == 1 || runs_inline_here()) {
    for (int i = 0; i < n; ++i) fn(i);
    return;
  }
  std::lock_guard run_lock(run_mu_);
  {
    std::lock_guard lock(mu_);
    job_ = &fn;
    n_ = n;
    fp_control_ = detail::fp_control();
    next_ = 0;
    finished_ = 0;
    ++generation_;
  }
  wake_.notify_all();
  work();
  spin_until([&] { return finished_.load() == n; });
  std::unique_lock lock(mu_);
  done_.wait(lock, [&] { return finished_ == n_; });
  job_ = nullptr;
}

}  // namespace loom::cpu
