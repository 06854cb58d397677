// torch's conveniences (loom/trace/torch_ops.h) against closed forms written as plain loops,
// on the reference interpreter and on the CPU backend; gelu's tanh form's gradient against
// central finite differences in float64; the in-place leaf rule and the grad-mode guard.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>

#include "expect_error.h"
#include "loom/loom.h"
#include "loom/runtime/engine.h"

namespace {

using loom::Shape;
using loom::Tensor;

// `stmt` throws an E whose message contains `part`.
#define LOOM_EXPECT_ERROR(stmt, E, part) \
  loom::testing::expect_error<E>([&] { (void)(stmt); }, {part})

class TorchOpsTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    loom::sync();
    previous_ = std::string(loom::runtime::current_backend().name());
    loom::runtime::set_backend(GetParam());
  }
  void TearDown() override {
    loom::sync();
    loom::runtime::set_backend(previous_);
  }
  std::string previous_;
};

std::vector<double> normal(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> d;
  std::vector<double> v(n);
  for (double& x : v) x = d(gen);
  return v;
}

TEST_P(TorchOpsTest, TrilTriuKeepTheTriangles) {
  const int64_t b = 2, m = 3, n = 5;
  std::vector<double> v = normal(b * m * n, 1);
  Tensor x = loom::tensor(v, {b, m, n});
  for (int64_t diag : {-2, -1, 0, 1, 3, 7}) {
    std::vector<double> lo = loom::tril(x, diag).to_vector<double>();
    std::vector<double> up = loom::triu(x, diag).to_vector<double>();
    for (int64_t k = 0; k < b * m * n; ++k) {
      int64_t i = k / n % m, j = k % n;
      EXPECT_EQ(lo[k], j - i <= diag ? v[k] : 0.0) << diag << " " << k;
      EXPECT_EQ(up[k], j - i >= diag ? v[k] : 0.0) << diag << " " << k;
    }
  }
  LOOM_EXPECT_ERROR(loom::tril(loom::ones({3})), loom::ShapeError, "2 or more dims");
}

TEST_P(TorchOpsTest, MaskedFillBroadcastsTheMask) {
  std::vector<float> v = {1, 2, 3, 4, 5, 6};
  Tensor x = loom::tensor(v, {2, 3});
  Tensor mask = loom::tensor(std::vector<float>{1, 0, 1}, {3}) > 0.5;
  std::vector<float> got =
      loom::masked_fill(x, mask, -std::numeric_limits<double>::infinity()).to_vector<float>();
  for (int k = 0; k < 6; ++k)
    EXPECT_EQ(got[k], k % 3 == 1 ? v[k] : -std::numeric_limits<float>::infinity());
  Tensor ints = loom::arange(0, 4, loom::int64);
  std::vector<int64_t> gi =
      loom::masked_fill(ints, ints >= 2, loom::tensor(int64_t{9})).to_vector<int64_t>();
  EXPECT_EQ(gi, (std::vector<int64_t>{0, 1, 9, 9}));
  LOOM_EXPECT_ERROR(loom::masked_fill(x, x, 1.0), loom::DTypeError, "boolean masks");
}

TEST_P(TorchOpsTest, SplitAndChunkCutAlongADim) {
  Tensor x = loom::reshape(loom::arange(0, 10, loom::float32), {2, 5});
  std::vector<Tensor> parts = loom::split(x, 2, 1);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[2].shape(), Shape({2, 1}));
  EXPECT_EQ(parts[1].to_vector<float>(), (std::vector<float>{2, 3, 7, 8}));
  parts = loom::split(x, std::vector<int64_t>{1, 4}, -1);
  EXPECT_EQ(parts[1].to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 6, 7, 8, 9}));
  // chunk: ceil(5 / 3) = 2 per piece, so 3 pieces; ceil(5 / 4) = 2 also gives 3
  EXPECT_EQ(loom::chunk(x, 3, 1).size(), 3u);
  EXPECT_EQ(loom::chunk(x, 4, 1).size(), 3u);
  EXPECT_EQ(loom::chunk(x, 2, 0)[1].to_vector<float>(), (std::vector<float>{5, 6, 7, 8, 9}));
  LOOM_EXPECT_ERROR(loom::split(x, std::vector<int64_t>{2, 2}, 1), loom::ShapeError,
                    "sum exactly to 5");
  LOOM_EXPECT_ERROR(loom::chunk(x, 0, 1), loom::ShapeError, "greater than 0");
}

TEST_P(TorchOpsTest, CumsumEqualsTheRunningSum) {
  for (int64_t n : {1, 5, 128, 129, 700}) {
    std::vector<double> v = normal(3 * n, 2);
    std::vector<double> got = loom::cumsum(loom::tensor(v, {3, n}), 1).to_vector<double>();
    for (int64_t r = 0; r < 3; ++r) {
      double s = 0, scale = 1;
      for (int64_t i = 0; i < n; ++i) {
        s += v[r * n + i];
        scale += std::abs(v[r * n + i]);
        EXPECT_NEAR(got[r * n + i], s, 1e-13 * scale) << n << " " << r << " " << i;
      }
    }
  }
  // along dim 0, and integers exactly (bool and int32 give int64, as torch)
  std::vector<int32_t> iv = {1, -2, 3, 4, 5, -6};
  Tensor ci = loom::cumsum(loom::tensor(iv, {3, 2}), 0);
  EXPECT_EQ(ci.dtype(), loom::int64);
  EXPECT_EQ(ci.to_vector<int64_t>(), (std::vector<int64_t>{1, -2, 4, 2, 9, -4}));
  Tensor cb = loom::cumsum(loom::arange(0, 300, loom::int64) >= 100, 0);
  std::vector<int64_t> b = cb.to_vector<int64_t>();
  EXPECT_EQ(cb.dtype(), loom::int64);
  EXPECT_EQ(b[99], 0);
  EXPECT_EQ(b[299], 200);
}

TEST_P(TorchOpsTest, TopkPicksInOrderNanFirstTiesByIndex) {
  const double nan = std::nan(""), inf = std::numeric_limits<double>::infinity();
  std::vector<double> v = {1, nan, 3, 3, -inf, 0.5};
  auto [vals, idx] = loom::topk(loom::tensor(v, {1, 6}), 6);
  EXPECT_EQ(idx.dtype(), loom::int64);
  EXPECT_EQ(idx.to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 3, 0, 5, 4}));
  auto [svals, sidx] = loom::topk(loom::tensor(v, {1, 6}), 6, -1, false);
  EXPECT_EQ(sidx.to_vector<int64_t>(), (std::vector<int64_t>{4, 5, 0, 2, 3, 1}));
  EXPECT_EQ(svals.to_vector<double>()[0], -inf);
  // rows of distinct values against a sort, along dim 0 too
  std::vector<double> w = normal(4 * 7, 3);
  Tensor x = loom::tensor(w, {4, 7});
  auto [tv, ti] = loom::topk(x, 3, 0);
  std::vector<int64_t> got = ti.to_vector<int64_t>();
  for (int64_t c = 0; c < 7; ++c) {
    std::vector<int64_t> rows = {0, 1, 2, 3};
    std::stable_sort(rows.begin(), rows.end(),
                     [&](int64_t a, int64_t b) { return w[a * 7 + c] > w[b * 7 + c]; });
    for (int64_t k = 0; k < 3; ++k) EXPECT_EQ(got[k * 7 + c], rows[k]) << c << " " << k;
  }
  // integers at their extremes
  std::vector<int64_t> iv = {5, std::numeric_limits<int64_t>::min(), 7,
                             std::numeric_limits<int64_t>::max()};
  auto [iv2, ii] = loom::topk(loom::tensor(iv, {4}), 4, 0, false);
  EXPECT_EQ(ii.to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 2, 3}));
  LOOM_EXPECT_ERROR(loom::topk(x, 8), loom::ShapeError, "out of range");
}

TEST_P(TorchOpsTest, MultinomialDrawsFromTheWeights) {
  loom::manual_seed(3);
  const int64_t n = 20000;
  std::vector<float> p = {0.2f, 0.0f, 0.5f, 0.3f};
  Tensor probs = loom::expand(loom::tensor(p, {1, 4}), {n, 4});
  std::vector<int64_t> s = loom::multinomial(probs * 7.0, 1).to_vector<int64_t>();
  ASSERT_EQ(s.size(), static_cast<size_t>(n));
  std::vector<double> freq(4, 0);
  for (int64_t k : s) freq[k] += 1.0 / n;
  EXPECT_EQ(freq[1], 0.0);  // a zero weight is never drawn
  for (int k = 0; k < 4; ++k) EXPECT_NEAR(freq[k], p[k], 5 * std::sqrt(p[k] * (1 - p[k]) / n));
  // without replacement: distinct categories per row
  std::vector<int64_t> w = loom::multinomial(probs, 3).to_vector<int64_t>();
  for (int64_t r = 0; r < 100; ++r) {
    EXPECT_NE(w[r * 3], w[r * 3 + 1]);
    EXPECT_NE(w[r * 3], w[r * 3 + 2]);
    EXPECT_NE(w[r * 3 + 1], w[r * 3 + 2]);
  }
  LOOM_EXPECT_ERROR(loom::multinomial(probs, 5), loom::ShapeError, "without replacement");
}

TEST_P(TorchOpsTest, GeluTanhMatchesItsFormulaAndFiniteDifferences) {
  std::vector<double> v = {-4, -1.5, -0.3, 0, 0.2, 1, 2.5, 6};
  auto f = [](double x) {
    return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
  };
  Tensor x = loom::tensor(v, {8});
  std::vector<double> y = loom::gelu(x, "tanh").to_vector<double>();
  for (size_t k = 0; k < v.size(); ++k) EXPECT_NEAR(y[k], f(v[k]), 1e-15);
  auto g = loom::grad([](const Tensor& t) { return loom::sum(loom::gelu(t, "tanh")); });
  std::vector<double> dy = g(x).to_vector<double>();
  for (size_t k = 0; k < v.size(); ++k) {
    const double h = 1e-6;
    EXPECT_NEAR(dy[k], (f(v[k] + h) - f(v[k] - h)) / (2 * h), 1e-8);
  }
  LOOM_EXPECT_ERROR(loom::gelu(x, "fast"), loom::Error, "approximate");
}

// gelu_backward against central differences of gelu's closed forms in float64, and the graph
// of gelu(x) and gelu_backward(g, x) computing the erf (tanh) once.
TEST_P(TorchOpsTest, GeluBackwardMatchesFiniteDifferencesAndSharesTheForward) {
  std::vector<double> v = {-4, -1.5, -0.3, 0, 0.2, 1, 2.5, 6}, gv = {1, -2, 0.5, 3, 1, -1, 2, 0.25};
  auto exact = [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); };
  auto tanh_form = [](double x) {
    return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
  };
  Tensor x = loom::tensor(v, {8}), g = loom::tensor(gv, {8});
  for (const char* mode : {"none", "tanh"}) {
    auto f = std::string(mode) == "none" ? +exact : +tanh_form;
    std::vector<double> d = loom::gelu_backward(g, x, mode).to_vector<double>();
    for (size_t k = 0; k < v.size(); ++k) {
      const double h = 1e-6;
      EXPECT_NEAR(d[k], gv[k] * (f(v[k] + h) - f(v[k] - h)) / (2 * h), 1e-8) << mode << " " << k;
    }
    const std::string ir = loom::pending_ir({loom::gelu(x, mode), loom::gelu_backward(g, x, mode)});
    const std::string op = std::string(mode) == "none" ? " = erf(" : " = tanh(";
    size_t n = 0;
    for (size_t at = ir.find(op); at != std::string::npos; at = ir.find(op, at + 1)) ++n;
    EXPECT_EQ(n, 1u) << mode << ": the forward's node is not shared\n" << ir;
  }
  LOOM_EXPECT_ERROR(loom::gelu_backward(g, x, "fast"), loom::Error, "approximate");
  LOOM_EXPECT_ERROR(loom::gelu_backward(loom::to(g, loom::DType::Float32), x), loom::DTypeError,
                    "one floating dtype");
}

INSTANTIATE_TEST_SUITE_P(Backends, TorchOpsTest, ::testing::Values("ref", "cpu"));

TEST(TorchOpsGradTest, FillAndZeroFollowTheInPlaceLeafRule) {
  Tensor w = loom::ones({3}).requires_grad_();
  LOOM_EXPECT_ERROR(loom::zero_(w), loom::AutodiffError, "leaf");
  LOOM_EXPECT_ERROR(w.zero_(), loom::AutodiffError, "leaf");
  LOOM_EXPECT_ERROR(loom::fill_(w, 2.0), loom::AutodiffError, "leaf");
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{1, 1, 1}));  // refused: unchanged
  {
    loom::NoGradGuard g;
    loom::fill_(w, 2.5);
  }
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{2.5f, 2.5f, 2.5f}));
  EXPECT_TRUE(loom::is_leaf(w));
  Tensor y = w * 2.0;  // not a leaf: filled freely, as in torch
  EXPECT_FALSE(loom::is_leaf(y));
  loom::zero_(y);
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{0, 0, 0}));
}

TEST(TorchOpsGradTest, GradModeGuardTurnsRecordingOnInsideNoGrad) {
  Tensor w = loom::ones({2}).requires_grad_();
  {
    loom::NoGradGuard off;
    EXPECT_FALSE((w * 2.0).requires_grad());
    {
      loom::GradModeGuard on(true);
      EXPECT_TRUE(loom::grad_enabled());
      EXPECT_TRUE((w * 2.0).requires_grad());
    }
    EXPECT_FALSE(loom::grad_enabled());
  }
  EXPECT_TRUE(loom::grad_enabled());
  loom::set_grad_enabled(false);
  EXPECT_FALSE(loom::grad_enabled());
  loom::set_grad_enabled(true);
  loom::sync();
}

}  // namespace
