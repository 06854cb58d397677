// ThreadPool: persistent workers for the CPU backend's parallel loops.
//
// run(n, fn) calls fn(0..n-1) across the calling thread and the workers and returns when all
// are done. After a job, workers spin (with pause) for at most LOOM_SPIN_US (default 200;
// 0 turns spinning off) for the next one,
// then sleep on a condition variable; the caller likewise spins that long for the last task
// before sleeping. A wake-up through the kernel costs 20-80 us on a VM, as much as a small
// kernel, and a step's kernels come microseconds apart (the MLP step of loom-bench
// mlp_train: 180 us of its 820 us were such gaps). Spins are bounded so that an idle
// process sleeps, and BLAS calls are made from the pool with OpenBLAS itself
// single-threaded, so the two never compete for cores (PyTorch 1.13 runs 2-6x slower here
// when both pools spin unbounded). A run from a worker (nested) executes inline. Threads:
// LOOM_NUM_THREADS, else the number of cores. Tasks run in the caller's floating-point mode
// (its MXCSR, loom/core/fp_mode.h: a run flushes denormals on every thread or on none).
// Thread-safe: concurrent run() calls from different threads are serialized.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace loom::cpu {

class ThreadPool {
 public:
  static ThreadPool& instance();
  ~ThreadPool();
  int size() const { return static_cast<int>(workers_.size()) + 1; }
  // The calling thread's place in the pool: worker i (1..size()-1), or 0 for any other thread
  // (the callers of run()). Stable for a thread's life.
  static int thread_index();
  // Whether run() called from this thread runs every task here, one after another (a run
  // from a worker: nested).
  static bool runs_inline_here();
  void run(int n, const std::function<void(int)>& fn);

 private:
  explicit ThreadPool(int threads);
  void worker_loop();
  void work();

  std::mutex run_mu_;  // one job at a time
  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  const std::function<void(int)>* job_ = nullptr;
  int n_ = 0, next_ = 0;
  uint32_t fp_control_ = 0;              // the caller's floating-point control word
  std::atomic<int> finished_{0};         // written under mu_, read by spinning callers
  std::atomic<uint64_t> generation_{0};  // written under mu_, read by spinning workers
  std::atomic<bool> stop_{false};
};

}  // namespace loom::cpu
