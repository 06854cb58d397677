// Reductions that keep the last axis (a bias gradient's sum over rows) run as column kernels
// (Stage::columns): blocks of contiguous columns added row by row. Their values against a
// closed form on the host, for every dtype, sum, max and min, fused inputs, keepdim, several
// and middle reduced axes, blocks with a remainder, empty extents and NaN; and the plan's
// choice of the column path where it applies and not elsewhere.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/plan.h"
#include "loom/core/half.h"
#include "loom/loom.h"
#include "loom/passes/pass.h"
#include "loom/runtime/engine.h"

namespace {

using loom::DType;
using loom::Shape;
using loom::Tensor;

struct Case {
  Shape shape;
  std::vector<int64_t> axes;
  bool keepdim = false;
  int64_t columns = 0;  // the block the plan must choose (0: the row path)
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c{
      {{300, 37}, {0}, false, 37},        // one block narrower than 256
      {{64, 784}, {0}, false, 200},       // four blocks, the last one 184 wide
      {{5, 300}, {0}, false, 152},        // two blocks, 152 and 148
      {{3, 50, 20}, {1}, false, 20},      // a middle axis: outer [3, 1]
      {{4, 6, 260}, {0, 1}, false, 136},  // two reduced axes
      {{6, 4, 9}, {0}, true, 9},          // keepdim: the output is [1, 4, 9]
      {{2, 0, 16}, {1}, false, 0},        // an empty reduction: no elements, the row path
      {{7, 1}, {0}, false, 0},            // one column: the row path reads it contiguously
      {{4, 5, 6}, {0, 2}, false, 0},      // the last axis reduced: the row path
  };
  return c;
}

// Exactly representable inputs (multiples of 1/8 below 2, integers for integer dtypes), so
// every partial sum is exact in float32 and a wrong element shows in any dtype.
std::vector<double> values(int64_t n, bool integral, uint64_t salt) {
  std::vector<double> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) {
    double k = static_cast<double>(static_cast<int64_t>((i * 37 + salt * 11) % 29) - 14);
    v[i] = integral ? k : k * 0.125;
  }
  return v;
}

enum class Op { Sum, Max, Min };

// The closed form: out[kept coords] over the reduced coords of f(x) = 2 x + y[last].
std::vector<double> expected(const Case& c, Op op, const std::vector<double>& x,
                             const std::vector<double>& y) {
  const size_t r = c.shape.size();
  auto reduced = [&](size_t d) {
    for (int64_t a : c.axes)
      if (static_cast<size_t>(a) == d) return true;
    return false;
  };
  Shape out_shape;
  for (size_t d = 0; d < r; ++d)
    if (!reduced(d)) out_shape.push_back(c.shape[d]);
  const double init = op == Op::Sum   ? 0.0
                      : op == Op::Max ? -std::numeric_limits<double>::infinity()
                                      : std::numeric_limits<double>::infinity();
  std::vector<double> out(static_cast<size_t>(out_shape.numel()), init);
  std::vector<int64_t> idx(r, 0);
  for (int64_t flat = 0; flat < c.shape.numel(); ++flat) {
    int64_t rest = flat, o = 0;
    for (size_t d = r; d-- > 0;) {
      idx[d] = rest % c.shape[d];
      rest /= c.shape[d];
    }
    for (size_t d = 0; d < r; ++d)
      if (!reduced(d)) o = o * c.shape[d] + idx[d];
    double f = 2 * x[static_cast<size_t>(flat)] + y[static_cast<size_t>(idx[r - 1])];
    double& a = out[static_cast<size_t>(o)];
    if (op == Op::Sum)
      a += f;
    else if (std::isnan(f) || std::isnan(a))
      a = std::numeric_limits<double>::quiet_NaN();
    else
      a = op == Op::Max ? std::max(a, f) : std::min(a, f);
  }
  return out;
}

// The value a dtype holds for an exact double (the single rounding of the result).
double rounded(double v, DType dt) {
  switch (dt) {
    case DType::BFloat16: return loom::bf16_to_float(loom::float_to_bf16(static_cast<float>(v)));
    case DType::Float16: return loom::f16_to_float(loom::float_to_f16(static_cast<float>(v)));
    case DType::Float32: return static_cast<float>(v);
    default: return v;
  }
}

Tensor reduce(Op op, const Tensor& t, const Case& c) {
  switch (op) {
    case Op::Sum: return loom::sum(t, c.axes, c.keepdim);
    case Op::Max: return loom::max(t, c.axes, c.keepdim);
    case Op::Min: return loom::min(t, c.axes, c.keepdim);
  }
  return t;
}

class CpuColumnReductions : public ::testing::Test {
 protected:
  void SetUp() override {
    loom::sync();
    loom::runtime::set_backend("cpu");
  }
};

TEST_F(CpuColumnReductions, MatchTheClosedFormForEveryDTypeAndShape) {
  const std::vector<std::pair<DType, std::vector<Op>>> dtypes{
      {DType::Float32, {Op::Sum, Op::Max, Op::Min}}, {DType::Float64, {Op::Sum, Op::Max}},
      {DType::BFloat16, {Op::Sum, Op::Min}},         {DType::Float16, {Op::Sum, Op::Max}},
      {DType::Int32, {Op::Sum, Op::Max, Op::Min}},   {DType::Int64, {Op::Sum}}};
  for (const auto& [dt, ops] : dtypes) {
    const bool integral = dt == DType::Int32 || dt == DType::Int64;
    for (const Case& c : cases()) {
      for (Op op : ops) {
        if (op != Op::Sum && c.shape.numel() == 0) continue;  // max of nothing raises
        SCOPED_TRACE(::testing::Message() << dt << " " << c.shape << " axes " << c.axes.size()
                                          << " op " << static_cast<int>(op));
        std::vector<double> xv = values(c.shape.numel(), integral, 1);
        std::vector<double> yv = values(c.shape[c.shape.size() - 1], integral, 2);
        Tensor x = loom::to(loom::tensor(xv, c.shape), dt);
        Tensor y = loom::to(loom::tensor(yv, {c.shape[c.shape.size() - 1]}), dt);
        Tensor got = loom::to(reduce(op, x * 2 + y, c), DType::Float64);
        std::vector<double> g = got.to_vector<double>();
        std::vector<double> want = expected(c, op, xv, yv);
        ASSERT_EQ(g.size(), want.size());
        for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(g[i], rounded(want[i], dt)) << "at " << i;
        EXPECT_EQ(got.shape().size(), c.keepdim ? c.shape.size() : c.shape.size() - c.axes.size());
      }
    }
  }
}

// A NaN wins its column (max and min), and only its column.
TEST_F(CpuColumnReductions, NaNWinsItsColumnOnly) {
  std::vector<float> v(64 * 300);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * 13) % 17);
  v[40 * 300 + 7] = std::numeric_limits<float>::quiet_NaN();
  v[3 * 300 + 290] = std::numeric_limits<float>::quiet_NaN();  // in the second block
  Tensor x = loom::tensor(v, {64, 300});
  for (bool mx : {true, false}) {
    std::vector<float> g = (mx ? loom::max(x, {0}) : loom::min(x, {0})).to_vector<float>();
    for (size_t j = 0; j < 300; ++j) {
      float want = mx ? -INFINITY : INFINITY;
      for (size_t i = 0; i < 64; ++i)
        want = mx ? std::max(want, v[i * 300 + j]) : std::min(want, v[i * 300 + j]);
      if (j == 7 || j == 290) {
        EXPECT_TRUE(std::isnan(g[j])) << j;
      } else {
        EXPECT_EQ(g[j], want) << j;
      }
    }
  }
}

// The transposed input of a reduction over its first axis reads x by columns: the fused
// input expression follows the permutation.
TEST_F(CpuColumnReductions, ReadPermutedInputsThroughTheFusedExpression) {
  std::vector<double> xv = values(40 * 70, false, 3);
  Tensor x = loom::tensor(xv, {40, 70});
  std::vector<double> g = loom::sum(loom::transpose(x, 0, 1) * 3, {0}).to_vector<double>();
  ASSERT_EQ(g.size(), 40u);
  for (size_t i = 0; i < 40; ++i) {
    double want = 0;
    for (size_t j = 0; j < 70; ++j) want += 3 * xv[i * 70 + j];
    EXPECT_EQ(g[i], want) << i;
  }
}

TEST_F(CpuColumnReductions, ThePlanChoosesColumnsWhereTheLastAxisIsKept) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(::testing::Message() << c.shape);
    Tensor x = loom::zeros(c.shape);
    Tensor s = loom::sum(x * 2, c.axes, c.keepdim);
    loom::ir::Graph g = loom::ir::parse(loom::pending_ir({s}));
    loom::passes::default_pipeline().run(g);
    std::vector<std::vector<loom::ir::NodeId>> results;
    loom::ir::Graph split = loom::cpu::split_results(g, &results);
    loom::cpu::Plan plan = loom::cpu::make_plan(split, results, /*allow_views=*/true);
    int64_t columns = -1;
    for (const loom::cpu::KernelSpec& k : plan.kernels)
      for (const loom::cpu::Stage& st : k.stages)
        if (st.reduce) columns = st.columns;
    if (c.shape.numel() == 0) continue;  // the passes may fold an empty reduction away
    EXPECT_EQ(columns, c.columns);
    loom::sync();
  }
}

// argmax runs as a max pass and a first-index pass: the first of tied maxima wins, a NaN is
// the maximum (the first NaN wins), over the last dim and a middle one, for floats and ints.
TEST_F(CpuColumnReductions, ArgmaxTakesTheFirstMaximumAndTheFirstNaN) {
  const int64_t rows = 6, n = 1000;
  std::vector<double> v(static_cast<size_t>(rows * n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>((i * 7919) % 97);
  auto at = [&](int64_t r, int64_t j) -> double& { return v[static_cast<size_t>(r * n + j)]; };
  at(1, 10) = at(1, 700) = 500;  // a tie: the first wins
  at(2, 999) = 500;              // the last element
  at(3, 0) = 500;                // the first element
  const double nan = std::numeric_limits<double>::quiet_NaN();
  at(4, 300) = nan;  // NaN beats everything; the first NaN wins
  at(4, 800) = nan;
  at(4, 100) = 500;
  for (int64_t j = 0; j < n; ++j) at(5, j) = -1;  // all equal but a -0 and a +0
  at(5, 40) = -0.0;
  at(5, 41) = 0.0;
  for (DType dt : {DType::Float32, DType::Float64, DType::BFloat16, DType::Int32, DType::Int64}) {
    SCOPED_TRACE(::testing::Message() << dt);
    const bool integral = dt == DType::Int32 || dt == DType::Int64;
    std::vector<double> x = v;
    if (integral) x[4 * n + 300] = x[4 * n + 800] = 7;  // no NaN in integers
    Tensor t = loom::to(loom::tensor(x, {rows, n}), dt);
    std::vector<int64_t> got = loom::argmax(t, 1).to_vector<int64_t>();
    int64_t plain = 0;  // row 0: the closed form (the first strict maximum)
    for (int64_t j = 1; j < n; ++j)
      if (x[static_cast<size_t>(j)] > x[static_cast<size_t>(plain)]) plain = j;
    const std::vector<int64_t> want{plain, 10, 999, 0, integral ? 100 : 300, 40};
    for (int64_t r = 0; r < rows; ++r)
      EXPECT_EQ(got[static_cast<size_t>(r)], want[static_cast<size_t>(r)]) << "row " << r;
    // A middle dim: [2, rows, 3] with the rows' first three columns.
    std::vector<double> m(2 * rows * 3);
    for (int64_t a = 0; a < 2; ++a)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < 3; ++c)
          m[static_cast<size_t>((a * rows + r) * 3 + c)] = x[static_cast<size_t>(r * n + c + a)];
    std::vector<int64_t> gm =
        loom::argmax(loom::to(loom::tensor(m, {2, rows, 3}), dt), 1).to_vector<int64_t>();
    for (int64_t a = 0; a < 2; ++a)
      for (int64_t c = 0; c < 3; ++c) {
        int64_t best = 0;
        for (int64_t r = 1; r < rows; ++r)
          if (m[static_cast<size_t>((a * rows + r) * 3 + c)] >
              m[static_cast<size_t>((a * rows + best) * 3 + c)])
            best = r;
        EXPECT_EQ(gm[static_cast<size_t>(a * 3 + c)], best) << a << "," << c;
      }
  }
}

}  // namespace

// float32 sums add in levels (a partial per reduced loop, long loops in blocks), so the error
// grows with the extents' sum, not the number of elements: against the float64 sum of the
// same float32 values (1000 + a uniform in [-1, 1), a mean far from zero as a batch norm's
// statistics see), within a few float32 roundings; one running sum is off by 10-40x that.
TEST_F(CpuColumnReductions, FloatSumsStayNearTheirFloat64Value) {
  struct Sum {
    Shape shape;
    std::vector<int64_t> axes;
  };
  const std::vector<Sum> sums{{{16, 8, 26, 26}, {0, 2, 3}},  // the row path over three axes
                              {{16384, 64}, {0}},            // a column reduction
                              {{1 << 21}, {0}},              // one long row
                              {{8, 256, 384}, {0, 1}}};      // a bias gradient's sum
  uint64_t state = 42;
  for (const Sum& c : sums) {
    SCOPED_TRACE(::testing::Message() << c.shape);
    std::vector<float> xv(static_cast<size_t>(c.shape.numel()));
    for (float& v : xv) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      v = 1000.0f + static_cast<float>(static_cast<double>(state >> 11) * 0x1p-52 - 1.0);
    }
    const std::vector<float> got = loom::sum(loom::tensor(xv, c.shape), c.axes).to_vector<float>();
    const std::vector<double> want =
        loom::sum(loom::to(loom::tensor(xv, c.shape), DType::Float64), c.axes).to_vector<double>();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_LE(std::abs(got[i] - want[i]), 4e-7 * std::abs(want[i])) << "at " << i;
  }
}
