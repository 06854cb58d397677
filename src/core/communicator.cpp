// The current communicator (thread's, else process's) and the interface's shared defaults.
#include "loom/core/communicator.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "loom/core/error.h"

namespace loom::dist {

namespace {
std::mutex process_mu;
std::shared_ptr<Communicator> process_comm;
std::atomic<Communicator*> process_raw{nullptr};  // process_comm.get(), read without the lock
thread_local std::shared_ptr<Communicator> thread_comm;
}  // namespace

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Mean: return "mean";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

std::chrono::milliseconds default_timeout() {
  static const std::chrono::milliseconds t = [] {
    const char* s = std::getenv("LOOM_DIST_TIMEOUT");
    double sec = s && *s ? std::atof(s) : 60.0;
    if (!(sec > 0)) sec = 60.0;
    return std::chrono::milliseconds(static_cast<int64_t>(sec * 1000));
  }();
  return t;
}

Communicator::~Communicator() = default;

void Communicator::reduce_scatter(const void* in, void* out, int64_t n, DType dt, ReduceOp op) {
  const int64_t bytes = n * itemsize(dt);
  std::vector<unsigned char> all(static_cast<size_t>(bytes * size()));
  if (!all.empty()) std::memcpy(all.data(), in, all.size());
  all_reduce(all.data(), n * size(), dt, op);
  if (bytes > 0) std::memcpy(out, all.data() + bytes * rank(), static_cast<size_t>(bytes));
}

void Communicator::all_to_all(const void* in, void* out, int64_t bytes) {
  const int64_t w = size();
  std::vector<unsigned char> all(static_cast<size_t>(bytes * w * w));
  all_gather(in, all.data(), bytes * w);
  for (int64_t r = 0; r < w && bytes; ++r)
    std::memcpy(static_cast<unsigned char*>(out) + r * bytes, all.data() + (r * w + rank()) * bytes,
                static_cast<size_t>(bytes));
}

Communicator* current() {
  if (thread_comm) return thread_comm.get();
  return process_raw.load(std::memory_order_acquire);
}

void set_communicator(std::shared_ptr<Communicator> c) {
  std::lock_guard lock(process_mu);
  process_raw.store(c.get(), std::memory_order_release);
  process_comm = std::move(c);
}

std::shared_ptr<Communicator> process_communicator() {
  std::lock_guard lock(process_mu);
  return process_comm;
}

ThreadCommunicator::ThreadCommunicator(std::shared_ptr<Communicator> c)
    : previous_(std::move(thread_comm)) {
  thread_comm = std::move(c);
}

ThreadCommunicator::~ThreadCommunicator() { thread_comm = std::move(previous_); }

Communicator& require(const char* op) {
  Communicator* c = current();
  if (!c)
    throw DistError(loom::detail::str_cat(
        "[", op,
        "] no communicator: call loom::dist::init() (or run under loom-launch) before using "
        "collectives"));
  return *c;
}

}  // namespace loom::dist
