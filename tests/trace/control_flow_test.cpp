// scan, while_loop, fori_loop and assume_pure through the public API: values against closed
// forms computed here (or the same computation written without the tool), trace-once and
// compile-once counts, captured tensors, random numbers per iteration, nesting, and every
// bad input the tools reject, with the tree path in the message.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <sstream>

#include "expect_error.h"
#include "loom/loom.h"
#include "loom/runtime/engine.h"

namespace {

using loom::Tensor;
using Dict = std::map<std::string, Tensor>;

class ControlFlowTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    loom::sync();
    previous_ = std::string(loom::runtime::current_backend().name());
    loom::runtime::set_backend(GetParam());
    loom::runtime::clear_compile_cache();
    loom::reset_metrics();
  }
  void TearDown() override {
    loom::sync();
    loom::runtime::set_backend(previous_);
  }
  std::string previous_;
};

std::vector<float> fv(const Tensor& t) { return t.to_vector<float>(); }
std::vector<int64_t> iv(const Tensor& t) { return t.to_vector<int64_t>(); }
Tensor floats(std::vector<float> v, loom::Shape s) {
  return loom::tensor(std::move(v), std::move(s));
}

using loom::testing::expect_error;

// ---- scan ------------------------------------------------------------------------------

TEST_P(ControlFlowTest, SeedExample4CumulativeSum) {
  auto [final_sum, history] = loom::scan(
      [](const Tensor& acc, const Tensor& e) {
        Tensor a = acc + e;
        return std::pair{a, a};
      },
      floats({0}, {1}), floats({1, 2, 3, 4, 5}, {5}));
  EXPECT_EQ(fv(final_sum), std::vector<float>{15});
  EXPECT_EQ(history.shape(), (loom::Shape{5, 1}));
  EXPECT_EQ(fv(history), (std::vector<float>{1, 3, 6, 10, 15}));
  std::ostringstream os;
  os << history;
  EXPECT_EQ(os.str(), "tensor([[1.], [3.], [6.], [10.], [15.]])");
}

TEST_P(ControlFlowTest, SeedExample5DictCarry) {
  auto [carry, means] = loom::scan(
      [](const Dict& c, const Dict& x) {
        Tensor s = c.at("sum") + x.at("values"), n = c.at("count") + 1.0;
        return std::pair{Dict{{"sum", s}, {"count", n}}, s / n};
      },
      Dict{{"sum", loom::zeros({1})}, {"count", loom::zeros({1})}},
      Dict{{"values", loom::arange(1, 6)}});
  EXPECT_EQ(means.shape(), (loom::Shape{5, 1}));
  EXPECT_EQ(fv(means), (std::vector<float>{1, 1.5, 2, 2.5, 3}));
  EXPECT_EQ(fv(carry.at("sum")), std::vector<float>{15});
  EXPECT_EQ(fv(carry.at("count")), std::vector<float>{5});
}

TEST_P(ControlFlowTest, ReverseScanPairsYsWithTheirXs) {
  // Reverse cumulative sum: ys[t] = sum of xs[t..n-1].
  std::vector<float> xs = {3, -1, 4, 1, -5, 9};
  auto [total, ys] = loom::scan(
      [](const Tensor& c, const Tensor& x) {
        Tensor s = c + x;
        return std::pair{s, s};
      },
      loom::zeros({}), floats(xs, {6}), {.reverse = true});
  std::vector<float> want(6);
  float acc = 0;
  for (int t = 5; t >= 0; --t) want[t] = acc += xs[t];
  EXPECT_EQ(fv(ys), want);
  EXPECT_EQ(total.item<float>(), acc);
}

TEST_P(ControlFlowTest, ZeroLengthScanReturnsInitAndEmptyYs) {
  auto [c, ys] = loom::scan(
      [](const Tensor& c, const Tensor& x) {
        Tensor s = c + loom::sum(x);
        return std::pair{s, std::tuple{x * 2, loom::to(s, loom::int64)}};
      },
      floats({7}, {1}), loom::zeros({0, 3}));
  EXPECT_EQ(fv(c), std::vector<float>{7});
  EXPECT_EQ(std::get<0>(ys).shape(), (loom::Shape{0, 3}));
  EXPECT_EQ(std::get<1>(ys).shape(), (loom::Shape{0, 1}));
  EXPECT_EQ(std::get<1>(ys).dtype(), loom::int64);
}

TEST_P(ControlFlowTest, LengthWithoutXsAndNoYs) {
  // x is the empty tuple; y is the empty tuple (no ys).
  auto [c, ys] =
      loom::scan([](const Tensor& c, std::tuple<>) { return std::pair{c * 2.0, std::tuple<>{}}; },
                 floats({1.5}, {}), std::tuple<>{}, {.length = 10});
  static_assert(std::is_same_v<decltype(ys), std::tuple<>>);
  EXPECT_EQ(c.item<float>(), 1.5f * 1024);
}

TEST_P(ControlFlowTest, YsKeepTheirOwnDTypes) {
  auto [c, ys] = loom::scan(
      [](const Tensor& n, const Tensor& x) {
        Tensor next = n + 1;
        return std::pair{next, std::tuple{next, x > 0.0, x * 0.5}};
      },
      loom::tensor(int64_t{0}), floats({-1, 2, 0, 3}, {4}));
  auto [count, positive, half] = ys;
  EXPECT_EQ(count.dtype(), loom::int64);
  EXPECT_EQ(iv(count), (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(positive.dtype(), loom::bool_);
  EXPECT_EQ(positive.to_vector<bool>(), (std::vector<bool>{false, true, false, true}));
  EXPECT_EQ(fv(half), (std::vector<float>{-0.5, 1, 0, 1.5}));
  EXPECT_EQ(c.item<int64_t>(), 4);
}

TEST_P(ControlFlowTest, VectorTupleAndTreeCarriesAndXs) {
  // A linear recurrence h = h @ W + x with a vector carry of two states.
  Tensor w = floats({0.5, -1, 2, 0.25}, {2, 2});
  Tensor xs = floats({1, 2, 3, 4, 5, 6}, {3, 2});
  std::vector<Tensor> init = {floats({1, 0}, {2}), floats({0, 1}, {2})};
  auto [hs, ys] = loom::scan(
      [&](const std::vector<Tensor>& h, const std::pair<Tensor, Tensor>& x) {
        Tensor a = loom::squeeze(loom::matmul(loom::unsqueeze(h[0], 0), w), 0) + x.first;
        Tensor b = h[1] * x.second;
        return std::pair{std::vector<Tensor>{a, b}, loom::Tree(loom::Tree::Dict{{"a", a}})};
      },
      init, std::pair{xs, xs * 2.0});
  // Closed form, written out.
  std::vector<double> h0 = {1, 0}, h1 = {0, 1};
  const double W[2][2] = {{0.5, -1}, {2, 0.25}};
  const double X[3][2] = {{1, 2}, {3, 4}, {5, 6}};
  std::vector<float> ya;
  for (int t = 0; t < 3; ++t) {
    std::vector<double> n0 = {h0[0] * W[0][0] + h0[1] * W[1][0] + X[t][0],
                              h0[0] * W[0][1] + h0[1] * W[1][1] + X[t][1]};
    h0 = n0;
    h1 = {h1[0] * 2 * X[t][0], h1[1] * 2 * X[t][1]};
    ya.push_back(static_cast<float>(h0[0]));
    ya.push_back(static_cast<float>(h0[1]));
  }
  auto near = [](const std::vector<float>& got, const std::vector<double>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_NEAR(got[i], want[i], 1e-4 * (1 + std::abs(want[i])));
  };
  near(fv(hs[0]), h0);
  near(fv(hs[1]), h1);
  near(fv(ys.dict().at("a").leaf()), std::vector<double>(ya.begin(), ya.end()));
}

TEST_P(ControlFlowTest, ScanCompilesOnceAndDoesNotGrowWithLength) {
  auto run = [](int64_t n, float scale) {
    auto [c, ys] = loom::scan(
        [](const Tensor& c, const Tensor& x) {
          Tensor s = loom::tanh(c * 0.5 + x);
          return std::pair{s, s};
        },
        loom::zeros({4}), loom::ones({n, 4}) * scale);
    return std::pair{c, ys};
  };
  auto [c1, y1] = run(10, 1);
  std::string ir10 = loom::pending_ir({c1, y1});
  loom::sync();
  auto [c2, y2] = run(10000, 1);
  std::string ir10000 = loom::pending_ir({c2, y2});
  loom::sync();
  // The graph is the same size whatever the length: the body appears once.
  EXPECT_EQ(std::count(ir10.begin(), ir10.end(), '\n'),
            std::count(ir10000.begin(), ir10000.end(), '\n'));
  loom::reset_metrics();
  for (float s : {0.5f, 2.0f, 3.0f}) {
    auto [c, ys] = run(10, s);
    loom::sync();
    // The closed form, step by step in float.
    float h = 0;
    for (int t = 0; t < 10; ++t) h = std::tanh(h * 0.5f + s);
    EXPECT_NEAR(fv(c)[3], h, 1e-5);
  }
  EXPECT_EQ(loom::metrics().compiles, 0);  // traced again each call, compiled once
  EXPECT_EQ(loom::metrics().bodies_traced, 3);
}

TEST_P(ControlFlowTest, CapturedTensorsAreLiveInputs) {
  Tensor w = floats({2}, {1});
  auto run = [&] {
    auto [c, ys] = loom::scan(
        [&](const Tensor& c, const Tensor& x) { return std::pair{c + x * w, std::tuple<>{}}; },
        loom::zeros({1}), loom::ones({3, 1}));
    return c;
  };
  EXPECT_EQ(fv(run()), std::vector<float>{6});
  w.copy_(floats({5}, {1}));  // an in-place update of the captured tensor
  EXPECT_EQ(fv(run()), std::vector<float>{15});
  Tensor pending = w * 10.0;  // a pending outside tensor
  Tensor r = loom::scan([&](const Tensor& c, const Tensor& x) { return std::pair{c + pending, x}; },
                        loom::zeros({1}), loom::ones({2, 1}))
                 .first;
  EXPECT_EQ(fv(r), std::vector<float>{100});
}

TEST_P(ControlFlowTest, HostScalarsInBodiesAreInputsNotConstants) {
  auto run = [](double lr) {
    return loom::scan([&](const Tensor& c, const Tensor& x) { return std::pair{c - x * lr, x}; },
                      loom::zeros({}), loom::ones({4}))
        .first;
  };
  EXPECT_FLOAT_EQ(run(0.5).item<float>(), -2);
  loom::reset_metrics();
  EXPECT_FLOAT_EQ(run(0.25).item<float>(), -1);
  EXPECT_EQ(loom::metrics().compiles, 0);
}

TEST_P(ControlFlowTest, RandomOpsDrawFreshNumbersEveryIterationAndCall) {
  loom::manual_seed(7);
  auto draw = [] {
    return loom::scan([](const Tensor& c, std::tuple<>) { return std::pair{c, loom::rand({3})}; },
                      loom::zeros({}), std::tuple<>{}, {.length = 4})
        .second;
  };
  std::vector<float> a = fv(draw()), b = fv(draw());
  ASSERT_EQ(a.size(), 12u);
  for (size_t i = 0; i < 12; ++i) {
    EXPECT_GE(a[i], 0);
    EXPECT_LT(a[i], 1);
    for (size_t j = 0; j < i; ++j) EXPECT_NE(a[i], a[j]) << i << " " << j;
    EXPECT_NE(a[i], b[i]);
  }
  loom::manual_seed(7);
  EXPECT_EQ(fv(draw()), a);  // reproducible from the seed
}

TEST_P(ControlFlowTest, NestedScan) {
  // Row-wise cumulative sums of a matrix, then their running total across rows.
  Tensor m = floats({1, 2, 3, 4, 5, 6}, {2, 3});
  auto [total, rows] = loom::scan(
      [](const Tensor& acc, const Tensor& row) {
        auto [s, cums] = loom::scan(
            [](const Tensor& c, const Tensor& v) {
              Tensor n = c + v;
              return std::pair{n, n};
            },
            loom::zeros({}), row);
        return std::pair{acc + s, cums};
      },
      loom::zeros({}), m);
  EXPECT_EQ(fv(rows), (std::vector<float>{1, 3, 6, 4, 9, 15}));
  EXPECT_EQ(total.item<float>(), 21);
}

TEST_P(ControlFlowTest, CarryStructureTypeAndShapeErrorsNameTheLeaf) {
  expect_error<loom::DTypeError>(
      [] {
        loom::scan(
            [](const Dict& c, const Tensor& x) {
              return std::pair{
                  Dict{{"sum", loom::to(c.at("sum") + x, loom::float64)}, {"n", c.at("n")}}, x};
            },
            Dict{{"sum", loom::zeros({1})}, {"n", loom::zeros({1})}}, loom::ones({3, 1}));
      },
      {"[scan]", "carry['sum']", "f32[1]", "f64[1]", "dtype"});
  expect_error<loom::ShapeError>(
      [] {
        loom::scan(
            [](const std::vector<Tensor>& c, const Tensor& x) {
              return std::pair{std::vector<Tensor>{c[0], loom::unsqueeze(c[1], 0)}, x};
            },
            std::vector<Tensor>{loom::zeros({1}), loom::zeros({2})}, loom::ones({3}));
      },
      {"[scan]", "carry[1]", "f32[2]", "f32[1,2]", "shape"});
  // A changed carry structure (a TraceError) is in tests/trace/footguns_test.cpp.
}

TEST_P(ControlFlowTest, XsErrorsNameTheLeaves) {
  expect_error<loom::ShapeError>(
      [] {
        loom::scan([](const Tensor& c, const Dict& x) { return std::pair{c, x.at("a")}; },
                   loom::zeros({}), Dict{{"a", loom::ones({5})}, {"b", loom::ones({4, 2})}});
      },
      {"[scan]", "xs['a']", "5", "xs['b']", "4", "leading dim"});
  expect_error<loom::ShapeError>(
      [] {
        loom::scan([](const Tensor& c, const Tensor& x) { return std::pair{c, x}; },
                   loom::zeros({}), loom::ones({}));
      },
      {"[scan]", "xs", "f32[]", "leading dim"});
  expect_error<loom::ShapeError>(
      [] {
        loom::scan([](const Tensor& c, std::tuple<>) { return std::pair{c, c}; }, loom::zeros({}),
                   std::tuple<>{});
      },
      {"[scan]", "length"});
  expect_error<loom::ShapeError>(
      [] {
        loom::scan([](const Tensor& c, const Tensor& x) { return std::pair{c, x}; },
                   loom::zeros({}), loom::ones({5}), {.length = 3});
      },
      {"[scan]", "length = 3", "5"});
}

// ---- while_loop and fori_loop ------------------------------------------------------------

TEST_P(ControlFlowTest, SeedExample6WhileLoop) {
  auto [i, res] =
      loom::while_loop([](const Tensor& i, const Tensor&) { return i > 0; },
                       [](const Tensor& i, const Tensor& x) { return std::tuple{i - 1, x + 1}; },
                       std::tuple{loom::tensor(int64_t{10}), loom::tensor(int64_t{3})});
  EXPECT_EQ(res.item<int64_t>(), 13);
  EXPECT_EQ(i.item<int64_t>(), 0);
}

TEST_P(ControlFlowTest, WhileBodiesMayCaptureOutsideTensors) {
  // Newton's iteration for sqrt(a) with a and the tolerance captured from outside.
  Tensor a = loom::tensor(2.0), tol = loom::tensor(1e-12);
  auto [x, steps] = loom::while_loop(
      [&](const Tensor& x, const Tensor&) { return loom::abs(x * x - a) > tol; },
      [&](const Tensor& x, const Tensor& n) { return std::tuple{(x + a / x) * 0.5, n + 1}; },
      std::tuple{loom::tensor(1.0), loom::tensor(int64_t{0})});
  EXPECT_NEAR(x.item<double>(), std::sqrt(2.0), 1e-12);
  // The same iteration on the host.
  double h = 1;
  int64_t n = 0;
  while (std::abs(h * h - 2) > 1e-12) h = (h + 2 / h) * 0.5, ++n;
  EXPECT_EQ(steps.item<int64_t>(), n);
  // Zero trips return the carried values unchanged.
  auto [y] =
      loom::while_loop([&](const Tensor& y) { return y > a; },
                       [](const Tensor& y) { return y * 2.0; }, std::tuple{loom::tensor(1.0)});
  EXPECT_EQ(y.item<double>(), 1.0);
}

TEST_P(ControlFlowTest, WhileWithRandomBodyAndTreeState) {
  loom::manual_seed(3);
  // Draw until the running sum of uniforms exceeds 3; each draw must differ.
  auto [state, n] =
      loom::while_loop([](const Dict& s, const Tensor&) { return s.at("sum") < 3.0; },
                       [](const Dict& s, const Tensor& n) {
                         Tensor u = loom::rand({});
                         return std::tuple{Dict{{"sum", s.at("sum") + u}, {"last", u}}, n + 1};
                       },
                       std::tuple{Dict{{"sum", loom::zeros({})}, {"last", loom::zeros({})}},
                                  loom::tensor(int64_t{0})});
  float sum = state.at("sum").item<float>();
  int64_t draws = n.item<int64_t>();
  EXPECT_GE(sum, 3);
  EXPECT_GE(draws, 4);         // each draw is below 1
  EXPECT_LE(draws, 3 / 0.01);  // draws are not all tiny (fresh numbers each iteration)
}

TEST_P(ControlFlowTest, WhileErrors) {
  expect_error<loom::DTypeError>(
      [] {
        loom::while_loop([](const Tensor& i) { return i; }, [](const Tensor& i) { return i - 1; },
                         std::tuple{loom::tensor(1.0f)});
      },
      {"[while_loop]", "cond", "bool scalar", "f32[]"});
  expect_error<loom::DTypeError>(
      [] {
        loom::while_loop([](const Tensor& i) { return loom::unsqueeze(i > 0, 0); },
                         [](const Tensor& i) { return i - 1; }, std::tuple{loom::tensor(1.0f)});
      },
      {"[while_loop]", "bool scalar", "bool[1]"});
  expect_error<loom::DTypeError>(
      [] {
        loom::while_loop(
            [](const Tensor& i, const Tensor&) { return i > 0; },
            [](const Tensor& i, const Tensor& x) { return std::tuple{i - 1, x * 0.5}; },
            std::tuple{loom::tensor(int64_t{3}), loom::tensor(int64_t{8})});
      },
      {"[while_loop]", "carried[1]", "i64[]", "f32[]"});
}

TEST_P(ControlFlowTest, ForiLoopStaticAndDynamicBounds) {
  auto sum_range = [](loom::LoopBound lo, loom::LoopBound hi) {
    auto [s] = loom::fori_loop(
        lo, hi, [](const Tensor& i, const Tensor& s) { return s + i; }, loom::tensor(int64_t{100}));
    return s.item<int64_t>();
  };
  auto closed = [](int64_t lo, int64_t hi) {
    int64_t s = 100;
    for (int64_t i = lo; i < hi; ++i) s += i;
    return s;
  };
  for (auto [lo, hi] :
       std::vector<std::pair<int64_t, int64_t>>{{0, 10}, {-5, 3}, {-7, -2}, {4, 4}, {6, 2}}) {
    EXPECT_EQ(sum_range(lo, hi), closed(lo, hi)) << lo << " " << hi;
    EXPECT_EQ(sum_range(loom::tensor(lo), loom::tensor(hi)), closed(lo, hi)) << lo << " " << hi;
    EXPECT_EQ(sum_range(lo, loom::tensor(static_cast<int32_t>(hi))), closed(lo, hi));
  }
  // Several carried values of different types.
  auto [f, k] = loom::fori_loop(
      1, 6,
      [](const Tensor& i, const Tensor& f, const Tensor& k) {
        return std::tuple{f * loom::to(i, loom::float64), k + 2};
      },
      loom::tensor(1.0), loom::tensor(int32_t{0}));
  EXPECT_EQ(f.item<double>(), 120.0);
  EXPECT_EQ(k.item<int32_t>(), 10);
}

TEST_P(ControlFlowTest, ForiBoundsMustBeIntegers) {
  auto body = [](const Tensor& i, const Tensor& s) { return s + 1; };
  expect_error<loom::DTypeError>([&] { loom::fori_loop(0, 2.5, body, loom::zeros({})); },
                                 {"[fori_loop]", "upper", "integer", "2.5"});
  expect_error<loom::DTypeError>(
      [&] { loom::fori_loop(loom::tensor(1.0f), 3, body, loom::zeros({})); },
      {"[fori_loop]", "lower", "integer scalar", "f32[]"});
  expect_error<loom::DTypeError>(
      [&] {
        loom::fori_loop(0, loom::tensor(std::vector<int64_t>{1, 2}, {2}), body, loom::zeros({}));
      },
      {"[fori_loop]", "upper", "i64[2]"});
}

// ---- assume_pure -----------------------------------------------------------------------

TEST_P(ControlFlowTest, SeedExample1AssumePureTracesOnce) {
  auto do_math = loom::assume_pure(
      [](const Tensor& a, const Tensor& b, double c) { return loom::matmul(a, b) + c; });
  loom::manual_seed(1);
  Tensor a, b, result;
  for (int i = 0; i < 100; ++i) {
    a = loom::randn({4, 4});
    b = loom::randn({4, 4});
    result = do_math(a, b, 42.0);
  }
  Tensor direct = loom::matmul(a, b) + 42.0;
  loom::sync();
  // A capture-less lambda's cache is per lambda type, so the second backend's run finds the
  // first one's trace: one trace in all, every other call a hit.
  const int64_t traced = loom::metrics().bodies_traced;
  EXPECT_LE(traced, 1);
  EXPECT_EQ(loom::metrics().pure_hits, 100 - traced);
  std::vector<float> r = fv(result), d = fv(direct);
  for (size_t i = 0; i < r.size(); ++i) EXPECT_NEAR(r[i], d[i], 1e-5);
}

TEST_P(ControlFlowTest, AssumePureKeyCoversShapesDTypesGradsStructureAndStatics) {
  int traces = 0;
  auto f =
      loom::assume_pure([&](const std::vector<Tensor>& xs, int64_t k, const std::string& mode) {
        ++traces;
        Tensor s = xs[0] * static_cast<double>(k);
        for (size_t i = 1; i < xs.size(); ++i) s = s + xs[i];
        return mode == "neg" ? -s : s;
      });
  auto v = [](Tensor t) { return t.to_vector<double>(); };
  EXPECT_EQ(v(f(std::vector<Tensor>{loom::ones({2})}, 3, "pos")), (std::vector<double>{3, 3}));
  EXPECT_EQ(v(f(std::vector<Tensor>{loom::full({2}, 2)}, 3, "pos")), (std::vector<double>{6, 6}));
  EXPECT_EQ(traces, 1);
  EXPECT_EQ(v(f(std::vector<Tensor>{loom::ones({2})}, 4, "pos")), (std::vector<double>{4, 4}));
  EXPECT_EQ(v(f(std::vector<Tensor>{loom::ones({2})}, 4, "neg")), (std::vector<double>{-4, -4}));
  EXPECT_EQ(traces, 3);  // static values
  EXPECT_EQ(v(f(std::vector<Tensor>{loom::ones({3})}, 4, "neg")),
            (std::vector<double>{-4, -4, -4}));
  EXPECT_EQ(v(f(std::vector<Tensor>{loom::ones({3}, loom::float64)}, 4, "neg")),
            (std::vector<double>{-4, -4, -4}));
  EXPECT_EQ(traces, 5);  // shape, dtype
  EXPECT_EQ(v(f(std::vector<Tensor>{loom::ones({2}), loom::ones({2})}, 4, "neg")),
            (std::vector<double>{-5, -5}));
  EXPECT_EQ(traces, 6);  // structure
  Tensor g = loom::ones({2});
  g.requires_grad_();
  f(std::vector<Tensor>{g}, 4, "neg");
  EXPECT_EQ(traces, 7);  // requires_grad
  f(std::vector<Tensor>{loom::zeros({2})}, 4, "neg");
  EXPECT_EQ(traces, 7);
}

TEST_P(ControlFlowTest, AssumePureReturnsTreesAndReadsCapturedTensorsLive) {
  Tensor w = floats({2, 3}, {2});
  auto f = loom::assume_pure([&](const Dict& in) {
    return std::pair{in.at("x") * w, Dict{{"sum", loom::sum(in.at("x"))}}};
  });
  auto [y, d] = f(Dict{{"x", floats({1, 1}, {2})}});
  EXPECT_EQ(fv(y), (std::vector<float>{2, 3}));
  EXPECT_EQ(d.at("sum").item<float>(), 2);
  w.copy_(floats({-1, 5}, {2}));  // seen by the next hit
  auto [y2, d2] = f(Dict{{"x", floats({2, 2}, {2})}});
  EXPECT_EQ(fv(y2), (std::vector<float>{-2, 10}));
  EXPECT_EQ(loom::metrics().pure_hits, 1);
}

TEST_P(ControlFlowTest, AssumePureRandomOpsDrawFreshNumbersOnHits) {
  auto noise = loom::assume_pure([](const Tensor& x) { return x + loom::rand(x.shape()); });
  std::vector<float> a = fv(noise(loom::zeros({4}))), b = fv(noise(loom::zeros({4})));
  EXPECT_EQ(loom::metrics().pure_hits, 2 - loom::metrics().bodies_traced);  // cache per type
  for (size_t i = 0; i < 4; ++i) EXPECT_NE(a[i], b[i]);
}

TEST_P(ControlFlowTest, ScanInsideAssumePureAndCapturelessLambdasShareACache) {
  for (int i = 0; i < 3; ++i) {
    Tensor xs = loom::arange(0, 4) + static_cast<double>(i);
    // Written inline: a capture-less lambda's cache is per lambda type.
    Tensor total = loom::assume_pure([](const Tensor& xs) {
      return loom::scan(
                 [](const Tensor& c, const Tensor& x) { return std::pair{c + x, std::tuple<>{}}; },
                 loom::zeros({}), xs)
          .first;
    })(xs);
    EXPECT_EQ(total.item<float>(), 6 + 4 * i);
  }
  // Traced at most once (the function and the scan in it), however often it is written.
  const int64_t traced = loom::metrics().bodies_traced;
  EXPECT_TRUE(traced == 0 || traced == 2) << traced;
  EXPECT_EQ(loom::metrics().pure_hits, traced ? 2 : 3);
}

TEST_P(ControlFlowTest, AssumePureInsideScanBodies) {
  Tensor scale = floats({3}, {});
  auto f = loom::assume_pure([&](const Tensor& c, const Tensor& x) { return c * scale + x; });
  auto run = [&](const Tensor& xs) {
    return loom::scan(
        [&](const Tensor& c, const Tensor& x) {
          Tensor n = f(c, x);
          return std::pair{n, n};
        },
        loom::zeros({}), xs);
  };
  auto [c, ys] = run(floats({1, 2, 3}, {3}));
  EXPECT_EQ(fv(ys), (std::vector<float>{1, 5, 18}));
  auto [c2, ys2] = run(floats({1, 1}, {2}));  // a hit inside the second scan's body
  EXPECT_EQ(fv(ys2), (std::vector<float>{1, 4}));
  EXPECT_EQ(c2.item<float>(), 4);
}

INSTANTIATE_TEST_SUITE_P(Backends, ControlFlowTest, ::testing::Values("cpu", "ref"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
