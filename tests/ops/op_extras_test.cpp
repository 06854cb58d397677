// Named special cases of the op harness (tests/ops/op_harness_test.cpp) that are not one op on
// one input: type promotion across dtypes, statistics of random draws, the ref interpreter's
// behaviour on graphs the public API does not build (reductions of empty axes, integer
// wrap-around, bit patterns through layout ops, out-of-range indices, Philox per element),
// and gradient ties. Oracles: closed forms, Philox (core/philox.h), PyTorch's rules.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "backend/ref_test_util.h"
#include "loom/core/error.h"
#include "loom/core/philox.h"
#include "loom/ir/builder.h"
#include "loom/loom.h"

namespace {

using loom::DType;
using loom::Shape;
using loom::Tensor;

void expect_close(const std::vector<double>& got, const std::vector<double>& want, DType,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << what << " at " << i << ": want nan, got " << got[i];
    } else if (std::isinf(want[i])) {
      EXPECT_EQ(got[i], want[i]) << what << " at " << i;
    } else {
      EXPECT_NEAR(got[i], want[i], 1e-12 * std::max(1.0, std::fabs(want[i])))
          << what << " at " << i;
    }
  }
}

TEST(OpExtras, FloatOnlyOpsPromoteIntegersToFloat32) {
  Tensor x = loom::tensor(std::vector<int64_t>{1, 4, 9}, {3});
  Tensor y = loom::sqrt(x);
  EXPECT_EQ(y.dtype(), DType::Float32);
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{1, 2, 3}));
}

TEST(OpExtras, NanAndInfPropagate) {
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

TEST(OpExtras, TypePromotionFollowsPyTorch) {
  Tensor i32 = loom::tensor(std::vector<int32_t>{1, 2}, {2});
  Tensor i64 = loom::tensor(std::vector<int64_t>{1, 2}, {2});
  Tensor f32 = loom::tensor(std::vector<float>{1, 2}, {2});
  Tensor b = loom::tensor(std::vector<bool>{true, false}, {2});
  EXPECT_EQ((i64 + 2).dtype(), DType::Int64);      // int + C++ int stays int
  EXPECT_EQ((i32 + 2).dtype(), DType::Int32);      // scalars do not widen
  EXPECT_EQ((i64 + 2.5).dtype(), DType::Float32);  // int + float -> default float
  EXPECT_EQ((i32 + i64).dtype(), DType::Int64);
  EXPECT_EQ((i32 + loom::tensor(int64_t{5})).dtype(), DType::Int32);  // 0-d same category
  EXPECT_EQ((i32 + loom::tensor(2.5)).dtype(), DType::Float64);       // 0-d higher category
  EXPECT_EQ((f32 + loom::tensor(2.5)).dtype(), DType::Float32);
  EXPECT_EQ((b + 1).dtype(), DType::Int64);
  EXPECT_EQ((i64 / i64).dtype(), DType::Float32);  // true division
  EXPECT_EQ((f32 + loom::to(f32, DType::Float64)).dtype(), DType::Float64);
  EXPECT_EQ((loom::to(f32, DType::BFloat16) + loom::to(f32, DType::Float16)).dtype(),
            DType::Float32);
  EXPECT_EQ((i64 + 2).to_vector<int64_t>(), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ((i64 / i64).to_vector<float>(), (std::vector<float>{1, 1}));
  EXPECT_EQ(loom::sum(b).dtype(), DType::Int64);
  EXPECT_EQ(loom::sum(b).item<int64_t>(), 1);
}

TEST(OpExtras, RandomNumbersAreSeededAndDistributed) {
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

TEST(OpExtras, DropoutKeepsWithProbabilityAndScales) {
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

TEST(OpExtras, FactoriesMakeWhatTheySay) {
  EXPECT_EQ(loom::zeros({2, 2}).to_vector<float>(), std::vector<float>(4, 0));
  EXPECT_EQ(loom::ones({3}, DType::Int32).dtype(), DType::Int32);
  EXPECT_EQ(loom::ones({3}, DType::Int32).to_vector<int32_t>(), std::vector<int32_t>(3, 1));
  EXPECT_EQ(loom::full({2}, 2.5, DType::Float64).to_vector<double>(),
            (std::vector<double>{2.5, 2.5}));
  EXPECT_EQ(loom::arange(1, 6).to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5}));
  EXPECT_EQ(loom::arange(-2, 1, DType::Int64).to_vector<int64_t>(),
            (std::vector<int64_t>{-2, -1, 0}));
  EXPECT_EQ(loom::arange(0.5, 3).to_vector<float>(), (std::vector<float>{0.5, 1.5, 2.5}));
  EXPECT_EQ(loom::tensor(int64_t{10}).shape(), (Shape{}));
  EXPECT_EQ(loom::tensor(std::vector<bool>{true, false}, {2}).to_vector<bool>(),
            (std::vector<bool>{true, false}));
  EXPECT_EQ(loom::to(loom::tensor(std::vector<float>{-1.7f, 2.9f}, {2}), DType::Int32)
                .to_vector<int32_t>(),
            (std::vector<int32_t>{-1, 2}));
  EXPECT_EQ(
      loom::to(loom::tensor(std::vector<float>{0.0f, -2.0f}, {2}), DType::Bool).to_vector<bool>(),
      (std::vector<bool>{false, true}));
}

TEST(OpExtras, ClampKeepsIntegersAndSoftmaxAcceptsEmptyDims) {
  Tensor i = loom::tensor(std::vector<int64_t>{-5, 0, 7}, {3});
  Tensor c = loom::clamp(i, -1.0, 3.0);
  EXPECT_EQ(c.dtype(), DType::Int64);
  EXPECT_EQ(c.to_vector<int64_t>(), (std::vector<int64_t>{-1, 0, 3}));
  EXPECT_EQ(loom::clamp(i, 0.5, std::nullopt).dtype(), DType::Float32);  // a fractional bound
  Tensor e = loom::softmax(loom::zeros({2, 0}), 1);
  EXPECT_EQ(e.shape(), (Shape{2, 0}));
  EXPECT_EQ(loom::log_softmax(loom::zeros({0, 3}), 0).shape(), (Shape{0, 3}));
}

TEST(OpExtras, CatOfMixedDTypesPromotes) {
  EXPECT_EQ(loom::cat({loom::tensor(std::vector<int64_t>{1}, {1}),
                       loom::tensor(std::vector<float>{2.5f}, {1})})
                .dtype(),
            DType::Float32);
}

// maximum splits the gradient at ties, as torch.maximum does.
TEST(OpExtras, MaximumTiesSplitTheGradient) {
  Tensor a = loom::tensor(std::vector<double>{1, 2}, {2}).requires_grad_();
  Tensor b = loom::tensor(std::vector<double>{1, 3}, {2}).requires_grad_();
  loom::sum(loom::maximum(a, b)).backward();
  EXPECT_EQ(a.grad().to_vector<double>(), (std::vector<double>{0.5, 0}));
  EXPECT_EQ(b.grad().to_vector<double>(), (std::vector<double>{0.5, 1}));
}

// f64 -> f32 -> f64 is linear with slope 1 wherever it is defined: 3 * x has gradient 3.
TEST(OpExtras, ConvertThroughFloat32PassesTheGradient) {
  Tensor x = loom::tensor(std::vector<double>{0.1, -1.3, 2.7, 0}, {4}).requires_grad_();
  loom::sum(loom::to(loom::to(x, loom::float32) * 3.0, loom::float64)).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), std::vector<double>(4, 3.0));
}

}  // namespace

namespace loom::reftest {
namespace {

using ir::OpKind;
using ir::Value;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int64_t kI32Min = std::numeric_limits<int32_t>::min();
constexpr int64_t kI32Max = std::numeric_limits<int32_t>::max();

TEST(OpExtrasRefReduce, EmptyAxisGivesIdentity) {
  for (DType dt : kFloatTypes) {
    Case c;
    Value x = c.param(dt, {2, 0}, {});
    std::vector<Buffer> out = c.run({c.b.reduce(OpKind::ReduceMax, x, {1}, false),
                                     c.b.reduce(OpKind::ReduceMin, x, {1}, false),
                                     c.b.reduce(OpKind::ReduceSum, x, {1}, false)});
    EXPECT_EQ(decode_floats(dt, out[0]), (std::vector<double>{-kInf, -kInf})) << dt;
    EXPECT_EQ(decode_floats(dt, out[1]), (std::vector<double>{kInf, kInf})) << dt;
    EXPECT_EQ(decode_floats(dt, out[2]), (std::vector<double>{0, 0})) << dt;
  }
  Case c;
  Value x = c.param_i(DType::Int32, {0, 2}, {});
  std::vector<Buffer> out = c.run(
      {c.b.reduce(OpKind::ReduceMax, x, {0}, true), c.b.reduce(OpKind::ReduceMin, x, {0}, true)});
  EXPECT_EQ(decode_ints(DType::Int32, out[0]), (std::vector<int64_t>{kI32Min, kI32Min}));
  EXPECT_EQ(decode_ints(DType::Int32, out[1]), (std::vector<int64_t>{kI32Max, kI32Max}));
}

TEST(OpExtrasRefReduce, IntSumWrapsAndScalarIsIdentity) {
  Case c;
  Value x = c.param_i(DType::Int32, {3}, {kI32Max, 1, 5});
  EXPECT_EQ(c.run_i(c.b.reduce(OpKind::ReduceSum, x, {0}, false)),
            (std::vector<int64_t>{kI32Min + 5}));
  Case d;
  Value s = d.param(DType::Float32, {}, {2.5});
  Value y = d.b.reduce(OpKind::ReduceSum, s, {}, false);
  EXPECT_EQ(d.g.type(y).shape, Shape{});
  EXPECT_EQ(d.run_f(y), (std::vector<double>{2.5}));
}

TEST(OpExtrasRefArgMax, AlongAxisZeroAndIntegers) {
  Case c;
  Value x = c.param_i(DType::Int32, {2, 3}, {1, 5, 2, 4, 5, 0});
  EXPECT_EQ(c.run_i(c.b.argmax(x, 0, false)), (std::vector<int64_t>{1, 0, 0}));
  Case d;  // 2^53 + 1 vs 2^53: int64 must not compare through double
  const int64_t big = int64_t{1} << 53;
  Value y = d.param_i(DType::Int64, {3}, {big, big + 1, big});
  EXPECT_EQ(d.run_i(d.b.argmax(y, 0, false)), (std::vector<int64_t>{1}));
  Case e;
  Value s = e.param(DType::Float64, {}, {3});
  EXPECT_EQ(e.run_i(e.b.argmax(s, 0, false)), (std::vector<int64_t>{0}));
}

TEST(OpExtrasRefLayout, LayoutOpsCopyBitsExactly) {
  Case c;
  Value x = c.param(DType::Float32, {2}, {0, 0});
  uint32_t bits[2] = {0x7fc01234u, 0x80000000u};  // a NaN with a payload, and -0.0
  std::memcpy(c.inputs[0].data(), bits, sizeof bits);
  Value y = c.b.permute(c.b.expand(x, {3, 2}), {1, 0});
  Buffer out = c.run({y})[0];
  for (int i = 0; i < 6; ++i) {
    uint32_t u;
    std::memcpy(&u, out.as<char>() + 4 * i, 4);
    EXPECT_EQ(u, bits[i / 3]) << i;
  }
}

void expect_exec_error(Case& c, Value v, const std::vector<std::string>& parts) {
  try {
    c.run({v});
    ADD_FAILURE() << "expected an ExecError";
  } catch (const ExecError& e) {
    for (const std::string& p : parts) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "'" << p << "' not in: " << e.what();
    }
  }
}

TEST(OpExtrasRefIndex, GatherOutOfRangeThrows) {
  Case c;
  Value x = c.param(DType::Float32, {2, 2}, {1, 2, 3, 4});
  expect_exec_error(c, c.b.gather(x, 1, c.param_i(DType::Int64, {2, 2}, {0, 5, 1, 0})),
                    {"[gather]", "index 5", "axis 1", "extent 2"});
  Case d;
  Value y = d.param(DType::Float32, {2, 2}, {1, 2, 3, 4});
  expect_exec_error(d, d.b.gather(y, 0, d.param_i(DType::Int32, {1, 2}, {0, -1})),
                    {"[gather]", "index -1", "axis 0", "extent 2"});
}

TEST(OpExtrasRefIndex, IndexSelectOutOfRangeThrows) {
  Case c;
  Value x = c.param(DType::Float32, {3, 2}, {1, 2, 3, 4, 5, 6});
  expect_exec_error(c, c.b.index_select(x, 0, c.param_i(DType::Int64, {2}, {0, 3})),
                    {"[index_select]", "index 3", "axis 0", "extent 3"});
  Case d;  // the output is empty, but the bad index is still an error
  Value y = d.param(DType::Float32, {0, 2}, {});
  expect_exec_error(d, d.b.index_select(y, 1, d.param_i(DType::Int32, {1}, {2})),
                    {"[index_select]", "index 2", "axis 1", "extent 2"});
}

TEST(OpExtrasRefRandom, UniformIsPhiloxPerElement) {
  const int64_t seed = 20240601, offset = 3;
  for (DType dt : kFloatTypes) {
    Case c;
    Value key = c.param_i(DType::Int64, {2}, {seed, offset});
    Value u = c.b.random(OpKind::RandUniform, key, TensorType{dt, {3, 5}});
    std::vector<double> got = c.run_f(u);
    for (uint64_t e = 0; e < 15; ++e) {
      // philox_uniform has 24 bits, exact in float: rounding through float is a single rounding.
      EXPECT_EQ(got[e], round_like(dt, philox_uniform(seed, offset, e))) << dt << " element " << e;
      // bf16/f16 may round values near 1 up to 1.0 (the documented "rounded to the result
      // dtype"); f32 and f64 hold every uniform exactly, so they stay below 1.
      if (dt == DType::Float32 || dt == DType::Float64) {
        EXPECT_LT(got[e], 1.0);
      }
    }
  }
}

TEST(OpExtrasRefRandom, NormalIsPhiloxPerElement) {
  for (DType dt : kFloatTypes) {
    Case c;
    Value key = c.param_i(DType::Int64, {2}, {-1, 12345});  // a negative seed is its bits
    Value z = c.b.random(OpKind::RandNormal, key, TensorType{dt, {7}});
    std::vector<double> want;
    for (uint64_t e = 0; e < 7; ++e) want.push_back(philox_normal(~uint64_t{0}, 12345, e));
    expect_floats(dt, c.run_f(z), want);
  }
}

TEST(OpExtrasRefRandom, SameKeySameBitsOtherOffsetOtherBits) {
  Case c;
  Value key = c.param_i(DType::Int64, {2}, {7, 0});
  Value u = c.b.random(OpKind::RandUniform, key, TensorType{DType::Float32, {64}});
  auto exe = c.compile({u});
  std::vector<double> a = decode_floats(DType::Float32, exe->run(c.inputs)[0]);
  std::vector<double> b = decode_floats(DType::Float32, exe->run(c.inputs)[0]);
  EXPECT_EQ(a, b);
  c.inputs[0].as<int64_t>()[1] = 1;
  std::vector<double> d = decode_floats(DType::Float32, exe->run(c.inputs)[0]);
  int same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += a[i] == d[i];
  EXPECT_LT(same, 2);
}

}  // namespace
}  // namespace loom::reftest
