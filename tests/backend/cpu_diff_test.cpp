// Differential tests, part 1: elementwise ops, conversions, broadcasting, non-contiguous
// operands, 0-size and 0-d tensors, NaN and Inf, and sizes that cross vector widths, each
// run on the reference interpreter and on the cpu backend and compared (tests/backend/
// diff_util.h). Part 2 (cpu_diff_ops_test.cpp) covers reductions, nn functions, matmul,
// layout, indexing and random numbers.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "backend/diff_util.h"

namespace loom::difftest {
namespace {

using CpuDiffElementwise = DiffTest;
using CpuDiffConvert = DiffTest;
using CpuDiffBroadcast = DiffTest;
using CpuDiffSpecial = DiffTest;

constexpr double kI32Max = std::numeric_limits<int32_t>::max();
constexpr double kI32Min = std::numeric_limits<int32_t>::min();


// Every float-valued unary op of the API on x (any values) and p (positive values).
void unary_float_ops(Outs& o, const Tensor& x, const Tensor& p) {
  o.exact("neg", neg(x));
  o.exact("-x", -x);
  o.exact("abs", abs(x));
  o.exact("relu", relu(x));
  o.trans("exp", exp(x));
  o.trans("log", log(p));
  o.trans("sqrt", sqrt(p));
  o.trans("rsqrt", rsqrt(p));
  o.trans("tanh", tanh(x));
  o.trans("sin", sin(x));
  o.trans("cos", cos(x));
  o.trans("erf", erf(x));
  o.trans("sigmoid", sigmoid(x));
  o.trans("gelu", gelu(x));
  o.exact("logical_not", logical_not(x));
}

TEST_F(CpuDiffElementwise, UnaryFloatOpsInEveryFloatDTypeAndShape) {
  for (DType dt : kFloatDTypes) {
    for (const Shape& s : {Shape{37, 129}, Shape{}, Shape{0}, Shape{2, 0, 3}, Shape{1023}}) {
      SCOPED_TRACE(str(dt, s));
      expect_same([&](Outs& o) {
        unary_float_ops(o, input(dt, s, 1, -3, 3), input(dt, s, 2, 0.01, 5));
      });
    }
  }
}

// Integer and bool operands: neg and abs stay integral (and wrap at the minimum); the float
// ops promote to float32 like PyTorch.
TEST_F(CpuDiffElementwise, UnaryOpsOnIntegersAndBool) {
  for (DType dt : {DType::Int32, DType::Int64}) {
    SCOPED_TRACE(str(dt, {}));
    expect_same([&](Outs& o) {
      Tensor edge = from_ints(dt, {8}, {0, 1, -1, 7, -7, 100, static_cast<int64_t>(kI32Min),
                                        dt == DType::Int64 ? std::numeric_limits<int64_t>::min()
                                                           : static_cast<int64_t>(kI32Max)});
      o.exact("neg edge", neg(edge));
      o.exact("abs edge", abs(edge));
      o.exact("relu edge", relu(edge));
      o.exact("not edge", logical_not(edge));
      Tensor x = input(dt, {5, 7}, 3, -4, 4);
      unary_float_ops(o, x, input(dt, {5, 7}, 4, 1, 9));
    });
  }
  expect_same([&](Outs& o) {
    Tensor b = input(DType::Bool, {3, 5}, 5);
    o.exact("not bool", logical_not(b));
    o.trans("exp bool", exp(b));
    o.trans("sigmoid bool", sigmoid(b));
    o.trans("sqrt bool", sqrt(b));
  });
}

// Operands in [-4, 4]: integer division by zero happens (true division gives float32 inf/nan),
// float pow of a negative base gives NaN, integer pow of a negative exponent gives 0 or +-1.
TEST_F(CpuDiffElementwise, BinaryArithmeticInEveryNumericDType) {
  for (DType dt : kNumericDTypes) {
    for (const Shape& s : {Shape{5, 7}, Shape{}, Shape{0, 3}, Shape{4097}}) {
      SCOPED_TRACE(str(dt, s));
      expect_same([&](Outs& o) {
        Tensor a = input(dt, s, 6, -4, 4), b = input(dt, s, 7, -4, 4);
        o.arith("add", a + b);
        o.arith("sub", a - b);
        o.arith("mul", a * b);
        o.arith("div", a / b);
        o.arith("add()", add(a, b));
        o.arith("sub()", sub(a, b));
        o.arith("mul()", mul(a, b));
        o.arith("div()", div(a, b));
        o.trans("pow", pow(a, b));
        o.exact("maximum", maximum(a, b));
        o.exact("minimum", minimum(a, b));
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
        if (is_floating(dt)) o.trans("pow -1", pow(a, -1));  // ints refused, as torch
      });
    }
  }
}

// Integer arithmetic wraps: results must match bit for bit at the extremes.
TEST_F(CpuDiffElementwise, IntegerOverflowWraps) {
  for (DType dt : {DType::Int32, DType::Int64}) {
    SCOPED_TRACE(str(dt, {}));
    const int64_t lo = dt == DType::Int32 ? static_cast<int64_t>(kI32Min)
                                          : std::numeric_limits<int64_t>::min();
    const int64_t hi = dt == DType::Int32 ? static_cast<int64_t>(kI32Max)
                                          : std::numeric_limits<int64_t>::max();
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
}

// Values on a grid of halves, so that equality happens; NaN compares false (ne: true).
TEST_F(CpuDiffElementwise, ComparisonsInEveryDType) {
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
      o.exact("lt", a < b);
      o.exact("le", a <= b);
      o.exact("gt", a > b);
      o.exact("ge", a >= b);
      o.exact("eq", a == b);
      o.exact("ne", a != b);
      o.exact("lt s", a < 0.5);
      o.exact("le s", a <= 1);
      o.exact("gt s", a > -1);
      o.exact("ge s", a >= 0);
      o.exact("eq s", a == 1);
      o.exact("ne s", a != 0);
      o.exact("eq bool s", a == true);
      // mixed dtypes promote before comparing
      o.exact("lt f32", a < input(DType::Float32, {6, 10}, 10, -2, 2));
      o.exact("eq i64 row", a == from_ints(DType::Int64, {10}, {0, 1, -1, 2, 0, 0, 1, 1, 3, -3}));
    });
  }
}

TEST_F(CpuDiffElementwise, WhereInEveryDTypeWithBroadcasting) {
  for (DType dt : kAllDTypes) {
    SCOPED_TRACE(str(dt, {}));
    expect_same([&](Outs& o) {
      Tensor c = input(DType::Bool, {3, 4}, 11);
      Tensor a = input(dt, {3, 4}, 12, -5, 5), b = input(dt, {3, 4}, 13, -5, 5);
      o.exact("where", where(c, a, b));
      o.exact("where cmp", where(a > b, a, b));
      o.exact("where bcast", where(input(DType::Bool, {3, 1}, 14), input(dt, {1, 4}, 15, -5, 5),
                                   input(dt, {}, 16, -5, 5)));
      o.exact("where 0-d cond", where(input(DType::Bool, {}, 17), a, b));
      o.exact("where mixed", where(c, a, input(DType::Float32, {3, 4}, 18)));
      o.exact("where empty",
              where(input(DType::Bool, {0, 4}, 19), input(dt, {0, 4}, 20), input(dt, {4}, 9)));
    });
  }
}

// clamp with a double bound promotes integers to float32 (PyTorch's scalar rule).
TEST_F(CpuDiffElementwise, ClampBothSidesAndOneSided) {
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

// ---- conversions -----------------------------------------------------------------------

// Float sources: rounding ties, saturation of out-of-range values to the integer limits,
// NaN (0 as an integer, true as bool), infinities, f16 overflow and subnormals, and doubles
// that a two-step f64 -> f32 -> f16/bf16 conversion would round wrongly.
std::vector<double> float_edge_values() {
  return {0,      -0.0,    0.5,   -0.5,   1,      -1,   1.5,  2.5,   -2.5,   -2.7, 3.99,
          100,    -100,    255.5, 1e5,    65504,  65520, -7e4, 1e10,  -1e10,  3e9,  -3e9,
          1e20,   -1e20,   1e-8,  -1e-30, 6e-5,   1e-46, 3e38, 1e39,  -1e300,
          1 + 0x1p-11 + 0x1p-40, 1 + 0x1p-8 + 0x1p-40, -(1 + 0x1p-11 + 0x1p-40),
          kNaN,   kInf,    -kInf, 0.1,    1.0 / 3};
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
TEST_F(CpuDiffConvert, EveryPairOfDTypesIsExact) {
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

// ---- broadcasting ----------------------------------------------------------------------

TEST_F(CpuDiffBroadcast, ShapePairsInBothOrders) {
  const std::vector<std::pair<Shape, Shape>> pairs = {
      {{4}, {4}}, {{2, 3}, {3}}, {{2, 1}, {1, 3}}, {{}, {2, 2}}, {{3, 1, 2}, {4, 1}},
      {{1}, {0}}, {{5, 1, 1}, {1, 129}}};
  for (DType dt : kAllDTypes) {
    for (const auto& [sa, sb] : pairs) {
      for (bool swap : {false, true}) {
        const Shape& s0 = swap ? sb : sa;
        const Shape& s1 = swap ? sa : sb;
        SCOPED_TRACE(str(dt, s0) + " x " + str(dt, s1));
        expect_same([&](Outs& o) {
          Tensor a = input(dt, s0, 25, -3, 3), b = input(dt, s1, 26, -3, 3);
          o.exact("maximum", maximum(a, b));
          o.exact("minimum", minimum(a, b));
          o.exact("lt", a < b);
          o.exact("eq", a == b);
          o.exact("where", where(a > b, a, b));
          if (dt == DType::Bool) return;
          o.arith("add", a + b);
          o.arith("sub", a - b);
          o.arith("mul", a * b);
          o.arith("div", a / b);
          o.arith("mixed f64", a * input(DType::Float64, s1, 27));
        });
      }
    }
  }
}

// Operands that reach elementwise ops and reductions through transpose, permute, slices with
// steps and expand: a backend that works on strided views must get every index right.
TEST_F(CpuDiffBroadcast, NonContiguousOperands) {
  for (DType dt : {DType::Float32, DType::Float64, DType::BFloat16, DType::Int32}) {
    SCOPED_TRACE(str(dt, {}));
    expect_same([&](Outs& o) {
      Tensor x = input(dt, {4, 6, 5}, 28, -3, 3);
      Tensor pm = permute(x, {2, 0, 1});
      o.arith("permute + y", pm + input(dt, {5, 4, 6}, 29, -3, 3));
      Tensor tr = transpose(x, 0, 2);
      o.arith("transpose * 2", tr * 2);
      Tensor sl = slice(x, 1, 1, 6, 2);
      o.arith("slice step + 1", sl + 1);
      o.arith("slice step + transpose", slice(x, 2, 0, 5, 3) + transpose(slice(x, 2, 1, 3), 0, 0));
      Tensor ex = expand(input(dt, {4, 1, 5}, 30, -3, 3), {4, 6, 5});
      o.arith("expand * x", ex * x);
      o.arith("expand 0-d", expand(input(dt, {}, 31), {3, 3}) - input(dt, {3, 3}, 32));
      o.arith("expand new dims", expand(input(dt, {5}, 33), {2, 3, 5}) + 0);
      o.trans("exp transpose", exp(transpose(x, 1, 2)));
      o.arith("slice of transpose of slice",
              slice(transpose(slice(x, 0, 1, 4), 0, 1), 1, 0, 3, 2) * 3);
      o.exact("maximum permuted", maximum(pm, permute(x * 1, {2, 0, 1})));
      o.arith("transposed operands", transpose(x, 0, 1) - permute(x, {1, 0, 2}));
      // reductions of strided operands
      for (const std::vector<int64_t>& dims :
           std::vector<std::vector<int64_t>>{{0}, {1}, {2}, {0, 2}, {}}) {
        int64_t n = 1;
        for (int64_t d : dims) n *= pm.shape()[d];
        if (dims.empty()) n = pm.numel();
        o.reduced("sum permute", sum(pm, dims), n, sum(mag(pm), dims));
        o.exact("max permute", max(pm, dims));
        o.exact("min slice", min(sl, dims));
        o.reduced("sum expand", sum(ex, dims, true), ex.numel() / sum(ex, dims, true).numel(),
                  sum(mag(ex), dims, true));
      }
      o.exact("argmax transposed", argmax(tr, 1));
      o.exact("argmax sliced", argmax(sl, -1, true));
      if (is_floating(dt)) o.reduced("mean slice", mean(sl, {0, 1}), 12, mean(mag(sl), {0, 1}));
    });
  }
}

// ---- 0-size and 0-d --------------------------------------------------------------------

TEST_F(CpuDiffSpecial, ZeroSizeTensors) {
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

TEST_F(CpuDiffSpecial, ZeroDimTensors) {
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

// ---- NaN and Inf -----------------------------------------------------------------------

std::vector<double> special_values() {
  return {kNaN, kInf, -kInf, 0, -0.0, 1, -1, 2.5, -3, 1e30, -1e-30, 10.5, 11.5, 88, 89,
          709, 710, -745, -750, 0.5};
}

TEST_F(CpuDiffSpecial, NanAndInfPropagateThroughElementwiseOps) {
  for (DType dt : kFloatDTypes) {
    SCOPED_TRACE(str(dt, {}));
    expect_same([&](Outs& o) {
      std::vector<double> v = special_values();
      for (double& x : v) x = representable(dt, x);
      const int64_t n = static_cast<int64_t>(v.size());
      Tensor x = from_values(dt, {n}, v);
      unary_float_ops(o, x, x);
      // every pair, through broadcasting
      Tensor a = reshape(x, {n, 1}), b = reshape(x, {1, n});
      o.exact("maximum", maximum(a, b));
      o.exact("minimum", minimum(a, b));
      o.arith("add", a + b);
      o.arith("mul", a * b);
      o.arith("div", a / b);
      o.trans("pow", pow(a, b));
      o.exact("lt", a < b);
      o.exact("eq", a == b);
      o.exact("ne", a != b);
      o.exact("clamp", clamp(x, -1.0, 1.0));
      o.exact("x / 0", x / 0.0);
      o.exact("x / -0", x / -0.0);
    });
  }
  expect_same([&](Outs& o) {  // integer true division by zero gives float32 inf and nan
    Tensor a = from_ints(DType::Int32, {4}, {1, -1, 0, 5});
    Tensor z = from_ints(DType::Int32, {4}, {0, 0, 0, 0});
    o.exact("int / 0", a / z);
    o.exact("int64 / 0", to(a, DType::Int64) / to(z, DType::Int64));
    o.exact("int / 0 scalar", a / 0);
  });
}

TEST_F(CpuDiffSpecial, NanAndInfInReductionsAndSoftmax) {
  const std::vector<double> rows = {
      -kInf, 0,     1,     2,     // one -inf: probability 0
      -kInf, -kInf, -kInf, -kInf,  // all -inf: nan everywhere
      kNaN,  1,     2,     3,     // nan: nan row
      kInf,  1,     2,     3,     // +inf: nan from inf - inf
      1,     kNaN,  -kInf, kInf,  // everything at once
      1,     2,     3,     4};
  for (DType dt : kFloatDTypes) {
    SCOPED_TRACE(str(dt, {}));
    expect_same([&](Outs& o) {
      Tensor x = from_values(dt, {6, 4}, rows);
      o.normalized("softmax", softmax(x, 1), 4);
      o.normalized("log_softmax", log_softmax(x, 1), 4);
      o.normalized("softmax cols", softmax(x, 0), 6);
      o.exact("max", max(x, {1}));
      o.exact("min", min(x, {1}));
      o.exact("max keep", max(x, {0}, true));
      o.exact("max all", max(x));
      o.exact("min all", min(x));
      o.exact("argmax", argmax(x, 1));
      o.exact("argmax 0", argmax(x, 0));
      o.exact("argmax all", argmax(x));
      o.reduced("sum", sum(x, {1}), 4, sum(mag(x), {1}));
      o.reduced("mean", mean(x, {0}), 6, mean(mag(x), {0}));
      o.exact("relu", relu(x));
      o.exact("maximum row", maximum(x, select(x, 0, 4)));
    });
  }
}

// ---- sizes that cross vector widths and thread splits ----------------------------------

TEST_F(CpuDiffSpecial, LargeSizes) {
  for (DType dt : {DType::Float32, DType::Float64, DType::BFloat16, DType::Float16,
                   DType::Int32, DType::Int64}) {
    for (const Shape& s : {Shape{1000}, Shape{1023}, Shape{4097}, Shape{37, 129}}) {
      SCOPED_TRACE(str(dt, s));
      expect_same([&](Outs& o) {
        Tensor x = input(dt, s, 44, -3, 3), y = input(dt, s, 45, -3, 3);
        const int64_t r = x.dim();
        o.arith("add", x + y);
        o.arith("mul bcast row", x * input(dt, {s[r - 1]}, 46, -3, 3));
        o.exact("maximum", maximum(x, y));
        o.exact("lt", x < y);
        o.trans("tanh", tanh(x));
        o.trans("exp", exp(x));
        o.reduced("sum", sum(x), x.numel(), sum(mag(x)));
        o.reduced("sum last", sum(x, {-1}), s[r - 1], sum(mag(x), {-1}));
        o.exact("max", max(x));
        o.exact("min last", min(x, {-1}, true));
        o.exact("argmax", argmax(x));
        o.exact("argmax last", argmax(x, -1));
        if (r == 2) {
          o.reduced("sum first", sum(x, {0}), s[0], sum(mag(x), {0}));
          o.exact("max first", max(x, {0}));
          o.exact("argmax first", argmax(x, 0, true));
          o.arith("transpose add", transpose(x, 0, 1) + transpose(y, 0, 1));
          o.arith("mul bcast col", x * input(dt, {s[0], 1}, 47, -3, 3));
        }
        if (is_floating(dt)) {
          o.reduced("mean", mean(x), x.numel(), mean(mag(x)));
          o.normalized("softmax", softmax(x, -1), s[r - 1]);
          o.normalized("log_softmax", log_softmax(x, 0), s[0]);
          o.normalized("layer_norm", layer_norm(x, {s[r - 1]}), s[r - 1]);
        }
      });
    }
  }
}

}  // namespace
}  // namespace loom::difftest
