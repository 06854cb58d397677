// Harness rows for reductions, layout, indexing, matrix products and the nn composites: each
// against loops or closed forms written out in this file.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>

#include "loom/loom.h"

namespace {

using loom::DType;
using loom::Shape;
using loom::Tensor;

std::vector<double> iota_values(int64_t n, double scale = 1, double offset = 0) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = offset + scale * static_cast<double>(i);
  return v;
}

Tensor seq(Shape s, DType dt = DType::Float32, double scale = 1, double offset = 0) {
  return loom::to(loom::tensor(iota_values(s.numel(), scale, offset), s), dt);
}

std::vector<double> randoms(int64_t n, uint32_t seed, double lo = -1, double hi = 1) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = u(g);
  return v;
}

void expect_near_all(const std::vector<double>& got, const std::vector<double>& want, double tol,
                     const std::string& what = "") {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], tol * std::max(1.0, std::fabs(want[i]))) << what << " at " << i;
}

TEST(OpHarness, SumMeanMaxMinOverDims) {
  // x[i][j][k] = 100 i + 10 j + k, shape [2, 3, 4]
  std::vector<double> v;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) v.push_back(100 * i + 10 * j + k);
  for (DType dt : {DType::Float32, DType::Float64, DType::Int32, DType::Int64}) {
    Tensor x = loom::to(loom::tensor(v, {2, 3, 4}), dt);
    Tensor s1 = loom::sum(x, {1});
    EXPECT_EQ(s1.shape(), (Shape{2, 4}));
    EXPECT_EQ(s1.dtype(), loom::is_floating(dt) ? dt : DType::Int64);
    std::vector<double> want;
    for (int i = 0; i < 2; ++i)
      for (int k = 0; k < 4; ++k) want.push_back(3 * (100 * i + k) + 30);
    expect_near_all(s1.to_vector<double>(), want, 1e-6);
    Tensor s02 = loom::sum(x, {0, -1}, true);
    EXPECT_EQ(s02.shape(), (Shape{1, 3, 1}));
    std::vector<double> want02;
    for (int j = 0; j < 3; ++j) want02.push_back(8 * 10 * j + 4 * 100 + 2 * 6);
    expect_near_all(s02.to_vector<double>(), want02, 1e-6);
    EXPECT_EQ(loom::max(x).item<double>(), 123);
    EXPECT_EQ(loom::min(x).item<double>(), 0);
    expect_near_all(loom::max(x, {2}).to_vector<double>(), {3, 13, 23, 103, 113, 123}, 0);
    expect_near_all(loom::min(x, {0, 1}).to_vector<double>(), {0, 1, 2, 3}, 0);
    EXPECT_EQ(loom::argmax(x).item<int64_t>(), 23);
    EXPECT_EQ(loom::argmax(x, 1).to_vector<int64_t>(), (std::vector<int64_t>(8, 2)));
    EXPECT_EQ(loom::argmax(x, 0, true).shape(), (Shape{1, 3, 4}));
    if (loom::is_floating(dt)) {
      EXPECT_NEAR(loom::mean(x).item<double>(), 61.5, 1e-4);
      expect_near_all(loom::mean(x, {2}).to_vector<double>(), {1.5, 11.5, 21.5, 101.5, 111.5, 121.5}, 1e-6);
    }
  }
  // 0-d and empty tensors
  EXPECT_EQ(loom::sum(loom::tensor(3.0f)).item<float>(), 3);
  EXPECT_EQ(loom::sum(loom::zeros({0, 3})).item<float>(), 0);
  EXPECT_EQ(loom::sum(loom::zeros({0, 3}), {0}).to_vector<float>(), (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(loom::max(loom::zeros({2, 0}), {0}).shape(), (Shape{0}));
}

TEST(OpHarness, ArgmaxTakesTheFirstMaximumAndNan) {
  Tensor x = loom::tensor(std::vector<float>{1, 5, 5, 2}, {4});
  EXPECT_EQ(loom::argmax(x).item<int64_t>(), 1);
  Tensor y = loom::tensor(std::vector<float>{1, NAN, 7, NAN}, {4});
  EXPECT_EQ(loom::argmax(y).item<int64_t>(), 1);
  EXPECT_TRUE(std::isnan(loom::max(y).item<float>()));
}

TEST(OpHarness, SoftmaxAndLogSoftmaxMatchClosedForm) {
  std::vector<double> v = randoms(12, 7, -5, 5);
  for (DType dt : {DType::Float32, DType::Float64}) {
    Tensor x = loom::to(loom::tensor(v, {3, 4}), dt);
    for (int64_t dim : {0, 1, -1}) {
      int64_t d = dim < 0 ? dim + 2 : dim;
      std::vector<double> want(12), want_log(12);
      for (int64_t o = 0; o < (d == 0 ? 4 : 3); ++o) {
        double m = -INFINITY, s = 0;
        auto at = [&](int64_t k) { return d == 0 ? k * 4 + o : o * 4 + k; };
        int64_t n = d == 0 ? 3 : 4;
        for (int64_t k = 0; k < n; ++k) m = std::max(m, v[at(k)]);
        for (int64_t k = 0; k < n; ++k) s += std::exp(v[at(k)] - m);
        for (int64_t k = 0; k < n; ++k) {
          want[at(k)] = std::exp(v[at(k)] - m) / s;
          want_log[at(k)] = v[at(k)] - m - std::log(s);
        }
      }
      double tol = dt == DType::Float32 ? 1e-5 : 1e-12;
      expect_near_all(loom::softmax(x, dim).to_vector<double>(), want, tol, "softmax");
      expect_near_all(loom::log_softmax(x, dim).to_vector<double>(), want_log, tol, "log_softmax");
    }
  }
  // Large logits do not overflow.
  Tensor big = loom::tensor(std::vector<float>{1000, 1000}, {2});
  expect_near_all(loom::softmax(big, 0).to_vector<double>(), {0.5, 0.5}, 1e-6);
}

TEST(OpHarness, LayerNormMatchesClosedForm) {
  std::vector<double> v = randoms(24, 11, -3, 3), w = randoms(4, 12), b = randoms(4, 13);
  Tensor x = loom::tensor(v, {2, 3, 4});
  Tensor y = loom::layer_norm(x, {4}, loom::tensor(w, {4}), loom::tensor(b, {4}), 1e-5);
  std::vector<double> want;
  for (int r = 0; r < 6; ++r) {
    double m = 0, var = 0;
    for (int k = 0; k < 4; ++k) m += v[r * 4 + k] / 4;
    for (int k = 0; k < 4; ++k) var += (v[r * 4 + k] - m) * (v[r * 4 + k] - m) / 4;
    for (int k = 0; k < 4; ++k) want.push_back((v[r * 4 + k] - m) / std::sqrt(var + 1e-5) * w[k] + b[k]);
  }
  expect_near_all(y.to_vector<double>(), want, 1e-10);
  // normalized over the last two dims, no affine
  Tensor y2 = loom::layer_norm(x, {3, 4});
  std::vector<double> want2;
  for (int r = 0; r < 2; ++r) {
    double m = 0, var = 0;
    for (int k = 0; k < 12; ++k) m += v[r * 12 + k] / 12;
    for (int k = 0; k < 12; ++k) var += (v[r * 12 + k] - m) * (v[r * 12 + k] - m) / 12;
    for (int k = 0; k < 12; ++k) want2.push_back((v[r * 12 + k] - m) / std::sqrt(var + 1e-5));
  }
  expect_near_all(y2.to_vector<double>(), want2, 1e-10);
}

TEST(OpHarness, MatmulMatchesLoops) {
  auto naive = [](const std::vector<double>& a, const std::vector<double>& b, int64_t batch_a,
                  int64_t batch_b, int64_t m, int64_t k, int64_t n) {
    int64_t batch = std::max(batch_a, batch_b);
    std::vector<double> c(batch * m * n, 0);
    for (int64_t t = 0; t < batch; ++t)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j)
          for (int64_t p = 0; p < k; ++p)
            c[(t * m + i) * n + j] += a[((batch_a == 1 ? 0 : t) * m + i) * k + p] *
                                      b[((batch_b == 1 ? 0 : t) * k + p) * n + j];
    return c;
  };
  std::vector<double> a = randoms(3 * 4 * 5, 21), b = randoms(3 * 5 * 2, 22);
  for (DType dt : {DType::Float32, DType::Float64}) {
    double tol = dt == DType::Float32 ? 1e-5 : 1e-12;
    Tensor A = loom::to(loom::tensor(a, {3, 4, 5}), dt), B = loom::to(loom::tensor(b, {3, 5, 2}), dt);
    Tensor C = loom::matmul(A, B);
    EXPECT_EQ(C.shape(), (Shape{3, 4, 2}));
    expect_near_all(C.to_vector<double>(), naive(a, b, 3, 3, 4, 5, 2), tol, "batched");
    // broadcast batch: [4,5] x [3,5,2]
    Tensor A2 = loom::to(loom::tensor(std::vector<double>(a.begin(), a.begin() + 20), {4, 5}), dt);
    expect_near_all(loom::matmul(A2, B).to_vector<double>(),
                    naive(std::vector<double>(a.begin(), a.begin() + 20), b, 1, 3, 4, 5, 2), tol, "broadcast");
    // 1-d cases
    Tensor v5 = loom::to(loom::tensor(std::vector<double>(b.begin(), b.begin() + 5), {5}), dt);
    Tensor mv = loom::matmul(A2, v5);
    EXPECT_EQ(mv.shape(), (Shape{4}));
    expect_near_all(mv.to_vector<double>(),
                    naive(std::vector<double>(a.begin(), a.begin() + 20), std::vector<double>(b.begin(), b.begin() + 5), 1, 1, 4, 5, 1), tol, "mv");
    Tensor dot = loom::matmul(v5, v5);
    EXPECT_EQ(dot.shape(), (Shape{}));
    double d = 0;
    for (int i = 0; i < 5; ++i) d += b[i] * b[i];
    EXPECT_NEAR(dot.item<double>(), d, tol);
    Tensor vm = loom::matmul(v5, loom::transpose(A2, 0, 1));
    EXPECT_EQ(vm.shape(), (Shape{4}));
  }
  // integers and empty inner dimension
  Tensor I = loom::tensor(std::vector<int64_t>{1, 2, 3, 4}, {2, 2});
  EXPECT_EQ(loom::matmul(I, I).to_vector<int64_t>(), (std::vector<int64_t>{7, 10, 15, 22}));
  EXPECT_EQ(loom::matmul(loom::zeros({2, 0}), loom::zeros({0, 3})).to_vector<float>(), std::vector<float>(6, 0));
}

TEST(OpHarness, LayoutOpsMoveElementsAsIndexMathSays) {
  Tensor x = seq({2, 3, 4});
  Tensor p = loom::permute(x, {2, 0, 1});
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  std::vector<double> want;
  for (int k = 0; k < 4; ++k)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j) want.push_back(i * 12 + j * 4 + k);
  expect_near_all(p.to_vector<double>(), want, 0);
  Tensor t = loom::transpose(x, 0, -1);
  EXPECT_EQ(t.shape(), (Shape{4, 3, 2}));
  EXPECT_EQ(t.to_vector<float>()[1], 12);
  EXPECT_EQ(loom::reshape(x, {4, -1}).shape(), (Shape{4, 6}));
  EXPECT_EQ(loom::view(x, {-1}).to_vector<float>(), seq({24}).to_vector<float>());
  EXPECT_EQ(loom::flatten(x, 1).shape(), (Shape{2, 12}));
  EXPECT_EQ(loom::unsqueeze(x, -1).shape(), (Shape{2, 3, 4, 1}));
  EXPECT_EQ(loom::squeeze(loom::zeros({1, 3, 1})).shape(), (Shape{3}));
  EXPECT_EQ(loom::squeeze(loom::zeros({1, 3, 1}), 0).shape(), (Shape{3, 1}));
  Tensor e = loom::expand(loom::tensor(std::vector<float>{1, 2}, {2, 1}), {3, 2, -1 + 4});
  EXPECT_EQ(e.shape(), (Shape{3, 2, 3}));
  EXPECT_EQ(e.to_vector<float>(), (std::vector<float>{1, 1, 1, 2, 2, 2, 1, 1, 1, 2, 2, 2, 1, 1, 1, 2, 2, 2}));
  // slice with negative bounds, steps, clamping
  Tensor s = loom::slice(seq({10}), 0, -7, 9, 3);
  EXPECT_EQ(s.to_vector<float>(), (std::vector<float>{3, 6}));
  EXPECT_EQ(loom::slice(seq({10}), 0, 8, 100).to_vector<float>(), (std::vector<float>{8, 9}));
  EXPECT_EQ(loom::slice(seq({10}), 0, 5, 2).numel(), 0);
  Tensor s2 = loom::slice(x, 1, 1, 3);
  EXPECT_EQ(s2.shape(), (Shape{2, 2, 4}));
  EXPECT_EQ(s2.to_vector<float>()[0], 4);
  EXPECT_EQ(x[1].shape(), (Shape{3, 4}));
  EXPECT_EQ(x[-1][2].to_vector<float>(), (std::vector<float>{20, 21, 22, 23}));
  EXPECT_EQ(loom::select(x, 2, 3).to_vector<float>(), (std::vector<float>{3, 7, 11, 15, 19, 23}));
}

TEST(OpHarness, CatAndStack) {
  Tensor a = seq({2, 2}), b = seq({2, 3}, DType::Float32, 1, 10);
  Tensor c = loom::cat({a, b}, 1);
  EXPECT_EQ(c.shape(), (Shape{2, 5}));
  EXPECT_EQ(c.to_vector<float>(), (std::vector<float>{0, 1, 10, 11, 12, 2, 3, 13, 14, 15}));
  Tensor d = loom::cat({a, loom::zeros({0, 2}), a}, 0);
  EXPECT_EQ(d.shape(), (Shape{4, 2}));
  Tensor s = loom::stack({a, a * 2}, 1);
  EXPECT_EQ(s.shape(), (Shape{2, 2, 2}));
  EXPECT_EQ(s.to_vector<float>(), (std::vector<float>{0, 1, 0, 2, 2, 3, 4, 6}));
  EXPECT_EQ(loom::stack({loom::tensor(1.0f), loom::tensor(2.0f)}).to_vector<float>(), (std::vector<float>{1, 2}));
  // mixed dtypes promote
  EXPECT_EQ(loom::cat({loom::tensor(std::vector<int64_t>{1}, {1}), loom::tensor(std::vector<float>{2.5f}, {1})}).dtype(), DType::Float32);
}

TEST(OpHarness, GatherIndexSelectEmbedding) {
  Tensor x = seq({3, 4});
  Tensor idx = loom::tensor(std::vector<int64_t>{2, 0}, {2});
  Tensor r = loom::index_select(x, 0, idx);
  EXPECT_EQ(r.to_vector<float>(), (std::vector<float>{8, 9, 10, 11, 0, 1, 2, 3}));
  Tensor c = loom::index_select(x, 1, loom::tensor(std::vector<int32_t>{3, 3, 1}, {3}));
  EXPECT_EQ(c.to_vector<float>(), (std::vector<float>{3, 3, 1, 7, 7, 5, 11, 11, 9}));
  // torch.gather: out[i][j] = x[i][idx[i][j]] along dim 1
  Tensor gi = loom::tensor(std::vector<int64_t>{3, 0, 1, 1, 2, 2}, {3, 2});
  EXPECT_EQ(loom::gather(x, 1, gi).to_vector<float>(), (std::vector<float>{3, 0, 5, 5, 10, 10}));
  // along dim 0: out[i][j] = x[idx[i][j]][j]
  Tensor g0 = loom::tensor(std::vector<int64_t>{2, 1, 0, 0}, {1, 4});
  EXPECT_EQ(loom::gather(x, 0, g0).to_vector<float>(), (std::vector<float>{8, 5, 2, 3}));
  Tensor w = seq({5, 3});
  Tensor e = loom::embedding(loom::tensor(std::vector<int64_t>{4, 0, 4, 1}, {2, 2}), w);
  EXPECT_EQ(e.shape(), (Shape{2, 2, 3}));
  EXPECT_EQ(e.to_vector<float>(), (std::vector<float>{12, 13, 14, 0, 1, 2, 12, 13, 14, 3, 4, 5}));
}

TEST(OpHarness, LossesMatchClosedForm) {
  std::vector<double> logits = randoms(12, 31, -3, 3);
  std::vector<int64_t> target = {2, 0, 3};
  Tensor l = loom::tensor(logits, {3, 4});
  double want = 0;
  for (int i = 0; i < 3; ++i) {
    double m = -INFINITY, s = 0;
    for (int k = 0; k < 4; ++k) m = std::max(m, logits[i * 4 + k]);
    for (int k = 0; k < 4; ++k) s += std::exp(logits[i * 4 + k] - m);
    want -= (logits[i * 4 + target[i]] - m - std::log(s)) / 3;
  }
  EXPECT_NEAR(loom::cross_entropy(l, loom::tensor(target, {3})).item<double>(), want, 1e-12);
  std::vector<double> probs(12, 0);
  for (int i = 0; i < 3; ++i) probs[i * 4 + target[i]] = 1;
  EXPECT_NEAR(loom::cross_entropy(l, loom::tensor(probs, {3, 4})).item<double>(), want, 1e-12);
  std::vector<double> a = randoms(6, 41), b = randoms(6, 42);
  double mse = 0;
  for (int i = 0; i < 6; ++i) mse += (a[i] - b[i]) * (a[i] - b[i]) / 6;
  EXPECT_NEAR(loom::mse_loss(loom::tensor(a, {2, 3}), loom::tensor(b, {2, 3})).item<double>(), mse, 1e-12);
}

TEST(OpHarness, RandomNumbersAreSeededAndDistributed) {
  loom::manual_seed(1234);
  Tensor a = loom::rand({1000});
  Tensor n = loom::randn({4000}, DType::Float64);
  loom::manual_seed(1234);
  Tensor b = loom::rand({1000});
  EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>());
  Tensor c = loom::rand({1000});  // a later draw differs
  EXPECT_NE(a.to_vector<float>(), c.to_vector<float>());
  std::vector<float> u = a.to_vector<float>();
  double mean = std::accumulate(u.begin(), u.end(), 0.0) / u.size();
  EXPECT_NEAR(mean, 0.5, 5 * std::sqrt(1.0 / 12 / 1000));
  for (float x : u) {
    EXPECT_GE(x, 0);
    EXPECT_LT(x, 1);
  }
  std::vector<double> z = n.to_vector<double>();
  double zm = std::accumulate(z.begin(), z.end(), 0.0) / z.size(), zv = 0;
  for (double x : z) zv += (x - zm) * (x - zm) / z.size();
  EXPECT_NEAR(zm, 0, 5 / std::sqrt(4000.0));
  EXPECT_NEAR(zv, 1, 5 * std::sqrt(2.0 / 4000));
}

TEST(OpHarness, DropoutKeepsWithProbabilityAndScales) {
  loom::manual_seed(7);
  Tensor x = loom::ones({10000});
  std::vector<float> y = loom::dropout(x, 0.25).to_vector<float>();
  int kept = 0;
  for (float v : y) {
    EXPECT_TRUE(v == 0 || std::fabs(v - 1 / 0.75f) < 1e-6) << v;
    kept += v != 0;
  }
  EXPECT_NEAR(kept / 10000.0, 0.75, 5 * std::sqrt(0.75 * 0.25 / 10000));
  EXPECT_EQ(loom::dropout(x, 0.5, false).to_vector<float>(), x.to_vector<float>());
  EXPECT_EQ(loom::sum(loom::dropout(x, 1.0)).item<float>(), 0);
}

TEST(OpHarness, FactoriesMakeWhatTheySay) {
  EXPECT_EQ(loom::zeros({2, 2}).to_vector<float>(), std::vector<float>(4, 0));
  EXPECT_EQ(loom::ones({3}, DType::Int32).dtype(), DType::Int32);
  EXPECT_EQ(loom::ones({3}, DType::Int32).to_vector<int32_t>(), std::vector<int32_t>(3, 1));
  EXPECT_EQ(loom::full({2}, 2.5, DType::Float64).to_vector<double>(), (std::vector<double>{2.5, 2.5}));
  EXPECT_EQ(loom::arange(1, 6).to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5}));
  EXPECT_EQ(loom::arange(-2, 1, DType::Int64).to_vector<int64_t>(), (std::vector<int64_t>{-2, -1, 0}));
  EXPECT_EQ(loom::arange(0.5, 3).to_vector<float>(), (std::vector<float>{0.5, 1.5, 2.5}));
  EXPECT_EQ(loom::arange(2, 2).numel(), 0);
  EXPECT_THROW(loom::arange(3, 1), loom::ShapeError);  // as torch
  EXPECT_EQ(loom::tensor(int64_t{10}).shape(), (Shape{}));
  EXPECT_EQ(loom::tensor(std::vector<bool>{true, false}, {2}).to_vector<bool>(), (std::vector<bool>{true, false}));
  EXPECT_EQ(loom::to(loom::tensor(std::vector<float>{-1.7f, 2.9f}, {2}), DType::Int32).to_vector<int32_t>(),
            (std::vector<int32_t>{-1, 2}));
  EXPECT_EQ(loom::to(loom::tensor(std::vector<float>{0.0f, -2.0f}, {2}), DType::Bool).to_vector<bool>(),
            (std::vector<bool>{false, true}));
}

}  // namespace

namespace {

TEST(OpHarness, ClampKeepsIntegersAndSoftmaxAcceptsEmptyDims) {
  Tensor i = loom::tensor(std::vector<int64_t>{-5, 0, 7}, {3});
  Tensor c = loom::clamp(i, -1.0, 3.0);
  EXPECT_EQ(c.dtype(), DType::Int64);
  EXPECT_EQ(c.to_vector<int64_t>(), (std::vector<int64_t>{-1, 0, 3}));
  EXPECT_EQ(loom::clamp(i, 0.5, std::nullopt).dtype(), DType::Float32);  // a fractional bound
  Tensor e = loom::softmax(loom::zeros({2, 0}), 1);
  EXPECT_EQ(e.shape(), (Shape{2, 0}));
  EXPECT_EQ(loom::log_softmax(loom::zeros({0, 3}), 0).shape(), (Shape{0, 3}));
}

}  // namespace
