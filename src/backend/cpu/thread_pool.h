// ThreadPool: persistent workers for the CPU backend's parallel loops.
//
// run(n, fn) calls fn(0..n-1) across the calling thread and the workers and returns when all
// are done. Workers sleep on a condition variable between jobs (they never spin), and BLAS
// calls are made from the pool with OpenBLAS itself single-threaded, so the two never
// compete for cores (PyTorch 1.13 runs 2-6x slower here when both pools spin). A run from a
// worker (nested) executes inline. Threads: LOOM_NUM_THREADS, else the number of cores.
// Thread-safe: concurrent run() calls from different threads are serialized.
#pragma once

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
  int n_ = 0, next_ = 0, finished_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace loom::cpu
