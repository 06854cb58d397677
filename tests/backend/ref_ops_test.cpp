// Tests of the reference backend, part 2: reductions, argmax, matmul, layout ops, gather and
// index_select, and the random ops. Expected values are written out by hand or computed here
// with plain loops over the definitions in docs/ir.md.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "backend/ref_test_util.h"
#include "loom/core/error.h"
#include "loom/core/philox.h"

namespace loom::reftest {
namespace {

using ir::OpKind;
using ir::Value;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int64_t kI32Min = std::numeric_limits<int32_t>::min();
constexpr int64_t kI32Max = std::numeric_limits<int32_t>::max();

std::vector<double> iota_values(int64_t n, double start = 0) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = start + static_cast<double>(i);
  return v;
}

TEST(RefReduce, SumOverEachAxisInEveryDType) {
  for (DType dt : {DType::Float32, DType::Float64, DType::BFloat16, DType::Float16, DType::Int32,
                   DType::Int64}) {
    SCOPED_TRACE(::testing::Message() << dt);
    Case c;
    Value x = c.param(dt, {2, 3}, {1, 2, 3, 4, 5, 6});
    Value s0 = c.b.reduce(OpKind::ReduceSum, x, {0}, false);
    Value s1 = c.b.reduce(OpKind::ReduceSum, x, {1}, false);
    Value s01 = c.b.reduce(OpKind::ReduceSum, x, {0, 1}, true);
    EXPECT_EQ(c.g.type(s01).shape, (Shape{1, 1}));
    std::vector<Buffer> out = c.run({s0, s1, s01});
    EXPECT_EQ(decode_floats(dt, out[0]), (std::vector<double>{5, 7, 9}));
    EXPECT_EQ(decode_floats(dt, out[1]), (std::vector<double>{6, 15}));
    EXPECT_EQ(decode_floats(dt, out[2]), (std::vector<double>{21}));
  }
}

// x[i][j][k] = 12i + 4j + k over axes {0, 2}: out[j] = sum_i sum_k x, by a loop.
TEST(RefReduce, NonAdjacentAxesWithKeepdim) {
  Case c;
  Value x = c.param(DType::Float64, {2, 3, 4}, iota_values(24));
  Value y = c.b.reduce(OpKind::ReduceSum, x, {0, 2}, true);
  Value m = c.b.reduce(OpKind::ReduceMax, x, {0, 2}, false);
  ASSERT_EQ(c.g.type(y).shape, (Shape{1, 3, 1}));
  std::vector<double> want(3, 0), want_max(3, -kInf);
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) {
      for (int k = 0; k < 4; ++k) {
        want[j] += 12 * i + 4 * j + k;
        want_max[j] = std::max<double>(want_max[j], 12 * i + 4 * j + k);
      }
    }
  }
  std::vector<Buffer> out = c.run({y, m});
  EXPECT_EQ(decode_floats(DType::Float64, out[0]), want);
  EXPECT_EQ(decode_floats(DType::Float64, out[1]), want_max);
}

TEST(RefReduce, MaxMinPropagateNaN) {
  Case c;
  Value x = c.param(DType::Float32, {3, 3}, {1, kNaN, 3, 4, 5, 6, -1, -2, kNaN});
  std::vector<Buffer> out = c.run({c.b.reduce(OpKind::ReduceMax, x, {1}, false),
                                   c.b.reduce(OpKind::ReduceMin, x, {1}, false),
                                   c.b.reduce(OpKind::ReduceSum, x, {1}, false)});
  expect_floats(DType::Float32, decode_floats(DType::Float32, out[0]), {kNaN, 6, kNaN});
  expect_floats(DType::Float32, decode_floats(DType::Float32, out[1]), {kNaN, 4, kNaN});
  expect_floats(DType::Float32, decode_floats(DType::Float32, out[2]), {kNaN, 15, kNaN});
}

TEST(RefReduce, EmptyAxisGivesIdentity) {
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

TEST(RefReduce, IntSumWrapsAndScalarIsIdentity) {
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

TEST(RefArgMax, FirstMaximumAndFirstNaN) {
  Case c;
  Value x =
      c.param(DType::Float32, {3, 4}, {1, 3, 3, 2, 5, kNaN, 7, kNaN, -kInf, -kInf, -kInf, -kInf});
  Value a = c.b.argmax(x, 1, false);
  Value k = c.b.argmax(x, 1, true);
  EXPECT_EQ(c.g.type(a), (TensorType{DType::Int64, {3}}));
  EXPECT_EQ(c.g.type(k).shape, (Shape{3, 1}));
  std::vector<Buffer> out = c.run({a, k});
  EXPECT_EQ(decode_ints(DType::Int64, out[0]), (std::vector<int64_t>{1, 1, 0}));
  EXPECT_EQ(decode_ints(DType::Int64, out[1]), (std::vector<int64_t>{1, 1, 0}));
}

TEST(RefArgMax, AlongAxisZeroAndIntegers) {
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

// Plain-loop matmul with numpy batch broadcasting, the oracle for the batched cases.
std::vector<double> matmul_oracle(const std::vector<double>& a, const Shape& sa,
                                  const std::vector<double>& b, const Shape& sb, const Shape& so) {
  const int64_t m = sa[sa.size() - 2], k = sa.back(), n = sb.back();
  const int64_t batches = so.numel() / (m * n);
  const size_t r = so.size() - 2;
  std::vector<double> out;
  for (int64_t bi = 0; bi < batches; ++bi) {
    // Coordinates of batch bi in the output batch shape, mapped to each operand's batch.
    int64_t rem = bi, ia = 0, ib = 0, stride_a = 1, stride_b = 1;
    for (size_t d = r; d-- > 0;) {
      const int64_t c = rem % so[d];
      rem /= so[d];
      const int64_t off_a = static_cast<int64_t>(d) - static_cast<int64_t>(r - (sa.size() - 2));
      const int64_t off_b = static_cast<int64_t>(d) - static_cast<int64_t>(r - (sb.size() - 2));
      if (off_a >= 0) {
        ia += (sa[off_a] == 1 ? 0 : c) * stride_a;
        stride_a *= sa[off_a];
      }
      if (off_b >= 0) {
        ib += (sb[off_b] == 1 ? 0 : c) * stride_b;
        stride_b *= sb[off_b];
      }
    }
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t p = 0; p < k; ++p) acc += a[(ia * m + i) * k + p] * b[(ib * k + p) * n + j];
        out.push_back(acc);
      }
    }
  }
  return out;
}

TEST(RefMatMul, SmallMatricesByHand) {
  for (DType dt : {DType::Float32, DType::Float64, DType::BFloat16, DType::Float16, DType::Int32,
                   DType::Int64}) {
    Case c;
    Value a = c.param(dt, {2, 3}, {1, 2, 3, 4, 5, 6});
    Value b = c.param(dt, {3, 2}, {7, 8, 9, 10, 11, 12});
    EXPECT_EQ(c.run_f(c.b.matmul(a, b)), (std::vector<double>{58, 64, 139, 154})) << dt;
  }
}

TEST(RefMatMul, BatchBroadcast) {
  const Shape sa{2, 1, 2, 3}, sb{3, 3, 2};
  std::vector<double> av = iota_values(sa.numel(), -5), bv = iota_values(sb.numel(), -7);
  Case c;
  Value y = c.b.matmul(c.param(DType::Float64, sa, av), c.param(DType::Float64, sb, bv));
  const Shape so{2, 3, 2, 2};
  ASSERT_EQ(c.g.type(y).shape, so);
  EXPECT_EQ(c.run_f(y), matmul_oracle(av, sa, bv, sb, so));
}

TEST(RefMatMul, EmptyInnerDimensionGivesZeros) {
  Case c;
  Value y = c.b.matmul(c.param(DType::Float32, {2, 0}, {}), c.param(DType::Float32, {0, 3}, {}));
  EXPECT_EQ(c.run_f(y), std::vector<double>(6, 0));
  Case d;
  Value z = d.b.matmul(d.param(DType::Float32, {0, 2}, {}),
                       d.param(DType::Float32, {2, 3}, iota_values(6)));
  EXPECT_EQ(d.run_f(z), std::vector<double>{});
}

TEST(RefLayout, ReshapeKeepsRowMajorOrder) {
  Case c;
  Value x = c.param(DType::Int32, {2, 3}, iota_values(6));
  Value y = c.b.reshape(x, {3, 1, 2});
  Value s = c.b.reshape(c.param(DType::Float32, {1, 1}, {4}), {});
  std::vector<Buffer> out = c.run({y, s});
  EXPECT_EQ(decode_floats(DType::Int32, out[0]), iota_values(6));
  EXPECT_EQ(decode_floats(DType::Float32, out[1]), (std::vector<double>{4}));
}

TEST(RefLayout, PermuteMovesAxes) {
  Case c;
  Value x = c.param(DType::Float32, {2, 3, 4}, iota_values(24));
  Value y = c.b.permute(x, {2, 0, 1});
  ASSERT_EQ(c.g.type(y).shape, (Shape{4, 2, 3}));
  std::vector<double> want;  // y[i][j][k] = x[j][k][i]
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 2; ++j) {
      for (int k = 0; k < 3; ++k) want.push_back(j * 12 + k * 4 + i);
    }
  }
  EXPECT_EQ(c.run_f(y), want);
  Case d;
  Value t = d.b.permute(d.param(DType::BFloat16, {2, 3}, {1, 2, 3, 4, 5, 6}), {1, 0});
  EXPECT_EQ(d.run_f(t), (std::vector<double>{1, 4, 2, 5, 3, 6}));
}

TEST(RefLayout, LayoutOpsCopyBitsExactly) {
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

TEST(RefLayout, ExpandBroadcastsAndGrowsRank) {
  Case c;
  Value a = c.b.expand(c.param(DType::Int64, {3}, {1, 2, 3}), {2, 3});
  Value b = c.b.expand(c.param(DType::Float16, {2, 1}, {7, 8}), {2, 2, 3});
  std::vector<Buffer> out = c.run({a, b});
  EXPECT_EQ(decode_floats(DType::Int64, out[0]), (std::vector<double>{1, 2, 3, 1, 2, 3}));
  EXPECT_EQ(decode_floats(DType::Float16, out[1]),
            (std::vector<double>{7, 7, 7, 8, 8, 8, 7, 7, 7, 8, 8, 8}));
}

TEST(RefLayout, SliceWithSteps) {
  Case c;
  Value x = c.param(DType::Float32, {10}, iota_values(10));
  Value m = c.param(DType::Int32, {3, 4}, iota_values(12));
  Value a = c.b.slice(x, 0, 1, 8, 3);
  Value b = c.b.slice(m, 1, 1, 4, 2);
  Value e = c.b.slice(m, 0, 2, 2, 1);
  EXPECT_EQ(c.g.type(e).shape, (Shape{0, 4}));
  std::vector<Buffer> out = c.run({a, b, e});
  EXPECT_EQ(decode_floats(DType::Float32, out[0]), (std::vector<double>{1, 4, 7}));
  EXPECT_EQ(decode_floats(DType::Int32, out[1]), (std::vector<double>{1, 3, 5, 7, 9, 11}));
  EXPECT_EQ(out[2].nbytes(), 0u);
}

TEST(RefLayout, ConcatAlongEachAxis) {
  Case c;
  Value a = c.param(DType::Float64, {1, 2}, {1, 2});
  Value b = c.param(DType::Float64, {2, 2}, {3, 4, 5, 6});
  Value rows = c.b.concat(std::vector<Value>{a, b}, 0);
  Value p = c.param(DType::Float64, {2, 1}, {10, 20});
  Value q = c.param(DType::Float64, {2, 0}, {});
  Value cols = c.b.concat(std::vector<Value>{p, q, b}, 1);
  ASSERT_EQ(c.g.type(cols).shape, (Shape{2, 3}));
  std::vector<Buffer> out = c.run({rows, cols});
  EXPECT_EQ(decode_floats(DType::Float64, out[0]), (std::vector<double>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(decode_floats(DType::Float64, out[1]), (std::vector<double>{10, 3, 4, 20, 5, 6}));
}

// torch.gather: out[i][j] = x[idx[i][j]][j] (axis 0) or x[i][idx[i][j]] (axis 1).
TEST(RefIndex, GatherLikeTorch) {
  Case c;
  Value x = c.param(DType::Float32, {2, 2}, {1, 2, 3, 4});
  Value g1 = c.b.gather(x, 1, c.param_i(DType::Int64, {2, 2}, {0, 0, 1, 0}));
  Value g0 = c.b.gather(x, 0, c.param_i(DType::Int32, {2, 2}, {1, 0, 0, 0}));
  std::vector<Buffer> out = c.run({g1, g0});
  EXPECT_EQ(decode_floats(DType::Float32, out[0]), (std::vector<double>{1, 1, 4, 3}));
  EXPECT_EQ(decode_floats(DType::Float32, out[1]), (std::vector<double>{3, 2, 1, 2}));
}

TEST(RefIndex, GatherWithSmallerIndex) {
  Case c;
  Value x = c.param(DType::Int32, {3, 3}, iota_values(9));
  Value g = c.b.gather(x, 1, c.param_i(DType::Int64, {2, 1}, {2, 0}));
  EXPECT_EQ(c.run_i(g), (std::vector<int64_t>{2, 3}));
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

TEST(RefIndex, GatherOutOfRangeThrows) {
  Case c;
  Value x = c.param(DType::Float32, {2, 2}, {1, 2, 3, 4});
  expect_exec_error(c, c.b.gather(x, 1, c.param_i(DType::Int64, {2, 2}, {0, 5, 1, 0})),
                    {"[gather]", "index 5", "axis 1", "extent 2"});
  Case d;
  Value y = d.param(DType::Float32, {2, 2}, {1, 2, 3, 4});
  expect_exec_error(d, d.b.gather(y, 0, d.param_i(DType::Int32, {1, 2}, {0, -1})),
                    {"[gather]", "index -1", "axis 0", "extent 2"});
}

TEST(RefIndex, IndexSelectAlongEachAxis) {
  Case c;
  Value x = c.param(DType::Float32, {3, 2}, {1, 2, 3, 4, 5, 6});
  Value r = c.b.index_select(x, 0, c.param_i(DType::Int32, {3}, {2, 0, 2}));
  Value k = c.b.index_select(x, 1, c.param_i(DType::Int64, {3}, {1, 1, 0}));
  Value e = c.b.index_select(x, 0, c.param_i(DType::Int64, {0}, {}));
  std::vector<Buffer> out = c.run({r, k, e});
  EXPECT_EQ(decode_floats(DType::Float32, out[0]), (std::vector<double>{5, 6, 1, 2, 5, 6}));
  EXPECT_EQ(decode_floats(DType::Float32, out[1]),
            (std::vector<double>{2, 2, 1, 4, 4, 3, 6, 6, 5}));
  EXPECT_EQ(c.g.type(e).shape, (Shape{0, 2}));
  EXPECT_EQ(out[2].nbytes(), 0u);
}

TEST(RefIndex, IndexSelectOutOfRangeThrows) {
  Case c;
  Value x = c.param(DType::Float32, {3, 2}, {1, 2, 3, 4, 5, 6});
  expect_exec_error(c, c.b.index_select(x, 0, c.param_i(DType::Int64, {2}, {0, 3})),
                    {"[index_select]", "index 3", "axis 0", "extent 3"});
  Case d;  // the output is empty, but the bad index is still an error
  Value y = d.param(DType::Float32, {0, 2}, {});
  expect_exec_error(d, d.b.index_select(y, 1, d.param_i(DType::Int32, {1}, {2})),
                    {"[index_select]", "index 2", "axis 1", "extent 2"});
}

TEST(RefRandom, UniformIsPhiloxPerElement) {
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

TEST(RefRandom, NormalIsPhiloxPerElement) {
  for (DType dt : kFloatTypes) {
    Case c;
    Value key = c.param_i(DType::Int64, {2}, {-1, 12345});  // a negative seed is its bits
    Value z = c.b.random(OpKind::RandNormal, key, TensorType{dt, {7}});
    std::vector<double> want;
    for (uint64_t e = 0; e < 7; ++e) want.push_back(philox_normal(~uint64_t{0}, 12345, e));
    expect_floats(dt, c.run_f(z), want);
  }
}

TEST(RefRandom, SameKeySameBitsOtherOffsetOtherBits) {
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
