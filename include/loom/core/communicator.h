// The communicator interface: how the backends reach the other ranks of a distributed run.
//
// A Communicator connects `size()` ranks; every collective is called by every rank, in the
// same order, and blocks until all have joined (or the timeout passes: then DistError naming
// the op, the ranks that did not answer and the timeout). Implementations live in the dist
// room (Gloo over TCP, threads of one process); the reference kernels of the collective ops
// call the *current* communicator: the calling thread's (set by ThreadCommunicator, one per
// rank thread of the in-process group) or else the process's (set_communicator, dist::init).
//
//   auto c = loom::dist::current();          // nullptr before dist::init()
//   c->all_reduce(data, n, DType::Float32, loom::dist::ReduceOp::Sum);
//
// Thread-safety: one communicator is used by one thread at a time (a rank); current() and
// set_communicator() may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "loom/core/dtype.h"

namespace loom::dist {

enum class ReduceOp : uint8_t { Sum, Mean, Max, Min };
std::string_view reduce_op_name(ReduceOp op);

// The default timeout of every collective: LOOM_DIST_TIMEOUT (seconds, may be fractional),
// else 60 s.
std::chrono::milliseconds default_timeout();

class Communicator {
 public:
  virtual ~Communicator();
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "gloo", "gloo+shm" (all_reduce through shared memory) or "in-process", for messages.
  virtual std::string_view kind() const = 0;

  // In place over n elements of dtype dt. Mean divides the sum by size() (floating dtypes
  // only); bool Sum and Max are logical or, Min logical and.
  virtual void all_reduce(void* data, int64_t n, DType dt, ReduceOp op) = 0;
  // `bytes` from every rank into out (size() * bytes), in rank order.
  virtual void all_gather(const void* in, void* out, int64_t bytes) = 0;
  // in holds size() blocks of n elements; out receives the reduction of block rank().
  // Default: an all_reduce of the whole input, then the rank's block.
  virtual void reduce_scatter(const void* in, void* out, int64_t n, DType dt, ReduceOp op);
  // in holds size() blocks of `bytes`, block r for rank r; out receives every rank's block for
  // rank(), in rank order. Default: an all_gather of the whole input, then the blocks.
  virtual void all_to_all(const void* in, void* out, int64_t bytes);
  // root's `bytes` into every rank's data.
  virtual void broadcast(void* data, int64_t bytes, int root) = 0;
  virtual void barrier() = 0;
  // Every rank's message, in rank order (lengths may differ): the fingerprint checks.
  virtual std::vector<std::string> exchange(std::string_view mine) = 0;

  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }
  // A counter of the checked sync points (graph runs, barriers) this rank has passed.
  uint64_t next_sequence() { return sequence_++; }

 private:
  std::chrono::milliseconds timeout_ = default_timeout();
  uint64_t sequence_ = 0;
};

// The calling thread's communicator, else the process's; nullptr when none is set.
Communicator* current();
// The process's communicator (nullptr clears it).
void set_communicator(std::shared_ptr<Communicator> c);
std::shared_ptr<Communicator> process_communicator();

// Makes `c` the calling thread's communicator while it lives (a rank of an in-process group).
class ThreadCommunicator {
 public:
  explicit ThreadCommunicator(std::shared_ptr<Communicator> c);
  ~ThreadCommunicator();
  ThreadCommunicator(const ThreadCommunicator&) = delete;
  ThreadCommunicator& operator=(const ThreadCommunicator&) = delete;

 private:
  std::shared_ptr<Communicator> previous_;
};

// The current communicator; DistError naming `op` when there is none.
Communicator& require(const char* op);

}  // namespace loom::dist
