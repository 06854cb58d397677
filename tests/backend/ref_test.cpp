// Tests of the reference backend, part 1: the kernel registry, the executable's contract
// (fresh outputs, input checks, dead-node skipping, threads), sources, elementwise ops and
// conversions. Expected values are closed forms computed here with std:: functions.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <thread>

#include "backend/ref/ref_impl.h"
#include "backend/ref_test_util.h"
#include "loom/core/error.h"

namespace loom::reftest {
namespace {

using ir::OpKind;
using ir::Value;

TEST(RefRegistry, EveryOpHasAKernel) {
  for (int i = 0; i < ir::kNumOps; ++i) {
    const auto op = static_cast<OpKind>(i);
    const bool found = ir::several_results(op) ? detail::ref::find_region_kernel(op) != nullptr
                                               : detail::ref::find_kernel(op) != nullptr;
    EXPECT_TRUE(found) << "no reference kernel for " << ir::kOpInfo[i].name;
  }
}

TEST(RefExecutable, OutputsAreFreshCopies) {
  Case c;
  Value x = c.param(DType::Float32, {3}, {1, 2, 3});
  auto exe = c.compile({x, x});
  std::vector<Buffer> out = exe->run(c.inputs);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_NE(out[0].id(), c.inputs[0].id());
  EXPECT_NE(out[1].id(), c.inputs[0].id());
  EXPECT_NE(out[0].id(), out[1].id());
  out[0].as<float>()[0] = 42;  // writing an output touches neither the input nor the other output
  EXPECT_EQ(c.inputs[0].as<float>()[0], 1.0f);
  EXPECT_EQ(out[1].as<float>()[0], 1.0f);
  EXPECT_EQ(decode_floats(DType::Float32, out[1]), (std::vector<double>{1, 2, 3}));
}

TEST(RefExecutable, SameComputedValueTwiceGivesTwoBuffers) {
  Case c;
  Value y = c.b.unary(OpKind::Neg, c.param(DType::Int32, {2}, {1, -2}));
  std::vector<Buffer> out = c.run({y, y});
  EXPECT_NE(out[0].id(), out[1].id());
  EXPECT_EQ(decode_ints(DType::Int32, out[0]), (std::vector<int64_t>{-1, 2}));
  EXPECT_EQ(decode_ints(DType::Int32, out[1]), (std::vector<int64_t>{-1, 2}));
}

TEST(RefExecutable, SkipsDeadNodesAndCountsKernels) {
  Case c;
  Value x = c.param(DType::Float32, {2}, {1, 2});
  Value dead = c.b.unary(OpKind::Exp, x);
  (void)dead;
  Value y = c.b.unary(OpKind::Neg, x);
  Value z = c.b.binary(OpKind::Add, y, y);
  auto exe = c.compile({z});
  EXPECT_EQ(exe->num_kernels(), 2);  // neg and add; exp is dead, the parameter is bound
  EXPECT_EQ(decode_floats(DType::Float32, exe->run(c.inputs)[0]), (std::vector<double>{-2, -4}));
}

TEST(RefExecutable, ChecksInputs) {
  Case c;
  Value x = c.param(DType::Float32, {4}, {1, 2, 3, 4});
  auto exe = c.compile({x});
  EXPECT_THROW(exe->run({}), ExecError);
  std::vector<Buffer> small{Buffer::allocate(8)};
  EXPECT_THROW(exe->run(small), ExecError);
}

TEST(RefExecutable, RunsConcurrently) {
  Case c;
  Value x = c.param(DType::Float64, {64}, std::vector<double>(64, 0.5));
  Value y = c.b.reduce(OpKind::ReduceSum, c.b.unary(OpKind::Exp, x), {0}, false);
  auto exe = c.compile({y});
  std::vector<double> results(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < 20; ++k)
        results[t] = decode_floats(DType::Float64, exe->run(c.inputs)[0])[0];
    });
  }
  for (auto& th : threads) th.join();
  double want = 0;
  for (int i = 0; i < 64; ++i) want += std::exp(0.5);
  for (double r : results) EXPECT_EQ(r, want);
}

TEST(RefExecutable, ZeroSizeTensors) {
  Case c;
  Value x = c.param(DType::Float32, {0, 3}, {});
  Value y = c.param(DType::Float32, {3}, {1, 2, 3});
  Value z = c.b.binary(OpKind::Add, x, y);
  std::vector<Buffer> out = c.run({z, c.b.unary(OpKind::Exp, x)});
  EXPECT_EQ(out[0].nbytes(), 0u);
  EXPECT_EQ(out[1].nbytes(), 0u);
  EXPECT_EQ(c.g.type(z).shape, (Shape{0, 3}));
}

TEST(RefSource, ConstantFillsEveryElement) {
  for (DType dt : {DType::Float32, DType::Float64, DType::BFloat16, DType::Float16}) {
    Case c;
    Value k = c.b.expand(c.b.constant(-2.5, dt), {2, 3});
    expect_floats(dt, c.run_f(k), std::vector<double>(6, -2.5));
  }
  Case c;
  Value k = c.b.constant(-7, DType::Int64);
  EXPECT_EQ(c.run_i(k), (std::vector<int64_t>{-7}));
  Case cb;
  EXPECT_EQ(cb.run_i(cb.b.constant(1, DType::Bool)), (std::vector<int64_t>{1}));
  Case cinf;
  EXPECT_EQ(cinf.run_f(cinf.b.constant(-kInf, DType::Float32))[0], -kInf);
}

// The documented choice for integral constants: round to nearest (halves away from zero),
// saturate, NaN -> 0.
TEST(RefSource, IntegralConstantRoundsAndSaturates) {
  Case c;
  std::vector<Buffer> out =
      c.run({c.b.constant(2.5, DType::Int32), c.b.constant(-2.5, DType::Int32),
             c.b.constant(1e20, DType::Int64), c.b.constant(-1e20, DType::Int32),
             c.b.constant(kNaN, DType::Int32)});
  EXPECT_EQ(decode_ints(DType::Int32, out[0]), (std::vector<int64_t>{3}));
  EXPECT_EQ(decode_ints(DType::Int32, out[1]), (std::vector<int64_t>{-3}));
  EXPECT_EQ(decode_ints(DType::Int64, out[2]), (std::vector<int64_t>{kI64Max}));
  EXPECT_EQ(decode_ints(DType::Int32, out[3]), (std::vector<int64_t>{kI32Min}));
  EXPECT_EQ(decode_ints(DType::Int32, out[4]), (std::vector<int64_t>{0}));
}

TEST(RefSource, IotaCountsAlongItsAxis) {
  Case c;
  Value a = c.b.iota(TensorType{DType::Int32, {2, 3}}, 1);
  Value b = c.b.iota(TensorType{DType::Float32, {2, 3}}, 0);
  std::vector<Buffer> out = c.run({a, b});
  EXPECT_EQ(decode_ints(DType::Int32, out[0]), (std::vector<int64_t>{0, 1, 2, 0, 1, 2}));
  EXPECT_EQ(decode_floats(DType::Float32, out[1]), (std::vector<double>{0, 0, 0, 1, 1, 1}));
  Case d;
  EXPECT_EQ(d.run_i(d.b.iota(TensorType{DType::Int64, {}}, 0)), (std::vector<int64_t>{0}));
}

// Every float unary op against its std:: closed form, in every float dtype.
TEST(RefElementwise, FloatUnaryMatchesStd) {
  const std::vector<double> xs = {-2.5, -1, -0.5, 0, 0.25, 1, 3};
  struct Row {
    OpKind op;
    double (*f)(double);
  };
  const Row rows[] = {{OpKind::Neg, [](double x) { return -x; }},
                      {OpKind::Abs, [](double x) { return std::fabs(x); }},
                      {OpKind::Exp, [](double x) { return std::exp(x); }},
                      {OpKind::Log, [](double x) { return std::log(x); }},
                      {OpKind::Sqrt, [](double x) { return std::sqrt(x); }},
                      {OpKind::Tanh, [](double x) { return std::tanh(x); }},
                      {OpKind::Sin, [](double x) { return std::sin(x); }},
                      {OpKind::Cos, [](double x) { return std::cos(x); }},
                      {OpKind::Erf, [](double x) { return std::erf(x); }}};
  for (DType dt : kFloatTypes) {
    for (const Row& r : rows) {
      SCOPED_TRACE(::testing::Message() << ir::op_name(r.op) << " " << dt);
      Case c;
      Value y = c.b.unary(r.op, c.param(dt, {7}, xs));
      std::vector<double> want;
      for (double x : xs) want.push_back(r.f(x));
      expect_floats(dt, c.run_f(y), want);
    }
  }
}

TEST(RefElementwise, FloatUnarySpecialValues) {
  Case c;
  Value x = c.param(DType::Float32, {5}, {kNaN, kInf, -kInf, 0, -1});
  std::vector<Buffer> out = c.run({c.b.unary(OpKind::Exp, x), c.b.unary(OpKind::Log, x),
                                   c.b.unary(OpKind::Sqrt, x), c.b.unary(OpKind::Tanh, x)});
  expect_floats(DType::Float32, decode_floats(DType::Float32, out[0]),
                {kNaN, kInf, 0, 1, std::exp(-1.0)});
  expect_floats(DType::Float32, decode_floats(DType::Float32, out[1]),
                {kNaN, kInf, kNaN, -kInf, kNaN});
  expect_floats(DType::Float32, decode_floats(DType::Float32, out[2]), {kNaN, kInf, kNaN, 0, kNaN});
  expect_floats(DType::Float32, decode_floats(DType::Float32, out[3]),
                {kNaN, 1, -1, 0, std::tanh(-1.0)});
}

TEST(RefElementwise, IntUnaryWraps) {
  Case c;
  Value x = c.param_i(DType::Int32, {4}, {kI32Min, -3, 0, kI32Max});
  std::vector<Buffer> out = c.run({c.b.unary(OpKind::Neg, x), c.b.unary(OpKind::Abs, x)});
  EXPECT_EQ(decode_ints(DType::Int32, out[0]), (std::vector<int64_t>{kI32Min, 3, 0, -kI32Max}));
  EXPECT_EQ(decode_ints(DType::Int32, out[1]), (std::vector<int64_t>{kI32Min, 3, 0, kI32Max}));
  Case d;
  Value y = d.param_i(DType::Int64, {3}, {kI64Min, -5, kI64Max});
  std::vector<Buffer> out64 = d.run({d.b.unary(OpKind::Neg, y), d.b.unary(OpKind::Abs, y)});
  EXPECT_EQ(decode_ints(DType::Int64, out64[0]), (std::vector<int64_t>{kI64Min, 5, -kI64Max}));
  EXPECT_EQ(decode_ints(DType::Int64, out64[1]), (std::vector<int64_t>{kI64Min, 5, kI64Max}));
}

TEST(RefElementwise, BoolLogic) {
  Case c;
  Value a = c.param_i(DType::Bool, {4}, {0, 0, 1, 1});
  Value b = c.param_i(DType::Bool, {4}, {0, 1, 0, 1});
  std::vector<Buffer> out = c.run(
      {c.b.binary(OpKind::And, a, b), c.b.binary(OpKind::Or, a, b), c.b.unary(OpKind::Not, a)});
  EXPECT_EQ(decode_ints(DType::Bool, out[0]), (std::vector<int64_t>{0, 0, 0, 1}));
  EXPECT_EQ(decode_ints(DType::Bool, out[1]), (std::vector<int64_t>{0, 1, 1, 1}));
  EXPECT_EQ(decode_ints(DType::Bool, out[2]), (std::vector<int64_t>{1, 1, 0, 0}));
}

// a: [2,1], b: [3] broadcast to [2,3]; every float binary op against its closed form.
TEST(RefElementwise, FloatBinaryBroadcasts) {
  const std::vector<double> av = {1.5, -2}, bv = {0.5, 2, -3};
  struct Row {
    OpKind op;
    double (*f)(double, double);
  };
  const Row rows[] = {{OpKind::Add, [](double a, double b) { return a + b; }},
                      {OpKind::Sub, [](double a, double b) { return a - b; }},
                      {OpKind::Mul, [](double a, double b) { return a * b; }},
                      {OpKind::Div, [](double a, double b) { return a / b; }},
                      {OpKind::Pow, [](double a, double b) { return std::pow(a, b); }},
                      {OpKind::Maximum, [](double a, double b) { return a > b ? a : b; }},
                      {OpKind::Minimum, [](double a, double b) { return a < b ? a : b; }}};
  for (DType dt : kFloatTypes) {
    for (const Row& r : rows) {
      SCOPED_TRACE(::testing::Message() << ir::op_name(r.op) << " " << dt);
      Case c;
      Value y = c.b.binary(r.op, c.param(dt, {2, 1}, av), c.param(dt, {3}, bv));
      ASSERT_EQ(c.g.type(y).shape, (Shape{2, 3}));
      std::vector<double> want;
      for (double a : av) {
        for (double b : bv) want.push_back(r.f(a, b));
      }
      expect_floats(dt, c.run_f(y), want);
    }
  }
}

TEST(RefElementwise, ScalarBroadcastsAgainstMatrix) {
  Case c;
  Value s = c.param(DType::Float64, {}, {10});
  Value m = c.param(DType::Float64, {2, 2}, {1, 2, 3, 4});
  EXPECT_EQ(c.run_f(c.b.binary(OpKind::Sub, s, m)), (std::vector<double>{9, 8, 7, 6}));
}

TEST(RefElementwise, NaNAndInfinity) {
  Case c;
  Value a = c.param(DType::Float32, {5}, {kNaN, 1, 1, -1, 0});
  Value b = c.param(DType::Float32, {5}, {1, kNaN, 0, 0, 0});
  std::vector<Buffer> out =
      c.run({c.b.binary(OpKind::Maximum, a, b), c.b.binary(OpKind::Minimum, a, b),
             c.b.binary(OpKind::Div, a, b)});
  expect_floats(DType::Float32, decode_floats(DType::Float32, out[0]), {kNaN, kNaN, 1, 0, 0});
  expect_floats(DType::Float32, decode_floats(DType::Float32, out[1]), {kNaN, kNaN, 0, -1, 0});
  expect_floats(DType::Float32, decode_floats(DType::Float32, out[2]),
                {kNaN, kNaN, kInf, -kInf, kNaN});
}

TEST(RefElementwise, IntArithmeticWraps) {
  Case c;
  Value a = c.param_i(DType::Int32, {3}, {kI32Max, kI32Min, 65536});
  Value b = c.param_i(DType::Int32, {3}, {1, 1, 65536});
  std::vector<Buffer> out = c.run({c.b.binary(OpKind::Add, a, b), c.b.binary(OpKind::Sub, a, b),
                                   c.b.binary(OpKind::Mul, a, b)});
  EXPECT_EQ(decode_ints(DType::Int32, out[0]),
            (std::vector<int64_t>{kI32Min, kI32Min + 1, 131072}));
  EXPECT_EQ(decode_ints(DType::Int32, out[1]), (std::vector<int64_t>{kI32Max - 1, kI32Max, 0}));
  EXPECT_EQ(decode_ints(DType::Int32, out[2]), (std::vector<int64_t>{kI32Max, kI32Min, 0}));
  Case d;
  Value x = d.param_i(DType::Int64, {2}, {kI64Max, kI64Min});
  Value y = d.param_i(DType::Int64, {2}, {1, -1});
  std::vector<Buffer> o = d.run({d.b.binary(OpKind::Add, x, y), d.b.binary(OpKind::Mul, x, y)});
  EXPECT_EQ(decode_ints(DType::Int64, o[0]), (std::vector<int64_t>{kI64Min, kI64Max}));
  EXPECT_EQ(decode_ints(DType::Int64, o[1]), (std::vector<int64_t>{kI64Max, kI64Min}));
}

TEST(RefElementwise, IntDivisionTruncatesAndNeverTraps) {
  for (DType dt : kIntTypes) {
    const int64_t lo = dt == DType::Int32 ? kI32Min : kI64Min;
    Case c;
    Value a = c.param_i(dt, {8}, {7, -7, 7, -7, 5, 0, lo, lo});
    Value b = c.param_i(dt, {8}, {2, 2, -2, -2, 0, 0, -1, 1});
    EXPECT_EQ(c.run_i(c.b.binary(OpKind::Div, a, b)),
              (std::vector<int64_t>{3, -3, -3, 3, 0, 0, lo, lo}))
        << dt;
  }
}

// Repeated multiplication in uint64 is the oracle for the backend's repeated squaring.
int64_t slow_pow(int64_t base, int64_t e) {
  uint64_t r = 1;
  for (int64_t i = 0; i < e; ++i) r *= static_cast<uint64_t>(base);
  return static_cast<int64_t>(r);
}

TEST(RefElementwise, IntPow) {
  Case c;
  const std::vector<int64_t> base = {2, 3, 0, -2, 2, 1, -1, -1, 0, 3, 2, -3};
  const std::vector<int64_t> expo = {10, 0, 0, 3, -1, -5, -3, -4, -2, 40, 64, 41};
  Value y = c.b.binary(OpKind::Pow, c.param_i(DType::Int64, {12}, base),
                       c.param_i(DType::Int64, {12}, expo));
  std::vector<int64_t> want = {
      1024, 1, 1, -8, 0, 1, -1, 1, 0, slow_pow(3, 40), 0, slow_pow(-3, 41)};
  EXPECT_EQ(c.run_i(y), want);
  Case d;  // i32 wraps modulo 2^32
  Value z = d.b.binary(OpKind::Pow, d.param_i(DType::Int32, {3}, {2, 3, -7}),
                       d.param_i(DType::Int32, {3}, {31, 21, 13}));
  EXPECT_EQ(d.run_i(z), (std::vector<int64_t>{kI32Min, static_cast<int32_t>(slow_pow(3, 21)),
                                              static_cast<int32_t>(slow_pow(-7, 13))}));
}

TEST(RefElementwise, IntMaxMin) {
  Case c;
  Value a = c.param_i(DType::Int64, {3}, {kI64Min, 5, -1});
  Value b = c.param_i(DType::Int64, {3}, {kI64Max, 4, -1});
  std::vector<Buffer> out =
      c.run({c.b.binary(OpKind::Maximum, a, b), c.b.binary(OpKind::Minimum, a, b)});
  EXPECT_EQ(decode_ints(DType::Int64, out[0]), (std::vector<int64_t>{kI64Max, 5, -1}));
  EXPECT_EQ(decode_ints(DType::Int64, out[1]), (std::vector<int64_t>{kI64Min, 4, -1}));
}

TEST(RefElementwise, ComparisonsWithNaN) {
  Case c;
  Value a = c.param(DType::Float32, {4}, {kNaN, 1, 1, 2});
  Value b = c.param(DType::Float32, {4}, {kNaN, kNaN, 1, 1});
  const OpKind ops[] = {OpKind::Eq, OpKind::Ne, OpKind::Lt, OpKind::Le, OpKind::Gt, OpKind::Ge};
  std::vector<Value> outs;
  for (OpKind op : ops) outs.push_back(c.b.binary(op, a, b));
  std::vector<Buffer> out = c.run(outs);
  const std::vector<std::vector<int64_t>> want = {{0, 0, 1, 0}, {1, 1, 0, 1}, {0, 0, 0, 0},
                                                  {0, 0, 1, 0}, {0, 0, 0, 1}, {0, 0, 1, 1}};
  for (size_t i = 0; i < outs.size(); ++i) {
    EXPECT_EQ(c.g.type(outs[i]).dtype, DType::Bool);
    EXPECT_EQ(decode_ints(DType::Bool, out[i]), want[i]) << ir::op_name(ops[i]);
  }
}

// 2^53 and 2^53 + 1 are one double; int64 comparisons must not go through double.
TEST(RefElementwise, Int64ComparisonsAreExact) {
  Case c;
  const int64_t big = int64_t{1} << 53;
  Value a = c.param_i(DType::Int64, {2}, {big, big + 1});
  Value b = c.param_i(DType::Int64, {1}, {big + 1});
  std::vector<Buffer> out = c.run({c.b.binary(OpKind::Eq, a, b), c.b.binary(OpKind::Lt, a, b)});
  EXPECT_EQ(decode_ints(DType::Bool, out[0]), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(decode_ints(DType::Bool, out[1]), (std::vector<int64_t>{1, 0}));
}

TEST(RefElementwise, WhereBroadcastsAllThree) {
  Case c;
  Value cond = c.param_i(DType::Bool, {2, 1}, {1, 0});
  Value a = c.param(DType::Float32, {3}, {1, 2, 3});
  Value b = c.param(DType::Float32, {}, {-1});
  Value y = c.b.where(cond, a, b);
  ASSERT_EQ(c.g.type(y).shape, (Shape{2, 3}));
  EXPECT_EQ(c.run_f(y), (std::vector<double>{1, 2, 3, -1, -1, -1}));
}

TEST(RefConvert, FloatToIntTruncatesSaturatesAndZeroesNaN) {
  Case c;
  Value x = c.param(DType::Float32, {8}, {1.9, -1.9, kNaN, 1e10, -1e10, kInf, -kInf, 0.5});
  EXPECT_EQ(c.run_i(c.b.convert(x, DType::Int32)),
            (std::vector<int64_t>{1, -1, 0, kI32Max, kI32Min, kI32Max, kI32Min, 0}));
  Case d;
  const double below_2_63 = 9223372036854774784.0;  // the largest double under 2^63
  Value y = d.param(DType::Float64, {4}, {1e19, -1e19, below_2_63, -9223372036854775808.0});
  EXPECT_EQ(d.run_i(d.b.convert(y, DType::Int64)),
            (std::vector<int64_t>{kI64Max, kI64Min, 9223372036854774784, kI64Min}));
}

TEST(RefConvert, ToAndFromBool) {
  Case c;
  Value x = c.param(DType::Float32, {5}, {0, -0.0, 0.1, kNaN, -3});
  EXPECT_EQ(c.run_i(c.b.convert(x, DType::Bool)), (std::vector<int64_t>{0, 0, 1, 1, 1}));
  Case d;
  Value i = d.param_i(DType::Int64, {3}, {0, int64_t{1} << 40, -1});
  EXPECT_EQ(d.run_i(d.b.convert(i, DType::Bool)), (std::vector<int64_t>{0, 1, 1}));
  Case e;
  Value bl = e.param_i(DType::Bool, {2}, {1, 0});
  std::vector<Buffer> out = e.run({e.b.convert(bl, DType::Float16), e.b.convert(bl, DType::Int32)});
  EXPECT_EQ(decode_floats(DType::Float16, out[0]), (std::vector<double>{1, 0}));
  EXPECT_EQ(decode_ints(DType::Int32, out[1]), (std::vector<int64_t>{1, 0}));
}

TEST(RefConvert, IntToIntWraps) {
  Case c;
  Value x = c.param_i(DType::Int64, {3}, {(int64_t{1} << 32) + 5, int64_t{1} << 31, -1});
  EXPECT_EQ(c.run_i(c.b.convert(x, DType::Int32)), (std::vector<int64_t>{5, kI32Min, -1}));
}

TEST(RefConvert, IntToFloatRoundsToNearestEven) {
  Case c;
  Value x = c.param_i(DType::Int64, {3}, {(1 << 24) + 1, (1 << 24) + 3, 65520});
  std::vector<Buffer> out = c.run({c.b.convert(x, DType::Float32), c.b.convert(x, DType::Float16)});
  EXPECT_EQ(decode_floats(DType::Float32, out[0]),
            (std::vector<double>{16777216, 16777220, 65520}));
  EXPECT_EQ(decode_floats(DType::Float16, out[1])[2], kInf);  // 65520 is float16's overflow tie
}

// 1 + 2^-8 + 2^-40 lies just above a bfloat16 tie; rounding through float first would land on
// the tie and round down to even. The backend must round once.
TEST(RefConvert, SixteenBitFloatsRoundOnce) {
  Case c;
  Value x = c.param(DType::Float64, {2}, {1 + 0x1p-8 + 0x1p-40, 1 + 0x1p-11 + 0x1p-40});
  std::vector<Buffer> out =
      c.run({c.b.convert(x, DType::BFloat16), c.b.convert(x, DType::Float16)});
  EXPECT_EQ(out[0].as<uint16_t>()[0], 0x3f81);
  EXPECT_EQ(out[1].as<uint16_t>()[1], 0x3c01);
  EXPECT_EQ(detail::ref::double_to_bf16(1 + 0x1p-8), 0x3f80);  // an exact tie goes to even
  EXPECT_EQ(detail::ref::double_to_f16(1 + 0x1p-11), 0x3c00);
  EXPECT_EQ(detail::ref::double_to_f16(-0x1p-25 - 0x1p-60), 0x8001);  // subnormal, sign kept
  EXPECT_EQ(detail::ref::double_to_bf16(1e300), 0x7f80);
  EXPECT_EQ(detail::ref::double_to_f16(-1e300), 0xfc00);
}

TEST(RefConvert, BetweenFloatTypes) {
  Case c;
  Value x = c.param(DType::Float32, {4}, {70000, 0x1p-24, kNaN, -kInf});
  std::vector<Buffer> out = c.run({c.b.convert(x, DType::Float16), c.b.convert(x, DType::Float64)});
  expect_floats(DType::Float16, decode_floats(DType::Float16, out[0]),
                {kInf, 0x1p-24, kNaN, -kInf});
  expect_floats(DType::Float64, decode_floats(DType::Float64, out[1]),
                {70000, 0x1p-24, kNaN, -kInf});
}

}  // namespace
}  // namespace loom::reftest
