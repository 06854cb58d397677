// Native small-body loops (src/backend/cpu/native_loop.cpp): random scan bodies (reverse, tree
// carries of f32, f64, int32 and bool leaves, captured tensors, random draws, zero and odd trip
// counts), while loops with data-dependent and zero trip counts, and the gradients of scans
// (their VJP is a reverse scan), each run three ways from the same seed: on the reference
// backend (the oracle), on the cpu backend with native loops off (the general path) and on.
// Every run checks which path the cpu backend took (cpu::loop_stats), so a planner that
// silently falls back fails; bodies with products or large carries must stay general.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/program.h"
#include "loom/loom.h"
#include "loom/runtime/engine.h"

namespace {

using loom::DType;
using loom::Tensor;
using Dict = std::map<std::string, Tensor>;

enum class Mode { Ref, General, Native };

struct LoopRun {
  std::vector<std::vector<double>> values;
  loom::cpu::LoopStats loops;  // loops compiled by the cpu backend during the run
};

// Traces fn from `seed` in mode m, syncs once and reads every result.
template <class Fn>
LoopRun run_in(Mode m, uint64_t seed, Fn&& fn) {
  loom::sync();
  loom::runtime::set_backend(m == Mode::Ref ? "ref" : "cpu");
  loom::cpu::set_native_loops(m == Mode::Native);
  loom::runtime::clear_compile_cache();
  loom::manual_seed(seed);
  const loom::cpu::LoopStats before = loom::cpu::loop_stats();
  std::vector<Tensor> out = fn();
  loom::sync();
  LoopRun r;
  for (const Tensor& t : out) r.values.push_back(t.to_vector<double>());
  const loom::cpu::LoopStats after = loom::cpu::loop_stats();
  r.loops = {after.native - before.native, after.general - before.general};
  return r;
}

void expect_close(const LoopRun& got, const LoopRun& want, double tol, const char* what) {
  ASSERT_EQ(got.values.size(), want.values.size()) << what;
  for (size_t k = 0; k < got.values.size(); ++k) {
    ASSERT_EQ(got.values[k].size(), want.values[k].size()) << what << " result " << k;
    for (size_t i = 0; i < got.values[k].size(); ++i) {
      const double a = got.values[k][i], b = want.values[k][i];
      if (std::isnan(b)) {
        EXPECT_TRUE(std::isnan(a)) << what << " result " << k << "[" << i << "]";
        continue;
      }
      EXPECT_NEAR(a, b, tol * (1 + std::abs(b))) << what << " result " << k << "[" << i << "]";
    }
  }
}

class NativeLoopsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    loom::sync();
    previous_ = std::string(loom::runtime::current_backend().name());
  }
  void TearDown() override {
    loom::sync();
    loom::cpu::set_native_loops(true);
    loom::runtime::set_backend(previous_);
    loom::runtime::clear_compile_cache();
  }

  // fn's results on the native path against the general path and the reference backend;
  // `loops`: how many loops the program compiles (all of them must go native).
  template <class Fn>
  void expect_native_matches(uint64_t seed, int64_t loops, Fn&& fn) {
    const LoopRun ref = run_in(Mode::Ref, seed, fn);
    const LoopRun general = run_in(Mode::General, seed, fn);
    const LoopRun native = run_in(Mode::Native, seed, fn);
    EXPECT_EQ(general.loops.native, 0);
    EXPECT_EQ(general.loops.general, loops);
    EXPECT_EQ(native.loops.native, loops) << "a loop fell back to the general path";
    EXPECT_EQ(native.loops.general, 0);
    expect_close(native, general, 1e-5, "native vs general");
    expect_close(native, ref, 1e-4, "native vs ref");
  }

  std::string previous_;
};

Tensor floats(std::vector<float> v, loom::Shape s) {
  return loom::tensor(std::move(v), std::move(s));
}

// A random body: a chain of elementwise ops over the float carry, the x slice, the scalar
// carry, a captured tensor and (sometimes) a random draw; the other carries follow from it.
struct BodySpec {
  std::vector<int> ops, operand;
  bool random = false;
  bool reverse = false;
  int64_t length = 0;

  explicit BodySpec(uint32_t seed) {
    std::mt19937 rng(seed);
    const int n = 2 + static_cast<int>(rng() % 5);
    for (int k = 0; k < n; ++k) {
      ops.push_back(static_cast<int>(rng() % 8));
      operand.push_back(static_cast<int>(rng() % 5));
    }
    random = rng() % 2 == 0;
    reverse = rng() % 2 == 0;
    const int64_t lengths[] = {0, 1, 2, 7, 33};
    length = lengths[rng() % 5];
  }
};

Tensor apply(int op, const Tensor& a, const Tensor& b) {
  switch (op) {
    case 0: return a + b;
    case 1: return a - b * 0.5;
    case 2: return a * b;
    case 3: return loom::tanh(a) + b;
    case 4: return loom::sin(a) * b;
    case 5: return loom::maximum(a, b);
    case 6: return loom::where(a > b, a, b * 0.25);
    default: return loom::exp(-(a * a)) + b;
  }
}

// carry {f: f32[3], s: f32[], d: f64[2], i: int32[2], b: bool[]}, x: f32[3] -> ys {v, i}.
std::pair<Dict, std::vector<Tensor>> random_body(const BodySpec& spec, const Tensor& w,
                                                 const Dict& c, const Tensor& x) {
  std::vector<Tensor> pool = {c.at("f"), x, c.at("s"), w, x};
  if (spec.random) pool[4] = loom::rand({3});
  Tensor v = c.at("f") + x * w;  // every input reaches the results (defined gradients)
  for (size_t k = 0; k < spec.ops.size(); ++k) v = apply(spec.ops[k], v, pool[spec.operand[k]]);
  Dict n;
  n["f"] = loom::tanh(v);
  n["s"] = c.at("s") * 0.5 + loom::sum(v) * 0.125;
  n["d"] = c.at("d") * 0.75 + loom::to(loom::sum(v), DType::Float64);
  const Tensor& i = c.at("i");
  n["i"] = loom::where(i > 4, i - 3, i + 2);
  n["b"] = loom::logical_not(c.at("b")) != (loom::sum(n["i"]) > 5);
  return {n, {v, n["i"]}};
}

Dict random_init() {
  Dict c;
  c["f"] = floats({0.25f, -0.5f, 1.0f}, {3});
  c["s"] = loom::tensor(0.5f);
  c["d"] = loom::tensor(std::vector<double>{1.0, -2.0}, {2});
  c["i"] = loom::tensor(std::vector<int32_t>{0, 3}, {2});
  c["b"] = loom::tensor(true);
  return c;
}

std::vector<Tensor> leaves(const Dict& c, const std::vector<Tensor>& ys) {
  std::vector<Tensor> out;
  for (const auto& [k, t] : c) out.push_back(t);
  out.insert(out.end(), ys.begin(), ys.end());
  return out;
}

TEST_F(NativeLoopsTest, RandomScanBodiesMatchTheGeneralPathAndTheReference) {
  for (uint32_t seed = 1; seed <= 24; ++seed) {
    const BodySpec spec(seed);
    SCOPED_TRACE("seed " + std::to_string(seed) + " length " + std::to_string(spec.length) +
                 (spec.reverse ? " reverse" : "") + (spec.random ? " random" : ""));
    expect_native_matches(seed, 1, [&] {
      Tensor w = floats({0.5f, -1.0f, 0.25f}, {3});
      Tensor xs = loom::randn({spec.length, 3});
      auto [c, ys] =
          loom::scan([&](const Dict& c, const Tensor& x) { return random_body(spec, w, c, x); },
                     random_init(), xs, loom::ScanOptions{.reverse = spec.reverse});
      return leaves(c, ys);
    });
  }
}

TEST_F(NativeLoopsTest, ScanGradientsTakeTheNativePathBothWays) {
  for (uint32_t seed = 101; seed <= 112; ++seed) {
    BodySpec spec(seed);
    if (spec.length == 0) spec.length = 5;
    SCOPED_TRACE("seed " + std::to_string(seed) + " length " + std::to_string(spec.length) +
                 (spec.reverse ? " reverse" : "") + (spec.random ? " random" : ""));
    // The forward scan and the reverse scan of its VJP.
    expect_native_matches(seed, 2, [&] {
      Tensor w = floats({0.5f, -1.0f, 0.25f}, {3}).requires_grad_();
      Tensor xs = loom::randn({spec.length, 3}).requires_grad_();
      Dict init = random_init();
      init["f"].requires_grad_();
      init["s"].requires_grad_();
      auto [c, ys] =
          loom::scan([&](const Dict& c, const Tensor& x) { return random_body(spec, w, c, x); },
                     init, xs, loom::ScanOptions{.reverse = spec.reverse});
      Tensor loss = loom::sum(c["f"]) + c["s"] + loom::sum(ys[0] * ys[0]) * 0.125 +
                    loom::to(loom::sum(c["d"]), DType::Float32);
      loss.backward();
      return std::vector<Tensor>{loss, init["f"].grad(), init["s"].grad(), w.grad(), xs.grad()};
    });
  }
}

TEST_F(NativeLoopsTest, CumulativeSumsOfEveryDtype) {
  for (DType dt : {DType::Float32, DType::Float64, DType::Int32, DType::Int64, DType::Bool}) {
    SCOPED_TRACE(std::string(loom::name(dt)));
    for (bool reverse : {false, true}) {
      expect_native_matches(7, 1, [&] {
        Tensor xs = loom::to(loom::randn({9, 2}) * 4.0, dt);
        Tensor init = loom::to(loom::ones({2}), dt);
        auto [c, ys] = loom::scan(
            [&](const Tensor& c, const Tensor& x) {
              Tensor n = dt == DType::Bool ? (c != x) : c + x;
              return std::pair{n, n};
            },
            init, xs, loom::ScanOptions{.reverse = reverse});
        return std::vector<Tensor>{c, ys};
      });
    }
  }
}

// while (i < n && s[0] < limit): s = s * 1.5 + w + noise; d += s[1]; flag flips. The trip
// count depends on the data (limit); limits below the start give zero trips.
TEST_F(NativeLoopsTest, WhileLoopsWithDataDependentTripCounts) {
  for (float limit : {-1.0f, 0.75f, 3.0f, 40.0f, 1e6f}) {
    for (bool random : {false, true}) {
      SCOPED_TRACE("limit " + std::to_string(limit) + (random ? " random" : ""));
      expect_native_matches(11, 1, [&] {
        Tensor w = floats({0.5f, 0.25f}, {2});
        Tensor lim = loom::tensor(limit);
        auto [i, s, d, flag] = loom::while_loop(
            [&](const Tensor& i, const Tensor& s, const Tensor&, const Tensor&) {
              return loom::logical_not(loom::maximum(i >= 50, loom::select(s, 0, 0) >= lim));
            },
            [&](const Tensor& i, const Tensor& s, const Tensor& d, const Tensor& f) {
              Tensor n = s * 1.5 + w;
              if (random) n = n + loom::rand({2}) * 0.125;
              return std::tuple{i + 1, n, d + loom::to(loom::select(n, 0, 1), DType::Float64),
                                loom::logical_not(f)};
            },
            std::tuple{loom::tensor(int64_t{0}), floats({0.0f, 1.0f}, {2}), loom::tensor(0.0),
                       loom::tensor(false)});
        return std::vector<Tensor>{i, s, d, flag};
      });
    }
  }
}

TEST_F(NativeLoopsTest, ForiLoopWithATensorBound) {
  for (int64_t n : {0, 1, 6}) {
    expect_native_matches(3, 1, [&] {
      auto [a, b] = loom::fori_loop(
          0, loom::tensor(n),
          [](const Tensor& i, const Tensor& a, const Tensor& b) {
            return std::tuple{a * 2 + i, b + loom::to(i, DType::Float32) * 0.5};
          },
          loom::tensor(int64_t{1}), floats({1.0f, 2.0f}, {2}));
      return std::vector<Tensor>{a, b};
    });
  }
}

// Regions that return a parameter (a copy kernel in their plan): a carry passed through, the x
// slice as a y, and a while condition that is a carried bool.
TEST_F(NativeLoopsTest, RegionsThatReturnTheirParameters) {
  expect_native_matches(13, 1, [] {
    auto [c, ys] = loom::scan(
        [](const std::vector<Tensor>& c, const Tensor& x) {
          return std::pair{std::vector<Tensor>{c[0], c[1] + x}, std::vector<Tensor>{x, c[0]}};
        },
        std::vector<Tensor>{loom::tensor(int64_t{4}), floats({1.0f, 2.0f}, {2})},
        loom::randn({6, 2}), loom::ScanOptions{.reverse = true});
    return std::vector<Tensor>{c[0], c[1], ys[0], ys[1]};
  });
  for (int64_t stop : {0, 1, 5}) {
    expect_native_matches(17, 1, [&] {
      auto [go, i] = loom::while_loop(
          [](const Tensor& go, const Tensor&) { return go; },
          [&](const Tensor&, const Tensor& i) { return std::tuple{i + 1 < stop, i + 1}; },
          std::tuple{loom::tensor(stop > 0), loom::tensor(int64_t{0})});
      return std::vector<Tensor>{go, i};
    });
  }
}

// Carries of at most 64 bytes live on the native function's stack (in registers once promoted),
// larger ones ping-pong between the result and scratch buffers: a loop with both kinds, each
// carry read after the other is written, at zero, odd and even trip counts, both directions.
TEST_F(NativeLoopsTest, CarriesOnBothSidesOfTheStackBound) {
  for (int64_t n : {0, 1, 2, 5}) {
    for (bool reverse : {false, true}) {
      SCOPED_TRACE("length " + std::to_string(n) + (reverse ? " reverse" : ""));
      expect_native_matches(19, 1, [&] {
        Tensor xs = loom::randn({n, 17});
        std::vector<Tensor> init = {loom::randn({16}), loom::randn({17}), loom::tensor(0.5f),
                                    loom::tensor(std::vector<double>(9, 1.0), {9})};
        auto [c, ys] = loom::scan(
            [](const std::vector<Tensor>& c, const Tensor& x) {
              Tensor big = loom::tanh(c[1] * 0.75 + x) + loom::sum(c[0]) * 0.125;
              Tensor small = c[0] * 0.5 + loom::sum(c[1]) * 0.0625;
              Tensor s = c[2] * 0.875 + loom::sum(x) * 0.25;
              Tensor d = c[3] * 0.5 + loom::to(s, DType::Float64);
              return std::pair{std::vector<Tensor>{small, big, s, d},
                               std::vector<Tensor>{s, small}};
            },
            init, xs, loom::ScanOptions{.reverse = reverse});
        return std::vector<Tensor>{c[0], c[1], c[2], c[3], ys[0], ys[1]};
      });
    }
  }
  for (int64_t stop : {0, 1, 4}) {
    SCOPED_TRACE("while, " + std::to_string(stop) + " trips");
    expect_native_matches(23, 1, [&] {
      auto [i, small, big] = loom::while_loop(
          [&](const Tensor& i, const Tensor&, const Tensor&) { return i < stop; },
          [](const Tensor& i, const Tensor& small, const Tensor& big) {
            return std::tuple{i + 1, small * 0.5 + loom::sum(big) * 0.03125,
                              loom::sin(big) + loom::sum(small) * 0.25};
          },
          std::tuple{loom::tensor(int64_t{0}), loom::randn({4}), loom::randn({32})});
      return std::vector<Tensor>{i, small, big};
    });
  }
}

// A general loop's regions compile beside their program's kernels (compile_steps): a kernel
// both need is compiled once, the other compile waiting for it. Here the top level's
// exp(w) * 0.6875 over [13,29] (a shape no other test uses) is also the scan body's kernel
// after its product (exp is no oneDNN post-op, so it stays a kernel).
TEST_F(NativeLoopsTest, AKernelSharedByAProgramAndItsLoopBodyCompilesOnce) {
  auto program = [] {
    std::vector<float> wv(13 * 29), mv(29 * 29), xv(5 * 13 * 29);
    for (size_t i = 0; i < wv.size(); ++i) wv[i] = static_cast<float>(i % 13) / 13.0f - 0.5f;
    for (size_t i = 0; i < mv.size(); ++i) mv[i] = static_cast<float>(i % 7) / 28.0f - 0.1f;
    for (size_t i = 0; i < xv.size(); ++i) xv[i] = static_cast<float>(i % 5) / 10.0f;
    Tensor w = floats(wv, {13, 29}), m = floats(mv, {29, 29});
    Tensor c0 = loom::exp(w) * 0.6875;
    auto [c, ys] = loom::scan(
        [&m](const Tensor& c, const Tensor& x) {
          Tensor s = loom::exp(loom::matmul(c, m)) * 0.6875;
          return std::pair{s, loom::sum(x)};
        },
        c0, floats(xv, {5, 13, 29}));
    return std::vector<Tensor>{c, ys};
  };
  loom::runtime::set_backend("ref");
  std::vector<Tensor> want = program();
  loom::sync();
  loom::runtime::set_backend("cpu");
  const loom::cpu::KernelCacheStats before = loom::cpu::kernel_cache_stats();
  const loom::cpu::LoopStats loops = loom::cpu::loop_stats();
  std::vector<Tensor> got = program();
  loom::sync();
  EXPECT_EQ(loom::cpu::loop_stats().general - loops.general, 1);  // the body has a product
  EXPECT_EQ(loom::cpu::kernel_cache_stats().raced, before.raced);
  EXPECT_GT(loom::cpu::kernel_cache_stats().compiled, before.compiled);
  for (size_t k = 0; k < got.size(); ++k) {
    std::vector<float> g = got[k].to_vector<float>(), w = want[k].to_vector<float>();
    ASSERT_EQ(g.size(), w.size());
    for (size_t i = 0; i < g.size(); ++i)
      ASSERT_NEAR(g[i], w[i], 1e-5 * (1 + std::abs(w[i]))) << "output " << k << " at " << i;
  }
}

// A scan's length is an argument of its native function: another length compiles nothing.
TEST_F(NativeLoopsTest, ScansOfAnyLengthShareOneFunction) {
  loom::runtime::set_backend("cpu");
  auto run = [](int64_t n) {
    loom::runtime::clear_compile_cache();
    auto [c, ys] = loom::scan(
        [](const Tensor& c, const Tensor& x) {
          Tensor s = c * 0.8125 + x;  // a constant no other test uses: a fresh kernel
          return std::pair{s, s};
        },
        loom::zeros({2}), floats(std::vector<float>(static_cast<size_t>(2 * n), 1.0f), {n, 2}));
    loom::sync();
    return c.to_vector<float>();
  };
  const loom::cpu::LoopStats before = loom::cpu::loop_stats();
  const int64_t compiled0 = loom::cpu::kernel_cache_stats().compiled;
  std::vector<float> three = run(3);
  const int64_t compiled1 = loom::cpu::kernel_cache_stats().compiled;
  std::vector<float> nine = run(9);
  EXPECT_EQ(loom::cpu::loop_stats().native - before.native, 2);
  EXPECT_GE(compiled1 - compiled0, 1);
  EXPECT_EQ(loom::cpu::kernel_cache_stats().compiled, compiled1);
  float want = 0;  // closed form of c <- 0.8125 c + 1
  for (int k = 0; k < 9; ++k) {
    want = want * 0.8125f + 1;
    if (k == 2) {
      EXPECT_FLOAT_EQ(three[0], want);
    }
  }
  EXPECT_FLOAT_EQ(nine[1], want);
}

// A loop nested in a body keeps the outer loop general; the inner one goes native and runs in
// the outer body's frame.
TEST_F(NativeLoopsTest, InnerLoopsGoNativeInsideGeneralOnes) {
  auto fn = [] {
    Tensor w = loom::randn({2}) * 0.5;
    auto [c, ys] = loom::scan(
        [&](const Tensor& c, const Tensor& x) {
          auto [inner] = loom::fori_loop(
              0, 3,
              [&](const Tensor& i, const Tensor& h) { return std::tuple{loom::tanh(h * w + x)}; },
              c);
          Tensor n = inner + loom::to(loom::sum(x), DType::Float32);
          return std::pair{n, n * 2.0};
        },
        loom::ones({2}), loom::randn({5, 2}), loom::ScanOptions{.reverse = true});
    return std::vector<Tensor>{c, ys};
  };
  const LoopRun ref = run_in(Mode::Ref, 21, fn);
  const LoopRun native = run_in(Mode::Native, 21, fn);
  EXPECT_EQ(native.loops.native, 1);
  EXPECT_EQ(native.loops.general, 1);
  expect_close(native, ref, 1e-4, "native vs ref");
}

// Products, nested loops and iterations past the bound keep the general path.
TEST_F(NativeLoopsTest, BigOrComplexBodiesStayGeneral) {
  auto general_only = [&](auto&& fn) {
    const LoopRun native = run_in(Mode::Native, 5, fn);
    const LoopRun ref = run_in(Mode::Ref, 5, fn);
    EXPECT_EQ(native.loops.native, 0);
    EXPECT_GE(native.loops.general, 1);
    expect_close(native, ref, 1e-4, "general vs ref");
  };
  general_only([] {
    Tensor m = loom::randn({3, 3}) * 0.25;
    auto [c, ys] = loom::scan(
        [&](const Tensor& c, const Tensor& x) {
          Tensor n = loom::matmul(m, c) + x;
          return std::pair{n, n};
        },
        loom::ones({3, 1}), loom::randn({4, 3, 1}));
    return std::vector<Tensor>{c, ys};
  });
  general_only([] {  // 2 x 32 KiB of carries
    auto [c, ys] = loom::scan(
        [](const Tensor& c, const Tensor& x) {
          Tensor n = c * 0.5 + x;
          return std::pair{n, loom::sum(n)};
        },
        loom::zeros({8192}), loom::randn({3, 8192}));
    return std::vector<Tensor>{c, ys};
  });
}

}  // namespace
