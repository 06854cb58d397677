// Named special cases of the op harness (tests/ops/op_harness_test.cpp) that are not one op on
// one input: type promotion across dtypes, statistics of random draws, the ref interpreter's
// behaviour on graphs the public API does not build (reductions of empty axes, integer
// wrap-around, bit patterns through layout ops, out-of-range indices, Philox per element),
// and gradient ties. Oracles: closed forms, Philox (core/philox.h), PyTorch's rules. Then
// (OpExtrasDiff) the ref-against-cpu cases that are not one op on one input: integer edges and
// wrap-around, scalar operands, every conversion pair at edge values, 0-size and 0-d across
// ops, layer_norm's argument forms, layout chains, indexing forms, out-of-range indices on
// both backends, random draws for other seeds and in sequence, factories and in-place ops.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "backend/diff_util.h"
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

// ---- ref against cpu: the special cases of the differential tests that are not one op on
// one input (tests/backend/diff_util.h's expect_same runs a program on both backends).

namespace loom::difftest {
namespace {

using OpExtrasDiff = DiffTest;

constexpr double kI32Max = std::numeric_limits<int32_t>::max();
constexpr double kI32Min = std::numeric_limits<int32_t>::min();

// neg and abs stay integral and wrap at the minimum (int64's extremes are not doubles, so
// they are given as integers here rather than in a row).
TEST_F(OpExtrasDiff, UnaryOpsOnIntegerEdges) {
  for (DType dt : {DType::Int32, DType::Int64}) {
    SCOPED_TRACE(str(dt, {}));
    expect_same([&](Outs& o) {
      Tensor edge = from_ints(dt, {8},
                              {0, 1, -1, 7, -7, 100, static_cast<int64_t>(kI32Min),
                               dt == DType::Int64 ? std::numeric_limits<int64_t>::min()
                                                  : static_cast<int64_t>(kI32Max)});
      o.exact("neg edge", neg(edge));
      o.exact("abs edge", abs(edge));
      o.exact("relu edge", relu(edge));
      o.exact("not edge", logical_not(edge));
    });
  }
}

// Integer arithmetic wraps: results must match bit for bit at the extremes.
TEST_F(OpExtrasDiff, IntegerOverflowWraps) {
  for (DType dt : {DType::Int32, DType::Int64}) {
    SCOPED_TRACE(str(dt, {}));
    const int64_t lo =
        dt == DType::Int32 ? static_cast<int64_t>(kI32Min) : std::numeric_limits<int64_t>::min();
    const int64_t hi =
        dt == DType::Int32 ? static_cast<int64_t>(kI32Max) : std::numeric_limits<int64_t>::max();
    expect_same([&](Outs& o) {
      Tensor a = from_ints(dt, {8}, {hi, lo, 65536, -1, lo, 3, 0, 7});
      Tensor b = from_ints(dt, {8}, {1, -1, 65536, lo, lo, 40, 0, -2});
      o.exact("add", a + b);
      o.exact("sub", a - b);
      o.exact("mul", a * b);
      o.exact("pow", pow(a, b));
      o.exact("max", maximum(a, b));
      o.exact("min", minimum(a, b));
      o.arith("true div", a / b);
      o.exact("neg", -a);
      o.exact("sum", sum(a));
    });
  }
  expect_same([&](Outs& o) {
    Tensor big = from_ints(DType::Int32, {4, 3},
                           {2147483647, 2147483647, -2147483648, 1, 2, 3, 2147483647, 2147483647,
                            2147483647, -5, 0, 5});
    o.exact("sum i32 all", sum(big));
    o.exact("sum i32 dim", sum(big, {0}));
    o.exact("sum bool", sum(input(DType::Bool, {37, 129}, 52), {1}));
    const int64_t i64_max = std::numeric_limits<int64_t>::max();
    o.exact("sum i64 wraps", sum(from_ints(DType::Int64, {2}, {i64_max, 1})));
  });
}

// Operands in [-4, 4]: integer division by zero happens (true division gives float32 inf/nan),
// float pow of a negative base gives NaN, integer pow of a negative exponent gives 0 or +-1;
// and every scalar form of the operators (scalars do not widen the tensor's dtype).
TEST_F(OpExtrasDiff, ScalarOperandsNegativeBasesAndIntegerDivision) {
  for (DType dt : kNumericDTypes) {
    for (const Shape& s : {Shape{5, 7}, Shape{4097}}) {
      SCOPED_TRACE(str(dt, s));
      expect_same([&](Outs& o) {
        Tensor a = input(dt, s, 6, -4, 4), b = input(dt, s, 7, -4, 4);
        o.arith("div", a / b);
        o.arith("div()", div(a, b));
        o.trans("pow", pow(a, b));
        o.arith("a + 2", a + 2);
        o.arith("a - 1.5", a - 1.5);
        o.arith("3 - a", 3 - a);
        o.arith("a * 0.25", a * 0.25);
        o.arith("-2 * a", -2 * a);
        o.arith("a / 3", a / 3);
        o.arith("2.5 / a", 2.5 / a);
        o.arith("1 + a", 1 + a);
        o.arith("a * int64", a * int64_t{3});
        o.trans("pow 2", pow(a, 2));
        o.trans("pow 3", pow(a, 3));
        o.trans("pow 0.5", pow(a, 0.5));
        if (is_floating(dt)) {
          o.trans("pow -1", pow(a, -1));
        } else {
          EXPECT_THROW(pow(a, -1), DTypeError);  // as torch
        }
      });
    }
  }
  expect_same([&](Outs& o) {  // division by zero: integers give float32 inf and nan
    Tensor a = from_ints(DType::Int32, {4}, {1, -1, 0, 5});
    Tensor z = from_ints(DType::Int32, {4}, {0, 0, 0, 0});
    o.exact("int / 0", a / z);
    o.exact("int64 / 0", to(a, DType::Int64) / to(z, DType::Int64));
    o.exact("int / 0 scalar", a / 0);
    Tensor x = input(DType::Float32, {8}, 3, -2, 2);
    o.exact("x / 0", x / 0.0);
    o.exact("x / -0", x / -0.0);
  });
}

// Scalar comparisons and operands of another dtype, which promote before the op.
TEST_F(OpExtrasDiff, ScalarComparisonsAndMixedDTypes) {
  for (DType dt : kAllDTypes) {
    SCOPED_TRACE(str(dt, {}));
    expect_same([&](Outs& o) {
      auto grid = [&](uint32_t seed) {
        std::vector<double> v = host_values(DType::Int32, 60, seed, -3, 3);
        for (double& x : v) x = dt == DType::Bool ? (x > 0) : is_floating(dt) ? x / 2 : x;
        if (is_floating(dt)) v[7] = v[11] = kNaN;
        return from_values(dt, {6, 10}, v);
      };
      Tensor a = grid(8), b = grid(9);
      o.exact("lt s", a < 0.5);
      o.exact("le s", a <= 1);
      o.exact("gt s", a > -1);
      o.exact("ge s", a >= 0);
      o.exact("eq s", a == 1);
      o.exact("ne s", a != 0);
      o.exact("eq bool s", a == true);
      o.exact("lt f32", a < input(DType::Float32, {6, 10}, 10, -2, 2));
      o.exact("eq i64 row", a == from_ints(DType::Int64, {10}, {0, 1, -1, 2, 0, 0, 1, 1, 3, -3}));
      o.exact("where cmp", where(a > b, a, b));
      o.exact("where mixed", where(a > b, a, input(DType::Float32, {6, 10}, 18)));
      if (dt != DType::Bool) o.arith("mixed f64", a * input(DType::Float64, {10}, 27));
    });
  }
}

// clamp with a double bound promotes integers to float32 (PyTorch's scalar rule).
TEST_F(OpExtrasDiff, ClampBothSidesAndOneSided) {
  for (DType dt : kNumericDTypes) {
    SCOPED_TRACE(str(dt, {}));
    expect_same([&](Outs& o) {
      std::vector<double> v = host_values(dt, 40, 21, -3, 3);
      if (is_floating(dt)) {
        v[3] = kNaN;
        v[5] = kInf;
        v[6] = -kInf;
      }
      Tensor x = from_values(dt, {5, 8}, v);
      o.exact("clamp", clamp(x, -1.0, 1.0));
      o.exact("clamp lo", clamp(x, -0.25, std::nullopt));
      o.exact("clamp hi", clamp(x, std::nullopt, 0.5));
      o.exact("clamp empty range", clamp(x, 1.0, -1.0));
      o.exact("clamp t", clamp(transpose(x, 0, 1), 0.0, 2.0));
    });
  }
}
std::vector<double> float_edge_values() {
  return {0,
          -0.0,
          0.5,
          -0.5,
          1,
          -1,
          1.5,
          2.5,
          -2.5,
          -2.7,
          3.99,
          100,
          -100,
          255.5,
          1e5,
          65504,
          65520,
          -7e4,
          1e10,
          -1e10,
          3e9,
          -3e9,
          1e20,
          -1e20,
          1e-8,
          -1e-30,
          6e-5,
          1e-46,
          3e38,
          1e39,
          -1e300,
          1 + 0x1p-11 + 0x1p-40,
          1 + 0x1p-8 + 0x1p-40,
          -(1 + 0x1p-11 + 0x1p-40),
          kNaN,
          kInf,
          -kInf,
          0.1,
          1.0 / 3};
}
std::vector<int64_t> int_edge_values() {
  return {0,
          1,
          -1,
          2,
          -2,
          127,
          255,
          256,
          -129,
          65504,
          65505,
          (int64_t{1} << 24) + 1,
          (int64_t{1} << 31) - 1,
          -(int64_t{1} << 31),
          int64_t{1} << 31,
          (int64_t{1} << 40) + 1,
          -((int64_t{1} << 53) + 1),
          int64_t{1} << 62,
          std::numeric_limits<int64_t>::min(),
          std::numeric_limits<int64_t>::max()};
}

Tensor edge_source(DType dt) {
  if (is_floating(dt)) {
    std::vector<double> v = float_edge_values();
    for (double& x : v) x = representable(dt, x);
    return from_values(dt, {static_cast<int64_t>(v.size())}, v);
  }
  if (dt == DType::Bool) return from_values(dt, {4}, {0, 1, 1, 0});
  std::vector<int64_t> v = int_edge_values();
  return from_ints(dt, {static_cast<int64_t>(v.size())}, v);
}

// Conversions are defined exactly (round to nearest even, truncate and saturate, wrap,
// != 0), so every pair must match bit for bit.
TEST_F(OpExtrasDiff, EveryPairOfDTypesIsExact) {
  for (DType from : kAllDTypes) {
    SCOPED_TRACE(str(from, {}));
    expect_same([&](Outs& o) {
      Tensor x = edge_source(from);
      Tensor grid = input(from, {37, 129}, 22, -300, 300);
      for (DType dst : kAllDTypes) {
        std::ostringstream name;
        name << "to " << dst;
        o.exact(name.str(), to(x, dst));
        o.exact(name.str() + " large", to(grid, dst));
        o.exact(name.str() + " transposed", to(transpose(grid, 0, 1), dst));
        o.exact(name.str() + " 0-d", to(input(from, {}, 23, -9, 9), dst));
        o.exact(name.str() + " empty", to(input(from, {2, 0, 3}, 24), dst));
        o.exact(name.str() + " round trip", to(to(x, dst), from));
      }
    });
  }
}

TEST_F(OpExtrasDiff, ZeroSizeTensors) {
  for (DType dt : kNumericDTypes) {
    SCOPED_TRACE(str(dt, {}));
    expect_same([&](Outs& o) {
      Tensor e = input(dt, {0}, 34), e3 = input(dt, {2, 0, 3}, 35);
      o.arith("add", e + e);
      o.trans("exp", exp(e3));
      o.arith("bcast", e3 * input(dt, {3}, 36));
      o.exact("sum all", sum(e));                 // 0
      o.exact("sum dim", sum(e3, {1}));           // zeros [2, 3]
      o.exact("sum keep", sum(e3, {1}, true));    // zeros [2, 1, 3]
      o.exact("sum other", sum(e3, {0, 2}));      // [0]
      o.exact("max nonempty dim", max(e3, {0}));  // [0, 3]
      o.exact("min nonempty dim", min(e3, {2}, true));
      o.exact("argmax nonempty dim", argmax(e3, 2));
      o.exact("reshape", reshape(e3, {3, 0}));
      o.exact("permute", permute(e3, {2, 1, 0}));
      o.exact("cat", cat({e3, input(dt, {2, 4, 3}, 37)}, 1));
      o.exact("slice", slice(input(dt, {5}, 38), 0, 3, 3));
      if (is_floating(dt)) {
        o.exact("mean empty", mean(e));  // 0 / 0 = nan
        o.arith("mean dim", mean(e3, {0}));
        o.exact("softmax", softmax(e3, 2));
        o.exact("matmul K=0", matmul(input(dt, {3, 0}, 39), input(dt, {0, 4}, 40)));
      }
    });
  }
}

TEST_F(OpExtrasDiff, ZeroDimTensors) {
  for (DType dt : kNumericDTypes) {
    SCOPED_TRACE(str(dt, {}));
    expect_same([&](Outs& o) {
      Tensor a = input(dt, {}, 41, -3, 3), b = input(dt, {}, 42, 0.5, 3);
      o.arith("add", a + b);
      o.arith("div", a / b);
      o.trans("exp", exp(a));
      o.trans("sigmoid", sigmoid(a));
      o.exact("lt", a < b);
      o.exact("sum", sum(a));
      o.exact("max", max(a));
      o.exact("argmax", argmax(a));
      o.exact("argmax dim", argmax(a, 0, true));
      o.exact("reshape", reshape(a, {1, 1}));
      o.exact("unsqueeze", unsqueeze(a, 0));
      o.exact("expand", expand(a, {2, 3}));
      o.exact("index_select", index_select(a, 0, from_ints(DType::Int64, {}, {0})));
      o.exact("gather", gather(a, 0, from_ints(DType::Int32, {}, {0})));
      o.arith("0-d with 1-d", a * input(dt, {4}, 43));
      if (is_floating(dt)) {
        o.exact("mean", mean(a));
        o.exact("softmax", softmax(a, 0));
        o.exact("log_softmax", log_softmax(a, -1));
      }
    });
  }
}

TEST_F(OpExtrasDiff, LayerNormWithAndWithoutAffine) {
  for (DType dt : kFloatDTypes) {
    SCOPED_TRACE(str(dt, {}));
    expect_same([&](Outs& o) {
      Tensor x = input(dt, {4, 6, 8}, 54, -3, 3);
      Tensor w8 = input(dt, {8}, 55, 0.5, 2), b8 = input(dt, {8}, 56);
      Tensor w68 = input(dt, {6, 8}, 57, 0.5, 2), b68 = input(dt, {6, 8}, 58);
      o.normalized("plain", layer_norm(x, {8}), 8);
      o.normalized("affine", layer_norm(x, {8}, w8, b8), 8);
      o.normalized("weight only", layer_norm(x, {8}, w8), 8);
      o.normalized("bias only", layer_norm(x, {8}, Tensor(), b8), 8);
      o.normalized("two dims", layer_norm(x, {6, 8}, w68, b68, 1e-3), 48);
      o.normalized("all dims", layer_norm(x, {4, 6, 8}), 192);
      o.normalized("transposed input", layer_norm(transpose(x, 1, 2), {6}), 6);
      // Rows far from zero cancel in x - mean; in bf16/f16 the result then hinges on the
      // rounding of each intermediate, so only the wide types are compared there.
      if (dt == DType::Float32 || dt == DType::Float64)
        o.normalized("offset rows", layer_norm(x + 100, {8}), 8);
    });
  }
}

// layer_norm over the last dim at sizes across vector widths
TEST_F(OpExtrasDiff, LayerNormLargeSizes) {
  for (DType dt : kFloatDTypes) {
    for (const Shape& s : {Shape{4097}, Shape{37, 129}}) {
      SCOPED_TRACE(str(dt, s));
      expect_same([&](Outs& o) {
        o.normalized("layer_norm", layer_norm(input(dt, s, 44, -3, 3), {s.back()}), s.back());
      });
    }
  }
}

// Each product is a sum of K terms; the tolerance scales with |a| @ |b| in float64.
void check_matmul(Outs& o, const std::string& name, const Tensor& a, const Tensor& b) {
  Tensor c = matmul(a, b);
  const int64_t k = a.shape().back();
  if (is_floating(c.dtype()))
    o.reduced(name, c, k, matmul(mag(a), mag(b)));
  else
    o.exact(name, c);
}

// One tensor on both sides (a gram matrix), and operands of two dtypes (promoted first).
TEST_F(OpExtrasDiff, MatmulGramAndMixedDTypes) {
  for (DType dt : kNumericDTypes) {
    SCOPED_TRACE(str(dt, {}));
    expect_same([&](Outs& o) {
      Tensor g = input(dt, {5, 3}, 80, -3, 3);
      check_matmul(o, "gram", transpose(g, 0, 1), g);
    });
  }
  // Operands of two dtypes are refused, as torch (no promotion in matmul).
  EXPECT_THROW(matmul(input(DType::Int32, {3, 4}, 90, -3, 3), input(DType::Float32, {4, 2}, 91)),
               DTypeError);
  EXPECT_THROW(matmul(input(DType::BFloat16, {3, 4}, 92), input(DType::Float16, {4, 2}, 93)),
               DTypeError);
}

// The layout ops' argument forms that the rows do not spell, pieces of mixed dtypes, and
// chains of layout ops that force a copy before arithmetic.
TEST_F(OpExtrasDiff, LayoutArgumentFormsAndChains) {
  for (DType dt : kAllDTypes) {
    SCOPED_TRACE(str(dt, {}));
    expect_same([&](Outs& o) {
      Tensor x = input(dt, {2, 3, 4}, 100, -9, 9);
      o.exact("reshape -1", reshape(x, {-1}));
      o.exact("transpose last", transpose(x, -1, -2));
      o.exact("unsqueeze 0", unsqueeze(x, 0));
      o.exact("unsqueeze mid", unsqueeze(x, 2));
      o.exact("squeeze no-op", squeeze(x, 1));
      o.exact("flatten", flatten(x));
      o.exact("flatten 0 1", flatten(x, 0, 1));
      o.exact("expand -1", expand(input(dt, {1, 4}, 106), {5, -1}));
      o.exact("expand to 0", expand(input(dt, {1, 3}, 108), {0, 3}));
      Tensor y = input(dt, {2, 3, 4}, 109, -9, 9);
      o.exact("cat 0", cat({x, y}, 0));
      o.exact("cat mixed", cat({x, input(DType::Float32, {2, 3, 4}, 112)}, 0));
      o.exact("cat single", cat({x}, 2));
      o.exact("stack 0", stack({x, y}, 0));
      o.exact("stack -1", stack({x, y}, -1));
      o.exact("slice step 3", slice(x, 2, 1, 4, 3));
      o.exact("slice neg", slice(x, 1, -2, 100));
      o.exact("slice empty", slice(x, 0, 5, 10));
      o.exact("slice big step", slice(x, 2, 0, 4, 5));
      o.exact("operator[]", x[1]);
      o.exact("permute reshape", reshape(permute(x, {2, 0, 1}), {4, 6}));
      o.exact("slice transpose flatten", flatten(transpose(slice(x, 2, 1, 4, 2), 0, 2)));
      o.exact("expand permute", permute(expand(input(dt, {3, 1}, 115), {2, 3, 4}), {2, 1, 0}));
      o.exact("slice of transpose of slice", slice(transpose(slice(x, 0, 1, 2), 0, 1), 1, 0, 1, 2));
      if (dt != DType::Bool) o.arith("chain + 1", reshape(permute(x, {1, 2, 0}), {12, 2}) + 1);
      if (dt != DType::Bool) {
        Tensor ex = expand(input(dt, {4, 1, 5}, 30, -3, 3), {4, 6, 5});
        o.reduced("sum expand keepdim", sum(ex, {1}, true), 6, sum(mag(ex), {1}, true));
      }
    });
  }
}
TEST_F(OpExtrasDiff, IndexSelectGatherEmbeddingInEveryDType) {
  for (DType dt : kAllDTypes) {
    for (DType it : {DType::Int32, DType::Int64}) {
      SCOPED_TRACE(str(dt, {}) + " indices " + std::string(name(it)));
      expect_same([&](Outs& o) {
        Tensor x = input(dt, {5, 6, 4}, 120, -9, 9);
        o.exact("index_select 0", index_select(x, 0, from_ints(it, {4}, {4, 0, 4, 2})));
        o.exact("index_select 1", index_select(x, 1, indices(it, {9}, 6, 121)));
        o.exact("index_select -1", index_select(x, -1, from_ints(it, {2}, {3, 3})));
        o.exact("index_select empty", index_select(x, 1, from_ints(it, {0}, {})));
        o.exact("index_select 0-d idx", index_select(x, 0, from_ints(it, {}, {2})));
        o.exact("index_select transposed",
                index_select(transpose(x, 0, 2), 0, from_ints(it, {3}, {1, 0, 3})));
        Tensor x2 = input(dt, {3, 4}, 122, -9, 9);
        o.exact("gather 1", gather(x2, 1, indices(it, {3, 6}, 4, 123)));
        o.exact("gather 0", gather(x2, 0, indices(it, {2, 4}, 3, 124)));
        o.exact("gather smaller", gather(x2, 1, from_ints(it, {2, 1}, {2, 0})));
        o.exact("gather 3-d", gather(x, 1, indices(it, {5, 2, 4}, 6, 125)));
        o.exact("gather -1", gather(x, -1, indices(it, {4, 6, 7}, 4, 126)));
        o.exact("gather empty", gather(x2, 1, from_ints(it, {0, 4}, {})));
        Tensor table = input(dt, {10, 4}, 127, -9, 9);
        o.exact("embedding", embedding(indices(it, {2, 3}, 10, 128), table));
        o.exact("embedding 1-d", embedding(from_ints(it, {5}, {9, 0, 9, 1, 2}), table));
        o.exact("embedding 0-d", embedding(from_ints(it, {}, {7}), table));
      });
    }
  }
}

// An index out of range is a run-time ExecError on every backend, never an out-of-bounds read.
TEST_F(OpExtrasDiff, OutOfRangeIndexIsAnExecErrorOnBothBackends) {
  for (const std::string& backend : {std::string("ref"), other_backend()}) {
    SCOPED_TRACE(backend);
    runtime::set_backend(backend);
    Tensor x = input(DType::Float32, {3, 4}, 129);
    EXPECT_THROW(index_select(x, 0, from_ints(DType::Int64, {2}, {0, 3})).to_vector<double>(),
                 ExecError);
    EXPECT_THROW(index_select(x, 1, from_ints(DType::Int32, {1}, {-1})).to_vector<double>(),
                 ExecError);
    EXPECT_THROW(gather(x, 1, from_ints(DType::Int32, {3, 1}, {0, 4, 0})).to_vector<double>(),
                 ExecError);
    EXPECT_THROW(embedding(from_ints(DType::Int64, {2}, {1, 10}), x).to_vector<double>(),
                 ExecError);
    sync();
    // a good program still runs afterwards
    EXPECT_EQ(index_select(x, 0, from_ints(DType::Int64, {1}, {2})).to_vector<double>(),
              slice(x, 0, 2, 3).to_vector<double>());
  }
}

// Same seed, same numbers on every backend, bit for bit, for other seeds than the rows' (a
// seed of 2^40 + 7 uses the key's high word), and through arithmetic and layout ops.
TEST_F(OpExtrasDiff, RandAndRandnAreBitExactForEverySeed) {
  for (uint64_t seed : {uint64_t{0}, uint64_t{42}, (uint64_t{1} << 40) + 7}) {
    for (DType dt : kFloatDTypes) {
      SCOPED_TRACE(str(dt, {}) + " seed " + std::to_string(seed));
      expect_same(
          [&](Outs& o) {
            o.exact("rand", rand({4097}, dt));
            o.exact("randn", randn({37, 129}, dt));
            Tensor u = rand({7, 9}, dt);
            o.arith("rand * 2 - 1", u * 2 - 1);
            o.exact("rand transposed", transpose(u, 0, 1));
            Tensor r = randn({1000}, dt);
            o.reduced("randn sum", sum(r), 1000, sum(mag(r)));
          },
          seed);
    }
  }
}

// A second dropout draws a new key offset (another mask), on both backends alike; dropout
// of a computed tensor and in eval mode.
TEST_F(OpExtrasDiff, DropoutDrawsInSequence) {
  for (DType dt : kFloatDTypes) {
    SCOPED_TRACE(str(dt, {}));
    expect_same([&](Outs& o) {
      Tensor x = input(dt, {4097}, 130), m = input(dt, {37, 129}, 131);
      auto check = [&](const std::string& n, Tensor t) {
        // x * (1 / (1 - p)) rounds once: exact for float32 and float64
        if (dt == DType::Float32 || dt == DType::Float64)
          o.exact(n, std::move(t));
        else
          o.arith(n, std::move(t));
      };
      check("p 0.3", dropout(x, 0.3));
      check("second draw", dropout(x, 0.3));
      check("eval", dropout(x, 0.3, false));
      check("of relu", dropout(relu(m), 0.2));
    });
  }
}

TEST_F(OpExtrasDiff, FactoryFormsAndInPlaceOps) {
  for (DType dt : kAllDTypes) {
    SCOPED_TRACE(str(dt, {}));
    expect_same([&](Outs& o) {
      o.exact("full 0-d", full({}, -2, dt));
      if (dt != DType::Bool) {
        o.exact("arange", arange(0, 10, dt));
        o.exact("arange frac", arange(-2.5, 3, dt));
        o.exact("arange empty", arange(3, 3, dt));
      }
      Tensor t = input(dt, {3, 4}, 140, -9, 9);
      Tensor c = zeros({3, 4}, dt);
      c.copy_(input(DType::Float64, {4}, 141, -9, 9));  // broadcast and convert
      o.exact("copy_", c);
      if (dt != DType::Bool) {
        Tensor a = input(dt, {3, 4}, 142, -9, 9);
        a.add_(t);
        o.arith("add_", a);
      }
      Tensor z = input(dt, {3, 4}, 143);
      z.zero_();
      o.exact("zero_", z);
      o.exact("detach", t.detach());
    });
  }
}

}  // namespace
}  // namespace loom::difftest
