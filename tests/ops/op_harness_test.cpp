// The table-driven op harness: a row per public op. Each row checks type inference (dtype and
// shape of the result), the IR round trip and fingerprint stability of the traced graph, and
// the computed values against closed forms evaluated in double in this file, across dtypes,
// broadcasting, 0-d and 0-size tensors.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "loom/ir/builder.h"
#include "loom/loom.h"

namespace {

using loom::DType;
using loom::Shape;
using loom::Tensor;

double tolerance(DType dt) {
  switch (dt) {
    case DType::Float64: return 1e-12;
    case DType::Float32: return 2e-6;
    case DType::Float16: return 2e-3;
    case DType::BFloat16: return 1.6e-2;
    default: return 0;
  }
}

// Input of `shape` with values drawn from [lo, hi], rounded to dtype (returned tensor holds
// the rounded values; the oracle reads them back so rounding of inputs is not an error).
Tensor make_input(const Shape& shape, DType dt, double lo, double hi, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(static_cast<size_t>(shape.numel()));
  for (double& x : v) x = loom::is_floating(dt) ? u(gen) : std::round(u(gen));
  Tensor t = loom::to(loom::tensor(v, shape), dt);
  loom::sync();
  return t;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, DType dt,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double tol = tolerance(dt);
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << what << " at " << i << ": want nan, got " << got[i];
    } else if (std::isinf(want[i])) {
      EXPECT_EQ(got[i], want[i]) << what << " at " << i;
    } else {
      EXPECT_NEAR(got[i], want[i], tol * std::max(1.0, std::fabs(want[i])))
          << what << " at " << i;
    }
  }
}

// Traces the graph of `out`, checks that text round-trips and the fingerprint is stable.
void check_ir(const Tensor& out, const std::string& what) {
  std::string text = loom::pending_ir({out});
  loom::ir::Graph g = loom::ir::parse(text);
  EXPECT_EQ(loom::ir::to_text(g), text) << what;
  EXPECT_EQ(loom::ir::fingerprint(g), loom::ir::fingerprint(loom::ir::parse(loom::ir::to_text(g))))
      << what;
}

const std::vector<Shape> kUnaryShapes = {{}, {0}, {5}, {2, 3}, {2, 0, 3}};
const std::vector<DType> kFloatTypes = {DType::Float32, DType::Float64, DType::BFloat16,
                                        DType::Float16};

struct UnaryRow {
  const char* name;
  std::function<Tensor(const Tensor&)> op;
  std::function<double(double)> oracle;
  double lo, hi;
  bool ints_too;  // also defined on integer tensors, keeping their dtype
};

const std::vector<UnaryRow>& unary_rows() {
  static const std::vector<UnaryRow> rows = {
      {"neg", [](const Tensor& x) { return -x; }, [](double x) { return -x; }, -5, 5, true},
      {"abs", [](const Tensor& x) { return loom::abs(x); }, [](double x) { return std::fabs(x); }, -5, 5, true},
      {"exp", [](const Tensor& x) { return loom::exp(x); }, [](double x) { return std::exp(x); }, -4, 4, false},
      {"log", [](const Tensor& x) { return loom::log(x); }, [](double x) { return std::log(x); }, 0.1, 9, false},
      {"sqrt", [](const Tensor& x) { return loom::sqrt(x); }, [](double x) { return std::sqrt(x); }, 0, 9, false},
      {"rsqrt", [](const Tensor& x) { return loom::rsqrt(x); }, [](double x) { return 1 / std::sqrt(x); }, 0.1, 9, false},
      {"tanh", [](const Tensor& x) { return loom::tanh(x); }, [](double x) { return std::tanh(x); }, -3, 3, false},
      {"sigmoid", [](const Tensor& x) { return loom::sigmoid(x); }, [](double x) { return 1 / (1 + std::exp(-x)); }, -6, 6, false},
      {"relu", [](const Tensor& x) { return loom::relu(x); }, [](double x) { return x > 0 ? x : 0; }, -3, 3, true},
      {"gelu", [](const Tensor& x) { return loom::gelu(x); }, [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }, -4, 4, false},
      {"sin", [](const Tensor& x) { return loom::sin(x); }, [](double x) { return std::sin(x); }, -3, 3, false},
      {"cos", [](const Tensor& x) { return loom::cos(x); }, [](double x) { return std::cos(x); }, -3, 3, false},
      {"erf", [](const Tensor& x) { return loom::erf(x); }, [](double x) { return std::erf(x); }, -2, 2, false},
      {"clamp", [](const Tensor& x) { return loom::clamp(x, -1.0, 2.0); }, [](double x) { return std::min(std::max(x, -1.0), 2.0); }, -3, 3, false},
      {"pow2", [](const Tensor& x) { return loom::pow(x, 2); }, [](double x) { return x * x; }, -3, 3, true},
      {"mul_scalar", [](const Tensor& x) { return x * 3; }, [](double x) { return 3 * x; }, -3, 3, true},
      {"rsub_scalar", [](const Tensor& x) { return 1 - x; }, [](double x) { return 1 - x; }, -3, 3, true},
  };
  return rows;
}

TEST(OpHarness, UnaryRowsAgainstClosedForms) {
  uint32_t seed = 1;
  for (const UnaryRow& row : unary_rows()) {
    std::vector<DType> types = kFloatTypes;
    if (row.ints_too) types.insert(types.end(), {DType::Int32, DType::Int64});
    for (DType dt : types) {
      for (const Shape& s : kUnaryShapes) {
        std::string what = std::string(row.name) + " " + std::string(loom::name(dt)) + s.str();
        Tensor x = make_input(s, dt, row.lo, row.hi, seed++);
        Tensor y = row.op(x);
        EXPECT_EQ(y.shape(), s) << what;
        EXPECT_EQ(y.dtype(), dt) << what;
        check_ir(y, what);
        std::vector<double> in = x.to_vector<double>(), want;
        for (double v : in) {
          double w = row.oracle(v);
          want.push_back(loom::is_floating(dt) ? w : std::trunc(w));
        }
        expect_close(y.to_vector<double>(), want, dt, what);
      }
    }
  }
}

TEST(OpHarness, FloatOnlyOpsPromoteIntegersToFloat32) {
  Tensor x = loom::tensor(std::vector<int64_t>{1, 4, 9}, {3});
  Tensor y = loom::sqrt(x);
  EXPECT_EQ(y.dtype(), DType::Float32);
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{1, 2, 3}));
}

TEST(OpHarness, NanAndInfPropagate) {
  const double inf = INFINITY, nan = NAN;
  Tensor x = loom::tensor(std::vector<double>{nan, inf, -inf, 0.0}, {4});
  expect_close(loom::exp(x).to_vector<double>(), {nan, inf, 0, 1}, DType::Float64, "exp");
  expect_close(loom::relu(x).to_vector<double>(), {nan, inf, 0, 0}, DType::Float64, "relu");
  expect_close(loom::tanh(x).to_vector<double>(), {nan, 1, -1, 0}, DType::Float64, "tanh");
  expect_close(loom::maximum(x, loom::zeros({4}, DType::Float64)).to_vector<double>(),
               {nan, inf, 0, 0}, DType::Float64, "maximum");
  expect_close((x / loom::tensor(0.0)).to_vector<double>(), {nan, inf, -inf, nan}, DType::Float64,
               "div by zero");
  expect_close(loom::sigmoid(x).to_vector<double>(), {nan, 1, 0, 0.5}, DType::Float64, "sigmoid");
}

struct BinaryRow {
  const char* name;
  std::function<Tensor(const Tensor&, const Tensor&)> op;
  std::function<double(double, double)> oracle;
  double lo, hi;
  bool ints_too, compare;
};

TEST(OpHarness, BinaryRowsBroadcastAcrossDTypes) {
  const std::vector<BinaryRow> rows = {
      {"add", [](auto& a, auto& b) { return a + b; }, [](double a, double b) { return a + b; }, -5, 5, true, false},
      {"sub", [](auto& a, auto& b) { return a - b; }, [](double a, double b) { return a - b; }, -5, 5, true, false},
      {"mul", [](auto& a, auto& b) { return a * b; }, [](double a, double b) { return a * b; }, -5, 5, true, false},
      {"div", [](auto& a, auto& b) { return a / b; }, [](double a, double b) { return a / b; }, 0.5, 5, false, false},
      {"pow", [](auto& a, auto& b) { return loom::pow(a, b); }, [](double a, double b) { return std::pow(a, b); }, 0.5, 3, false, false},
      {"maximum", [](auto& a, auto& b) { return loom::maximum(a, b); }, [](double a, double b) { return std::max(a, b); }, -5, 5, true, false},
      {"minimum", [](auto& a, auto& b) { return loom::minimum(a, b); }, [](double a, double b) { return std::min(a, b); }, -5, 5, true, false},
      {"lt", [](auto& a, auto& b) { return a < b; }, [](double a, double b) { return double(a < b); }, -2, 2, true, true},
      {"le", [](auto& a, auto& b) { return a <= b; }, [](double a, double b) { return double(a <= b); }, -2, 2, true, true},
      {"gt", [](auto& a, auto& b) { return a > b; }, [](double a, double b) { return double(a > b); }, -2, 2, true, true},
      {"ge", [](auto& a, auto& b) { return a >= b; }, [](double a, double b) { return double(a >= b); }, -2, 2, true, true},
      {"eq", [](auto& a, auto& b) { return a == b; }, [](double a, double b) { return double(a == b); }, -2, 2, true, true},
      {"ne", [](auto& a, auto& b) { return a != b; }, [](double a, double b) { return double(a != b); }, -2, 2, true, true},
  };
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{4}, {4}}, {{2, 3}, {3}}, {{2, 1}, {1, 3}}, {{}, {2, 2}}, {{0, 3}, {3}}, {{3, 1, 2}, {4, 1}}};
  uint32_t seed = 100;
  for (const BinaryRow& row : rows) {
    std::vector<DType> types = kFloatTypes;
    if (row.ints_too) types.insert(types.end(), {DType::Int32, DType::Int64});
    for (DType dt : types) {
      for (auto& [sa, sb] : shapes) {
        std::string what = std::string(row.name) + " " + std::string(loom::name(dt)) + sa.str() + sb.str();
        Tensor a = make_input(sa, dt, row.lo, row.hi, seed++);
        Tensor b = make_input(sb, dt, row.lo, row.hi, seed++);
        Tensor y = row.op(a, b);
        Shape want_shape = loom::ir::broadcast_shapes("test", sa, sb);
        EXPECT_EQ(y.shape(), want_shape) << what;
        EXPECT_EQ(y.dtype(), row.compare ? DType::Bool : dt) << what;
        check_ir(y, what);
        // Oracle by explicit broadcasting through expand-free index math.
        std::vector<double> va = a.to_vector<double>(), vb = b.to_vector<double>(), want;
        auto idx = [&](const Shape& s, int64_t k) {
          int64_t off = 0, stride = 1;
          for (size_t d = want_shape.size(); d-- > 0;) {
            int64_t coord = k % want_shape[d];
            k /= want_shape[d];
            size_t sd = d + s.size();
            if (sd >= want_shape.size()) {
              size_t i = sd - want_shape.size();
              if (s[i] != 1) off += coord * stride;
              stride *= s[i];
            }
          }
          return off;
        };
        for (int64_t k = 0; k < want_shape.numel(); ++k) {
          double w = row.oracle(va[idx(sa, k)], vb[idx(sb, k)]);
          want.push_back(loom::is_floating(dt) || row.compare ? w : std::trunc(w));
        }
        DType tol_dt = row.compare ? DType::Float64 : dt;
        expect_close(y.to_vector<double>(), want, tol_dt, what);
      }
    }
  }
}

TEST(OpHarness, TypePromotionFollowsPyTorch) {
  Tensor i32 = loom::tensor(std::vector<int32_t>{1, 2}, {2});
  Tensor i64 = loom::tensor(std::vector<int64_t>{1, 2}, {2});
  Tensor f32 = loom::tensor(std::vector<float>{1, 2}, {2});
  Tensor b = loom::tensor(std::vector<bool>{true, false}, {2});
  EXPECT_EQ((i64 + 2).dtype(), DType::Int64);                          // int + C++ int stays int
  EXPECT_EQ((i32 + 2).dtype(), DType::Int32);                          // scalars do not widen
  EXPECT_EQ((i64 + 2.5).dtype(), DType::Float32);                      // int + float -> default float
  EXPECT_EQ((i32 + i64).dtype(), DType::Int64);
  EXPECT_EQ((i32 + loom::tensor(int64_t{5})).dtype(), DType::Int32);   // 0-d same category
  EXPECT_EQ((i32 + loom::tensor(2.5)).dtype(), DType::Float64);        // 0-d higher category
  EXPECT_EQ((f32 + loom::tensor(2.5)).dtype(), DType::Float32);
  EXPECT_EQ((b + 1).dtype(), DType::Int64);
  EXPECT_EQ((i64 / i64).dtype(), DType::Float32);                      // true division
  EXPECT_EQ((f32 + loom::to(f32, DType::Float64)).dtype(), DType::Float64);
  EXPECT_EQ((loom::to(f32, DType::BFloat16) + loom::to(f32, DType::Float16)).dtype(), DType::Float32);
  EXPECT_EQ((i64 + 2).to_vector<int64_t>(), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ((i64 / i64).to_vector<float>(), (std::vector<float>{1, 1}));
  EXPECT_EQ(loom::sum(b).dtype(), DType::Int64);
  EXPECT_EQ(loom::sum(b).item<int64_t>(), 1);
}

TEST(OpHarness, WhereSelectsAndBroadcasts) {
  Tensor c = loom::tensor(std::vector<bool>{true, false, true}, {3});
  Tensor a = loom::tensor(std::vector<float>{1, 2, 3}, {3});
  Tensor y = loom::where(c, a, loom::tensor(-1.0f));
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{1, -1, 3}));
  Tensor z = loom::where(loom::reshape(c, {3, 1}), a, loom::zeros({3}));
  EXPECT_EQ(z.shape(), (Shape{3, 3}));
  EXPECT_EQ(z.to_vector<float>(), (std::vector<float>{1, 2, 3, 0, 0, 0, 1, 2, 3}));
  EXPECT_EQ(loom::logical_not(c).to_vector<bool>(), (std::vector<bool>{false, true, false}));
}

}  // namespace
