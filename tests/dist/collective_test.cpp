// The collectives against closed forms: every op, every dtype, ranks as threads (2 and 4, on
// the ref and cpu backends) and as processes over Gloo (2 and 3 ranks on 127.0.0.1, all_reduce
// through shared memory and on the TCP ring, sizes past Gloo's 1 MiB segments and the
// segment's slots); their VJPs against float64 central differences of the ranks' summed
// objective computed on the host.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dist/dist_util.h"
#include "expect_error.h"
#include "loom/ir/builder.h"
#include "loom/loom.h"
#include "loom/runtime/engine.h"

namespace loom {
namespace {

using dist::ReduceOp;
using testing::gloo_ranks;
using testing::ScopedEnv;
using testing::thread_ranks;

// Rank r's element i: small integers, exact in every dtype (bf16 holds integers to 256).
double value(int r, int64_t i) { return static_cast<double>((r + 1) * (i % 7) + r); }
bool bvalue(int r, int64_t i) { return (i + r) % 3 == 0; }

Tensor input(int r, int64_t n, DType dt, Shape shape = {}) {
  if (shape.rank() == 0) shape = {n};
  if (dt == DType::Bool) {
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = bvalue(r, i);
    return to(tensor(v, shape), DType::Bool);
  }
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = value(r, i);
  return to(tensor(v, shape), dt);
}

std::vector<double> read(const Tensor& t) { return to(t, DType::Float64).to_vector<double>(); }

// All collectives on `n` elements for one rank of `world`, checked against closed forms.
void check_all_reduce(int r, int world, int64_t n, DType dt) {
  SCOPED_TRACE(::testing::Message() << "rank " << r << "/" << world << " " << dt << " n=" << n);
  Tensor x = input(r, n, dt);
  std::vector<double> s = read(dist::all_reduce(x, ReduceOp::Sum));
  std::vector<double> mx = read(dist::all_reduce(x, ReduceOp::Max));
  std::vector<double> mn = read(dist::all_reduce(x, ReduceOp::Min));
  ASSERT_EQ(static_cast<int64_t>(s.size()), n);
  int bad = 0;
  for (int64_t i = 0; i < n && bad < 5; ++i) {
    double sum = 0, hi = -1e300, lo = 1e300;
    bool any = false, all = true;
    for (int k = 0; k < world; ++k) {
      sum += value(k, i), hi = std::max(hi, value(k, i)), lo = std::min(lo, value(k, i));
      any = any || bvalue(k, i), all = all && bvalue(k, i);
    }
    if (dt == DType::Bool) sum = any, hi = any, lo = all;
    const size_t u = static_cast<size_t>(i);
    if (s[u] != sum || mx[u] != hi || mn[u] != lo) {
      ++bad;
      ADD_FAILURE() << "element " << i << ": sum " << s[u] << " (want " << sum << "), max " << mx[u]
                    << " (" << hi << "), min " << mn[u] << " (" << lo << ")";
    }
  }
  if (is_floating(dt)) {
    std::vector<double> mean = read(dist::all_reduce(x, ReduceOp::Mean));
    for (int64_t i = 0; i < std::min<int64_t>(n, 50); ++i) {
      double sum = 0;
      for (int k = 0; k < world; ++k) sum += value(k, i);
      const double want = sum / world;
      EXPECT_NEAR(mean[static_cast<size_t>(i)], want, std::abs(want) * 1e-2 + 1e-12) << i;
    }
  }
}

// all_gather and reduce_scatter along dims 0 and 1 of a [4, 6] (per rank) tensor.
void check_gather_scatter(int r, int world, DType dt) {
  SCOPED_TRACE(::testing::Message() << "rank " << r << "/" << world << " " << dt);
  const int64_t R = 4, C = 6;
  Tensor x = input(r, R * C, dt, {R, C});
  for (int64_t dim : {0, 1}) {
    std::vector<double> g = read(dist::all_gather(x, dim));
    const int64_t rows = dim == 0 ? R * world : R, cols = dim == 0 ? C : C * world;
    ASSERT_EQ(static_cast<int64_t>(g.size()), rows * cols);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        const int k = static_cast<int>(dim == 0 ? i / R : j / C);
        const int64_t e = dim == 0 ? (i % R) * C + j : i * C + j % C;
        const double want = dt == DType::Bool ? bvalue(k, e) : value(k, e);
        ASSERT_EQ(g[static_cast<size_t>(i * cols + j)], want)
            << "dim " << dim << " at " << i << "," << j;
      }
  }
  if (dt == DType::Bool) return;
  // reduce_scatter of y = [world * 2, 3] (dim 0) or [2, world * 3] (dim 1).
  for (int64_t dim : {0, 1}) {
    const int64_t rows = dim == 0 ? 2 * world : 2, cols = dim == 0 ? 3 : 3 * world;
    Tensor y = input(r, rows * cols, dt, {rows, cols});
    std::vector<double> got = read(dist::reduce_scatter(y, dim));
    ASSERT_EQ(got.size(), 6u);
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t j = 0; j < 3; ++j) {
        const int64_t gi = dim == 0 ? r * 2 + i : i, gj = dim == 0 ? j : r * 3 + j;
        double want = 0;
        for (int k = 0; k < world; ++k) want += value(k, gi * cols + gj);
        ASSERT_EQ(got[static_cast<size_t>(i * 3 + j)], want) << "dim " << dim;
      }
  }
  std::vector<double> b = read(dist::broadcast(x, world - 1));
  for (int64_t i = 0; i < R * C; ++i) ASSERT_EQ(b[static_cast<size_t>(i)], value(world - 1, i));
}

const DType kAll[] = {DType::Bool,    DType::Int32,   DType::Int64,  DType::BFloat16,
                      DType::Float16, DType::Float32, DType::Float64};

class InProcessCollectives : public ::testing::TestWithParam<std::tuple<int, std::string>> {
 protected:
  void SetUp() override { runtime::set_backend(std::get<1>(GetParam())); }
  void TearDown() override { runtime::set_backend("cpu"); }
};

TEST_P(InProcessCollectives, EveryOpAndDTypeMatchesTheClosedForm) {
  const int world = std::get<0>(GetParam());
  thread_ranks(world, [&](int r) {
    for (DType dt : kAll) {
      check_all_reduce(r, world, 37, dt);
      check_gather_scatter(r, world, dt);
    }
    EXPECT_EQ(dist::rank(), r);
    EXPECT_EQ(dist::world_size(), world);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, InProcessCollectives,
                         ::testing::Combine(::testing::Values(2, 4),
                                            ::testing::Values(std::string("cpu"),
                                                              std::string("ref"))));

// The communicator's all_gather and broadcast on `bytes` bytes (rank r's byte i is a closed
// form of r and i), against the closed form: sizes past a 4 KiB slot and a 4 MiB one cross
// chunks on the segment.
void check_gather_broadcast_bytes(int r, int world, int64_t bytes) {
  SCOPED_TRACE(::testing::Message() << "rank " << r << "/" << world << ", " << bytes << " bytes");
  dist::Communicator& c = dist::require("test");
  auto byte = [](int rank, int64_t i) { return static_cast<uint8_t>((i * 131 + rank * 17) % 251); };
  std::vector<uint8_t> mine(static_cast<size_t>(bytes)), all(static_cast<size_t>(bytes * world));
  for (int64_t i = 0; i < bytes; ++i) mine[static_cast<size_t>(i)] = byte(r, i);
  c.all_gather(mine.data(), all.data(), bytes);
  for (int k = 0; k < world; ++k)
    for (int64_t i = 0; i < bytes; ++i)
      ASSERT_EQ(all[static_cast<size_t>(k * bytes + i)], byte(k, i))
          << "block " << k << " byte " << i;
  const int root = world - 1;
  c.broadcast(mine.data(), bytes, root);
  for (int64_t i = 0; i < bytes; ++i)
    ASSERT_EQ(mine[static_cast<size_t>(i)], byte(root, i)) << "broadcast byte " << i;
}

// Gloo ranks on one host: all_reduce through the shared-memory segment (its 4 MiB slots, and
// 4 KiB slots so that every size crosses chunks) and, with LOOM_DIST_SHM=0, on Gloo's TCP ring.
class GlooTransports : public ::testing::TestWithParam<std::string> {};

TEST_P(GlooTransports, EveryOpAndDTypeMatchesTheClosedForm) {
  const std::string mode = GetParam();
  ScopedEnv shm("LOOM_DIST_SHM", mode == "tcp" ? "0" : "1");
  ScopedEnv kib("LOOM_DIST_SHM_KIB", mode == "shm_4kib" ? "4" : "4096");
  gloo_ranks(2, 20, [&](int r) {
    EXPECT_EQ(dist::require("test").kind(), mode == "tcp" ? "gloo" : "gloo+shm");
    for (DType dt : kAll) {
      check_all_reduce(r, 2, 37, dt);
      check_gather_scatter(r, 2, dt);
    }
    // Past Gloo's 1 MiB segments and a 4 MiB slot (odd counts: uneven chunks and blocks).
    check_all_reduce(r, 2, (3 << 18) + 7, DType::Float32);
    check_all_reduce(r, 2, (5 << 18) + 3, DType::Float32);
    check_all_reduce(r, 2, (1 << 18) + 3, DType::Float64);
    check_all_reduce(r, 2, (1 << 19) + 1, DType::BFloat16);
    for (int64_t bytes : {int64_t{1}, int64_t{10007}, (int64_t{5} << 20) + 3})
      check_gather_broadcast_bytes(r, 2, bytes);
    dist::barrier();
  });
}

INSTANTIATE_TEST_SUITE_P(Gloo, GlooTransports,
                         ::testing::Values(std::string("shm"), std::string("shm_4kib"),
                                           std::string("tcp")));

// Three ranks through the segment: blocks of uneven sizes, and buffers shorter than the world
// (ranks with an empty block), every dtype.
TEST(GlooSharedMemory, ThreeRanks) {
  ScopedEnv kib("LOOM_DIST_SHM_KIB", "4");
  gloo_ranks(3, 20, [](int r) {
    EXPECT_EQ(dist::require("test").kind(), "gloo+shm");
    for (DType dt : kAll)
      for (int64_t n : {1, 2, 37, 4099}) check_all_reduce(r, 3, n, dt);
    for (int64_t bytes : {3, 10007}) check_gather_broadcast_bytes(r, 3, bytes);
    dist::barrier();
  });
}

// A rank that never reaches an all_reduce on the segment while its process lives: the other
// raises within twice the timeout, naming it, and the communicator stays broken.
TEST(GlooSharedMemory, MissingRankTimesOut) {
  gloo_ranks(
      2, 2.0,
      [](int r) {
        dist::Communicator& c = dist::require("test");
        ASSERT_EQ(c.kind(), "gloo+shm");
        if (r == 1) {  // skips the collective, alive past rank 0's timeout
          std::this_thread::sleep_for(std::chrono::milliseconds(3000));
          return;
        }
        std::vector<float> v(1000, 1.0f);
        const auto t0 = std::chrono::steady_clock::now();
        testing::expect_error<DistError>(
            [&] { c.all_reduce(v.data(), 1000, DType::Float32, ReduceOp::Sum); },
            {"[all_reduce]", "rank 0 of 2", "shared memory", "rank 1 did not reach", "2 s"});
        const double waited =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        EXPECT_GT(waited, 1.9);
        EXPECT_LT(waited, 4.0);
        testing::expect_error<DistError>(
            [&] { c.all_reduce(v.data(), 1000, DType::Float32, ReduceOp::Sum); }, {"broken"});
      },
      30);
}

// barrier() through the segment: nobody leaves before the last rank arrives, and a rank that
// never comes is named at the timeout as "[barrier]".
TEST(GlooSharedMemory, BarrierWaitsForTheLastRank) {
  gloo_ranks(
      2, 2.0,
      [](int r) {
        dist::Communicator& c = dist::require("test");
        ASSERT_EQ(c.kind(), "gloo+shm");
        const auto t0 = std::chrono::steady_clock::now();
        if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
        c.barrier();
        const double waited =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        EXPECT_GT(waited, 0.25) << "rank " << r << " left the barrier before rank 1 came";
        if (r == 1) {  // alive, but skips the next barrier past rank 0's timeout
          std::this_thread::sleep_for(std::chrono::milliseconds(3000));
          return;
        }
        testing::expect_error<DistError>(
            [&] { c.barrier(); }, {"[barrier]", "rank 0 of 2", "rank 1 did not reach", "2 s"});
      },
      30);
}

// Ranks that call different collectives (or sizes) on the segment raise at its first wait,
// naming each rank's call, instead of mixing their buffers; the communicator stays broken.
TEST(GlooSharedMemory, DifferentCollectivesRaiseOnEveryRank) {
  gloo_ranks(
      2, 20.0,
      [](int r) {
        dist::Communicator& c = dist::require("test");
        ASSERT_EQ(c.kind(), "gloo+shm");
        std::vector<float> v(10, 1.0f), out(20);
        const std::vector<std::string> names = {"the ranks called different collectives",
                                                "rank 0 all_reduce(sum) of 10 float32",
                                                "rank 1 all_gather of 40 bytes"};
        if (r == 0)
          testing::expect_error<DistError>(
              [&] { c.all_reduce(v.data(), 10, DType::Float32, ReduceOp::Sum); }, names);
        else
          testing::expect_error<DistError>([&] { c.all_gather(v.data(), out.data(), 40); }, names);
        testing::expect_error<DistError>([&] { c.barrier(); }, {"broken"});
      },
      30);
}

// The same collective with another count on one rank (each gloo_ranks runs in a TEST of its
// own: the rank processes rerun the test that spawned them).
TEST(GlooSharedMemory, DifferentSizesRaiseOnEveryRank) {
  gloo_ranks(
      2, 20.0,
      [](int r) {
        dist::Communicator& c = dist::require("test");
        std::vector<double> v(8, 1.0);
        const int64_t n = r == 0 ? 8 : 5;  // another size
        testing::expect_error<DistError>(
            [&] { c.all_reduce(v.data(), n, DType::Float64, ReduceOp::Max); },
            {"rank 0 all_reduce(max) of 8 float64", "rank 1 all_reduce(max) of 5 float64"});
      },
      30);
}

// A rank whose process exits instead: the other raises as soon as it sees the process gone
// (it looks every 10 ms of a wait), naming the rank, well before the timeout.
TEST(GlooSharedMemory, DeadRankIsNamedBeforeTheTimeout) {
  gloo_ranks(
      2, 20.0,
      [](int r) {
        dist::Communicator& c = dist::require("test");
        ASSERT_EQ(c.kind(), "gloo+shm");
        std::vector<float> v(1000, 1.0f);
        c.all_reduce(v.data(), 1000, DType::Float32, ReduceOp::Sum);
        if (r == 1) {
          std::fflush(stdout);
          ::_exit(0);  // dies: no goodbye to rank 0
        }
        const auto t0 = std::chrono::steady_clock::now();
        testing::expect_error<DistError>(
            [&] { c.all_reduce(v.data(), 1000, DType::Float32, ReduceOp::Sum); },
            {"[all_reduce]", "rank 0 of 2", "shared memory", "rank 1 died"});
        EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                  5.0);
      },
      60);
}

// Collectives inside scan bodies, assume_pure and compile(trace_once): the same closed form.
void check_in_tools(int r, int world) {
  const double sum_r = world * (world - 1) / 2.0;  // sum over ranks of r
  Tensor xs = full({5, 3}, r, DType::Float32);
  auto [c, ys] = scan(
      [](const Tensor& acc, const Tensor& x) {
        Tensor s = dist::all_reduce(x);
        return std::pair{acc + s, s};
      },
      zeros({3}), xs);
  for (float v : c.to_vector<float>()) EXPECT_EQ(v, 5 * sum_r);
  for (float v : ys.to_vector<float>()) EXPECT_EQ(v, sum_r);
  auto pure = assume_pure([](const Tensor& a) { return dist::all_gather(a * 2.0); });
  std::vector<float> g = pure(full({2}, r)).to_vector<float>();
  for (int k = 0; k < world; ++k) EXPECT_EQ(g[static_cast<size_t>(2 * k)], 2.0f * k);
  Tensor w = full({3}, 1.0 + r);
  auto step = compile(
      [&](const Tensor& x) {
        Tensor m = dist::all_reduce(x * w, ReduceOp::Mean);
        w.copy_(w + m);
        return m;
      },
      {.name = "dist_step", .trace_once = true});
  double wv = 1.0 + r;  // w on this rank; the mean of w over ranks is what m sees
  double wmean = 1.0 + sum_r / world;
  for (int it = 0; it < 3; ++it) {
    std::vector<float> m = step(ones({3})).to_vector<float>();
    EXPECT_NEAR(m[0], wmean, 1e-5) << "iteration " << it;
    wv += wmean;
    wmean += wmean;
    EXPECT_NEAR(w.to_vector<float>()[0], wv, 1e-4);
  }
}

TEST(InProcessCollectives2, InsideScanAssumePureAndCompile) {
  thread_ranks(2, [](int r) { check_in_tools(r, 2); });
  thread_ranks(4, [](int r) { check_in_tools(r, 4); });
}

TEST(GlooCollectives, InsideScanAssumePureAndCompile) {
  gloo_ranks(2, 20, [](int r) { check_in_tools(r, 2); });
}

TEST(InProcessCollectives2, WithoutACommunicatorRaises) {
  dist::finalize();
  testing::expect_error<DistError>([] { dist::all_reduce(ones({2})); },
                                   {"[all_reduce]", "dist::init()"});
  testing::expect_error<DistError>([] { dist::barrier(); }, {"[barrier]"});
}

TEST(InProcessCollectives2, BadArgumentsRaise) {
  thread_ranks(2, [](int) {
    testing::expect_error<DTypeError>(
        [] { dist::all_reduce(ones({2}, DType::Int32), ReduceOp::Mean); },
        {"[all_reduce]", "mean", "i32[2]"});
    testing::expect_error<ShapeError>([] { dist::reduce_scatter(ones({3})); },
                                      {"[reduce_scatter_sum]", "f32[3]", "2 ranks"});
    testing::expect_error<ShapeError>([] { dist::all_gather(ones({3}), 1); },
                                      {"[all_gather]", "dim 1", "f32[3]"});
    testing::expect_error<Error>([] { dist::broadcast(ones({3}), 2); }, {"[broadcast]", "root 2"});
  });
}

// The type rule of a graph built from IR text (a fuzzed or hand-written file): a world out of
// range, and a gathered extent past int64, are errors, not overflows.
TEST(CollectiveTypes, WorldAndGatheredExtentAreChecked) {
  auto gather = [](int64_t extent, int64_t world) {
    ir::Graph g;
    ir::Builder b(g);
    ir::Value x = b.parameter({DType::Float32, {extent}});
    ir::Attrs a;
    a.i = world;
    a.ints.push_back(0);
    b.make(ir::OpKind::AllGather, std::span<const ir::Value>(&x, 1), a);
  };
  testing::expect_error<Error>([&] { gather(6, INT64_MAX); }, {"[all_gather]", "world"});
  testing::expect_error<Error>([&] { gather(6, 0); }, {"[all_gather]", "world"});
  testing::expect_error<ShapeError>([&] { gather(int64_t{1} << 40, int64_t{1} << 24); },
                                    {"[all_gather]", "overflows"});
  gather(6, 4);  // f32[24]
}

}  // namespace
}  // namespace loom
