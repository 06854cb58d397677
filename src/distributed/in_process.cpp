// The in-process communicator: N ranks on N threads of one process, meeting in rounds on a
// shared group. Each round gathers every rank's bytes; each rank then computes its result from
// all of them in rank order, so results are deterministic and equal on every rank.
#include <condition_variable>
#include <cstring>
#include <mutex>

#include "distributed/in_process_impl.h"
#include "distributed/reduce_impl.h"
#include "loom/core/error.h"

namespace loom::dist {

namespace {

using loom::detail::str_cat;

// The state of one group. A round is open for deposits until every rank has deposited, then
// open for reading until every rank has read; a rank that waits past the timeout breaks the
// group (every later call raises the same error).
struct Group {
  explicit Group(int n) : n(n), data(static_cast<size_t>(n)), ops(static_cast<size_t>(n)) {
    present.assign(static_cast<size_t>(n), 0);
  }
  std::mutex mu;
  std::condition_variable cv;
  const int n;
  bool delivering = false;
  int arrived = 0, departed = 0;
  std::vector<std::string> data;
  std::vector<std::string> ops;
  std::vector<uint8_t> present;
  std::string broken;
};

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<Group> g, int rank) : g_(std::move(g)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_->n; }
  std::string_view kind() const override { return "in-process"; }

  void all_reduce(void* data, int64_t n, DType dt, ReduceOp op) override {
    detail::check_reduce("all_reduce", dt, op);
    const size_t bytes = static_cast<size_t>(n * itemsize(dt));
    std::vector<std::string> all =
        round("all_reduce", std::string(static_cast<const char*>(data), bytes));
    if (bytes == 0) return;
    std::memcpy(data, all[0].data(), bytes);
    for (int r = 1; r < size(); ++r)
      detail::reduce_into(data, all[static_cast<size_t>(r)].data(), n, dt, op);
    if (op == ReduceOp::Mean) detail::divide(data, n, dt, size());
  }

  void all_gather(const void* in, void* out, int64_t bytes) override {
    std::vector<std::string> all =
        round("all_gather", std::string(static_cast<const char*>(in), static_cast<size_t>(bytes)));
    for (int r = 0; r < size(); ++r)
      if (bytes)
        std::memcpy(static_cast<char*>(out) + r * bytes, all[static_cast<size_t>(r)].data(),
                    static_cast<size_t>(bytes));
  }

  void broadcast(void* data, int64_t bytes, int root) override {
    LOOM_CHECK(root >= 0 && root < size(), "[broadcast] root ", root, " is not a rank of ", size());
    std::string mine = rank_ == root
                           ? std::string(static_cast<const char*>(data), static_cast<size_t>(bytes))
                           : std::string();
    std::vector<std::string> all = round("broadcast", std::move(mine));
    if (bytes) std::memcpy(data, all[static_cast<size_t>(root)].data(), static_cast<size_t>(bytes));
  }

  void barrier() override { round("barrier", {}); }

  std::vector<std::string> exchange(std::string_view mine) override {
    return round("exchange", std::string(mine));
  }

 private:
  std::vector<std::string> round(const char* op, std::string mine) {
    Group& g = *g_;
    const auto deadline = std::chrono::steady_clock::now() + timeout();
    std::unique_lock lock(g.mu);
    auto fail = [&](const std::string& waiting_for) {
      std::string missing;
      for (int r = 0; r < g.n; ++r)
        if (!g.present[static_cast<size_t>(r)])
          missing += (missing.empty() ? "" : ",") + std::to_string(r);
      g.broken = str_cat("[", op, "] rank ", rank_, " of ", g.n, " (in-process): timed out after ",
                         timeout().count() / 1000.0, " s (the timeout) waiting for ", waiting_for,
                         missing.empty() ? "" : "; ranks that did not come: " + missing);
      g.cv.notify_all();
      throw DistError(g.broken);
    };
    if (!g.cv.wait_until(lock, deadline, [&] { return !g.delivering || !g.broken.empty(); }))
      fail("the previous round to end");
    if (!g.broken.empty())
      throw DistError(g.broken + " (raised again on rank " + std::to_string(rank_) + ")");
    g.data[static_cast<size_t>(rank_)] = std::move(mine);
    g.ops[static_cast<size_t>(rank_)] = op;
    g.present[static_cast<size_t>(rank_)] = 1;
    if (++g.arrived == g.n) {
      g.delivering = true;
      g.cv.notify_all();
    } else if (!g.cv.wait_until(lock, deadline,
                                [&] { return g.delivering || !g.broken.empty(); })) {
      fail("the other ranks");
    }
    if (!g.broken.empty())
      throw DistError(g.broken + " (raised again on rank " + std::to_string(rank_) + ")");
    std::vector<std::string> result = g.data;
    std::vector<std::string> ops = g.ops;
    if (++g.departed == g.n) {
      g.delivering = false;
      g.arrived = g.departed = 0;
      g.present.assign(static_cast<size_t>(g.n), 0);
      g.cv.notify_all();
    }
    lock.unlock();
    for (int r = 1; r < g.n; ++r) {
      if (ops[static_cast<size_t>(r)] == ops[0]) continue;
      std::string who;
      for (int k = 0; k < g.n; ++k)
        who += str_cat(k ? ", " : "", "rank ", k, " ", ops[static_cast<size_t>(k)]);
      throw DistError(str_cat("[", op, "] the ranks called different collectives: ", who,
                              " (seen on rank ", rank_, ")"));
    }
    return result;
  }

  std::shared_ptr<Group> g_;
  int rank_;
};

}  // namespace

std::vector<std::shared_ptr<Communicator>> in_process_group(int n,
                                                            std::chrono::milliseconds timeout) {
  LOOM_CHECK(n >= 1, "[in_process_group] needs at least one rank, got ", n);
  auto g = std::make_shared<Group>(n);
  std::vector<std::shared_ptr<Communicator>> out;
  for (int r = 0; r < n; ++r) {
    out.push_back(std::make_shared<InProcessCommunicator>(g, r));
    out.back()->set_timeout(timeout);
  }
  return out;
}

}  // namespace loom::dist
