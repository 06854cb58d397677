// OneOmpThread: the calling thread's OpenMP team at one thread while it lives.
#pragma once

// libgomp's (oneDNN runs on it; loom's pool threads call oneDNN and dnnl_sgemm).
extern "C" void omp_set_num_threads(int);
extern "C" int omp_get_max_threads();

namespace loom::cpu {

// Each thread that creates or runs a primitive, or calls dnnl_sgemm, runs it alone: oneDNN sizes a
// primitive's parallel loops when it is created (brgemm) and would otherwise start an OpenMP team
// of every core beside loom's pool. The thread's own OpenMP setting comes back afterwards (a
// caller's thread may run OpenMP code of its own, PyTorch's for one).
class OneOmpThread {
 public:
  OneOmpThread() : saved_(omp_get_max_threads()) {
    if (saved_ != 1) omp_set_num_threads(1);
  }
  ~OneOmpThread() {
    if (saved_ != 1) omp_set_num_threads(saved_);
  }
  OneOmpThread(const OneOmpThread&) = delete;
  OneOmpThread& operator=(const OneOmpThread&) = delete;

 private:
  int saved_;
};

}  // namespace loom::cpu
