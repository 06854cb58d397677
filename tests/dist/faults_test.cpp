// No hangs: ranks that trace different graphs, a rank that skips a collective, a rank killed
// mid-step and a store that never fills each end within twice the timeout with a DistError on
// every surviving rank that names the rank(s) and, for graphs, the first differing op.
#include <gtest/gtest.h>

#include <chrono>

#include "dist/dist_util.h"
#include "expect_error.h"
#include "loom/loom.h"

namespace loom {
namespace {

using testing::expect_error;
using testing::gloo_ranks;
using Clock = std::chrono::steady_clock;

constexpr double kTimeout = 2.0;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Rank 1 traces a different batch shape: both raise, naming the ranks and both IR lines.
void different_graphs(int r) {
  Tensor x = ones({r == 0 ? 4 : 8, 3});
  auto t0 = Clock::now();
  expect_error<DistError>([&] { dist::all_reduce(sum(x, {1})).to_vector<float>(); },
                          {"not running the same collectives", "rank 0", "rank 1",
                           "First difference", "f32[4,3]", "f32[8,3]"});
  EXPECT_LT(since(t0), 2 * kTimeout);
}

// Rank 0 reads the loss (its graph holds the all_reduce); rank 1 does not and goes on to the
// barrier: both raise, naming what each rank was doing.
void skipped_collective(int r) {
  Tensor loss = sum(dist::all_reduce(full({1}, 1.0 + r)));
  auto t0 = Clock::now();
  if (r == 0)
    expect_error<DistError>([&] { loss.item<float>(); },
                            {"rank 0 runs the graph", "rank 1 calls barrier()", "all_reduce_sum"});
  else
    expect_error<DistError>([&] { dist::barrier(); },
                            {"rank 0 runs the graph", "rank 1 calls barrier()", "all_reduce_sum"});
  EXPECT_LT(since(t0), 2 * kTimeout);
}

TEST(DistFaults, InProcessDifferentGraphs) {
  testing::thread_ranks(2, different_graphs, std::chrono::milliseconds(2000));
}
TEST(DistFaults, InProcessSkippedCollective) {
  testing::thread_ranks(2, skipped_collective, std::chrono::milliseconds(2000));
}

TEST(DistFaults, InProcessMissingRankTimesOut) {
  testing::thread_ranks(
      3,
      [](int r) {
        if (r == 2) return;  // never joins
        auto t0 = Clock::now();
        expect_error<DistError>([] { dist::all_reduce(ones({2})).to_vector<float>(); },
                                {"timed out", "2 s", "rank"});
        EXPECT_LT(since(t0), 2 * kTimeout);
      },
      std::chrono::milliseconds(2000));
}

TEST(DistFaults, GlooDifferentGraphs) { gloo_ranks(2, kTimeout, different_graphs, 30); }
TEST(DistFaults, GlooSkippedCollective) { gloo_ranks(2, kTimeout, skipped_collective, 30); }
// The same on Gloo's TCP ring (LOOM_DIST_SHM=0), where the cross-rank check's all_reduce
// and the collectives go over TCP instead of the shared-memory segment.
TEST(DistFaults, GlooRingDifferentGraphs) {
  testing::ScopedEnv ring("LOOM_DIST_SHM", "0");
  gloo_ranks(2, kTimeout, different_graphs, 30);
}
TEST(DistFaults, GlooRingSkippedCollective) {
  testing::ScopedEnv ring("LOOM_DIST_SHM", "0");
  gloo_ranks(2, kTimeout, skipped_collective, 30);
}

// Rank 1 dies after the first step: rank 0's second step raises within twice the timeout,
// naming rank 1 as dead. Which check sees it first depends on timing: a send to the closed
// connection, the wait for the cross-rank check (timeout), or the collective itself.
TEST(DistFaults, GlooRankKilledMidStep) {
  gloo_ranks(
      2, kTimeout,
      [](int r) {
        Tensor w = ones({1000});
        auto step = [&] { return sum(dist::all_reduce(w * 2.0)).item<float>(); };
        EXPECT_EQ(step(), 4000.0f);
        if (r == 1) {
          std::fflush(stdout);
          ::_exit(0);  // killed: no goodbye to the others
        }
        auto t0 = Clock::now();
        expect_error<DistError>([&] { step(); }, {"rank 1", "died"});
        EXPECT_LT(since(t0), 2 * kTimeout);
      },
      30);
}

// World of 2, only rank 0 comes: init raises within twice the timeout, naming rank 1.
TEST(DistFaults, StoreThatNeverFills) {
  const std::string store = testing::fresh_store();
  dist::InitOptions o;
  o.rank = 0;
  o.world_size = 2;
  o.store = store;
  o.timeout_s = kTimeout;
  auto t0 = Clock::now();
  expect_error<DistError>([&] { dist::init(o); },
                          {"[init]", "did not fill", "2 s", "ranks that never registered: 1"});
  EXPECT_LT(since(t0), 2 * kTimeout);
  EXPECT_FALSE(dist::initialized());
  std::error_code ec;
  std::filesystem::remove_all(store, ec);
}

}  // namespace
}  // namespace loom
