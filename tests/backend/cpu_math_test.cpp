// The CPU backend's own float64 exp, log and tanh, float32 pow, sin and cos
// (backend/cpu/math.cpp), which replaced libm calls that kept their loops scalar: against libm
// in long double (exp, log, tanh, sin, cos) and C's powf (pow), over sweeps of ordinary values
// and every special case C defines.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "loom/loom.h"

namespace {

using loom::DType;
using loom::Tensor;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::vector<double> run_f64(const std::vector<double>& x, Tensor (*f)(const Tensor&)) {
  Tensor t = loom::tensor(x, {static_cast<int64_t>(x.size())});
  return f(t).to_vector<double>();
}

// Units in the last place of `want` as a double (of its magnitude's binade).
double ulps(double got, long double want) {
  if (std::isinf(static_cast<double>(want)) || got == static_cast<double>(want)) return 0;
  const long double ulp = std::ldexp(1.0L, std::ilogb(static_cast<double>(want)) - 52);
  return static_cast<double>(std::fabs(static_cast<long double>(got) - want) / ulp);
}

TEST(CpuMath, Float64ExpIsWithinOneUlpOfLibm) {
  std::vector<double> x;
  for (double v = -708.0; v <= 709.7; v += 0.0137) x.push_back(v);  // normal results
  for (double v = -1e-6; v <= 1e-6; v += 1.3e-9) x.push_back(v);    // around exp's 1
  std::vector<double> got = run_f64(x, [](const Tensor& t) { return loom::exp(t); });
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double u = ulps(got[i], std::exp(static_cast<long double>(x[i])));
    worst = std::max(worst, u);
    ASSERT_LE(u, 1.0) << "exp(" << x[i] << ") = " << got[i];
  }
  RecordProperty("worst_ulps", std::to_string(worst));
  const std::vector<double> special = {0.0, -0.0, 710.0, 1e300, -746.0, -1e300, kInf, -kInf, kNaN};
  got = run_f64(special, [](const Tensor& t) { return loom::exp(t); });
  const std::vector<double> want = {1, 1, kInf, kInf, 0, 0, kInf, 0};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << special[i];
  EXPECT_TRUE(std::isnan(got.back()));
}

TEST(CpuMath, Float64LogIsWithinOneUlpOfLibm) {
  std::vector<double> x;
  for (double v = 2.3e-308; v < 1e308; v *= 1.0173) x.push_back(v);  // every binade
  for (double v = 0.5; v <= 2.0; v += 1.7e-5) x.push_back(v);        // around log's 0
  for (double v = 1 - 1e-9; v <= 1 + 1e-9; v += 3.1e-13) x.push_back(v);
  std::vector<double> got = run_f64(x, [](const Tensor& t) { return loom::log(t); });
  for (size_t i = 0; i < x.size(); ++i)
    ASSERT_LE(ulps(got[i], std::log(static_cast<long double>(x[i]))), 1.0)
        << "log(" << x[i] << ") = " << got[i];
  const std::vector<double> special = {1.0, 0.0, -0.0, kInf, -1.0, -kInf, kNaN};
  got = run_f64(special, [](const Tensor& t) { return loom::log(t); });
  EXPECT_EQ(got[0], 0.0);
  EXPECT_EQ(got[1], -kInf);
  EXPECT_EQ(got[2], -kInf);
  EXPECT_EQ(got[3], kInf);
  for (size_t i = 4; i < got.size(); ++i) EXPECT_TRUE(std::isnan(got[i])) << special[i];
}

// float64 tanh (fdlibm's, expm1 below |x| = 1 and exp above, math.cpp) against tanhl, over
// both signs of every binade from 1e-18 to 30 and fine sweeps around the branch points 0.5 ln 2,
// 1 and 22: within 2.5 ulp (fdlibm's form is 2.02 ulp off at 0.25344 in glibc's tanh too).
TEST(CpuMath, Float64TanhIsFdlibmsWithinTwoAndAHalfUlps) {
  std::vector<double> x;
  for (double v = 1e-18; v < 30; v *= 1.00173) x.push_back(v), x.push_back(-v);
  for (double v = 0; v <= 2; v += 1.1e-4) x.push_back(v);
  for (double v = 21.9; v <= 22.1; v += 1e-4) x.push_back(v);
  std::vector<double> got = run_f64(x, [](const Tensor& t) { return loom::tanh(t); });
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const long double exact = std::tanh(static_cast<long double>(x[i]));
    const double u = ulps(got[i], exact);
    worst = std::max(worst, u);
    ASSERT_LE(u, 2.5) << "tanh(" << x[i] << ") = " << got[i];
  }
  RecordProperty("worst_ulps", std::to_string(worst));
  const std::vector<double> special = {0.0, -0.0, 40.0, -40.0, kInf, -kInf, kNaN};
  got = run_f64(special, [](const Tensor& t) { return loom::tanh(t); });
  const std::vector<double> want = {0.0, -0.0, 1, -1, 1, -1};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i], want[i]) << special[i];
    EXPECT_EQ(std::signbit(got[i]), std::signbit(want[i])) << special[i];
  }
  EXPECT_TRUE(std::isnan(got.back()));
}

// got = pow(x, y) in float32 against C's powf: NaN where it is NaN, zeros and infinities with
// their sign, subnormal results flushed (kernels run with denormals off), else within 1 ulp.
void expect_powf(float x, float y, float got) {
  const float inf = std::numeric_limits<float>::infinity();
  const float want = std::pow(x, y);
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << "pow(" << x << ", " << y << ") = " << got;
    return;
  }
  if (std::fabs(want) < FLT_MIN && want != 0) {  // subnormal: runs flush them to zero
    EXPECT_LE(std::fabs(got), FLT_MIN) << "pow(" << x << ", " << y << ")";
    return;
  }
  if (std::isinf(want) || want == 0) {
    EXPECT_EQ(got, want) << "pow(" << x << ", " << y << ")";
    EXPECT_EQ(std::signbit(got), std::signbit(want)) << "pow(" << x << ", " << y << ")";
    return;
  }
  EXPECT_LE(std::fabs(got - want), std::nextafter(std::fabs(want), inf) - std::fabs(want))
      << "pow(" << x << ", " << y << ") = " << got << ", powf " << want;
}

// Every pair of a grid of bases and exponents that holds C's special cases (zeros of both
// signs, +-1, infinities, NaN, odd and even integers, halves, exponents past 2^24 where every
// float is even, results that overflow and underflow), and a sweep of ordinary ones.
TEST(CpuMath, Float32PowIsCsPowfWithinOneUlp) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  const std::vector<float> bases = {0.0f,    -0.0f, 1.0f,   -1.0f,  inf,    -inf,  nan,
                                    0.5f,    -0.5f, 2.0f,   -2.0f,  3.7f,   -3.7f, 1e-30f,
                                    -1e-30f, 1e30f, -1e30f, 0.999f, 1.001f, -7.0f};
  const std::vector<float> exps = {0.0f,        -0.0f,       1.0f,        -1.0f,   2.0f,  -2.0f,
                                   3.0f,        -3.0f,       0.5f,        -0.5f,   2.5f,  inf,
                                   -inf,        nan,         127.0f,      -149.0f, 1e10f, -1e10f,
                                   16777216.0f, 33554432.0f, 16777215.0f, 0.3333f};
  std::vector<float> xs, ys;
  for (float b : bases)
    for (float e : exps) xs.push_back(b), ys.push_back(e);
  for (int i = 0; i < 20000; ++i) {
    xs.push_back(static_cast<float>(0.001 + 10.0 * ((i * 7919) % 10007) / 10007.0));
    ys.push_back(static_cast<float>(-20.0 + 40.0 * ((i * 104729) % 9973) / 9973.0));
  }
  const int64_t n = static_cast<int64_t>(xs.size());
  std::vector<float> got =
      loom::pow(loom::tensor(xs, {n}), loom::tensor(ys, {n})).to_vector<float>();
  for (size_t i = 0; i < xs.size(); ++i) expect_powf(xs[i], ys[i], got[i]);
}

// A host exponent is a graph input, so x ** 2 and x ** 3 share one executable; its kernels
// square when every such exponent is 2 at run time (emitter.cpp, squares_version) and take
// the general pow otherwise. Both paths of the same executable, in elementwise, row- and
// column-reduction stages, against C's powf (x * x is powf(x, 2) correctly rounded).
TEST(CpuMath, HostExponentsOfTwoSquareInTheSameExecutable) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  std::vector<float> xs = {0.0f,  -0.0f, 1.0f,  -1.0f,  inf,    -inf,  nan,    0.5f,
                           -0.5f, 3.7f,  -3.7f, 1e-20f, 1e-30f, 1e19f, -1e20f, 1.8e19f};
  for (int i = 0; i < 4000; ++i)
    xs.push_back(static_cast<float>(-30.0 + 60.0 * ((i * 7919) % 10007) / 10007.0));
  const int64_t n = static_cast<int64_t>(xs.size());
  Tensor x = loom::tensor(xs, {n});
  loom::sync();
  const int64_t compiles = loom::metrics().compiles;
  for (float e : {2.0f, 3.0f, 2.0f, -2.0f, 0.5f, 2.0f}) {
    std::vector<float> got = loom::pow(x, e).to_vector<float>();
    for (size_t i = 0; i < xs.size(); ++i) {
      expect_powf(xs[i], e, got[i]);
      if (e == 2.0f && std::fabs(xs[i] * xs[i]) >= FLT_MIN) {  // squared: exactly x * x
        EXPECT_EQ(got[i], xs[i] * xs[i]) << xs[i];
      }
    }
  }
  EXPECT_EQ(loom::metrics().compiles, compiles + 1) << "one executable for every exponent";

  // Two pows in one kernel: squares only when both exponents are 2.
  Tensor y = loom::tensor(std::vector<float>(xs.rbegin(), xs.rend()), {n});
  for (auto [a, b] : {std::pair{2.0f, 2.0f}, {2.0f, 3.0f}, {3.0f, 2.0f}, {2.0f, 2.0f}}) {
    std::vector<float> got = (loom::pow(x, a) - loom::pow(y, b)).to_vector<float>();
    const size_t m = xs.size();
    for (size_t i = 16; i < m - 16; ++i) {  // ordinary values
      const float want = std::pow(xs[i], a) - std::pow(xs[m - 1 - i], b);
      EXPECT_NEAR(got[i], want,
                  1e-6 * (std::fabs(std::pow(xs[i], a)) + std::fabs(std::pow(xs[m - 1 - i], b))))
          << a << " " << b << " at " << i;
    }
  }

  // Reductions: sums of powers over rows and over columns.
  std::vector<float> grid(xs.begin() + 16, xs.begin() + 16 + 64 * 50);
  Tensor g = loom::tensor(grid, {64, 50});
  for (float e : {2.0f, 3.0f, 2.0f}) {
    std::vector<double> rows =
        loom::to(loom::sum(loom::pow(g, e), {1}), DType::Float64).to_vector<double>();
    std::vector<double> cols =
        loom::to(loom::sum(loom::pow(g, e), {0}), DType::Float64).to_vector<double>();
    std::vector<double> want_rows(64), mag_rows(64), want_cols(50), mag_cols(50);
    for (int r = 0; r < 64; ++r)
      for (int c = 0; c < 50; ++c) {
        const double p = std::pow(static_cast<double>(grid[r * 50 + c]), e);
        want_rows[r] += p, mag_rows[r] += std::fabs(p);
        want_cols[c] += p, mag_cols[c] += std::fabs(p);
      }
    for (int r = 0; r < 64; ++r)
      EXPECT_NEAR(rows[r], want_rows[r], 1e-5 * mag_rows[r]) << "row " << r << " e " << e;
    for (int c = 0; c < 50; ++c)
      EXPECT_NEAR(cols[c], want_cols[c], 1e-5 * mag_cols[c]) << "column " << c << " e " << e;
  }

  // float64 and bfloat16: squares are their own products.
  Tensor x64 = loom::to(x, DType::Float64), xh = loom::to(x, DType::BFloat16);
  for (double e : {2.0, 3.0, 2.0}) {
    std::vector<double> got = loom::pow(x64, e).to_vector<double>();
    std::vector<double> half = loom::to(loom::pow(xh, e), DType::Float64).to_vector<double>();
    std::vector<double> half_want =
        loom::to(e == 2.0 ? xh * xh : xh * xh * xh, DType::Float64).to_vector<double>();
    for (size_t i = 0; i < xs.size(); ++i) {
      const double want = std::pow(static_cast<double>(xs[i]), e);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got[i]));
        EXPECT_TRUE(std::isnan(half[i]));
        continue;
      }
      if (e == 2.0 || std::isinf(want)) {
        EXPECT_EQ(got[i], want) << xs[i];
        EXPECT_EQ(half[i], half_want[i]) << xs[i];
      } else {
        EXPECT_NEAR(got[i], want, 2.3e-16 * std::fabs(want)) << xs[i];
      }
    }
  }
}

}  // namespace

// float32 sin and cos (math.cpp, sin_cos_f32: an exact reduction by a table of 2/pi's bits
// per exponent) against long double sinl and cosl rounded to float: within 1 ulp over a sweep,
// every binade of both signs, neighbours of multiples of pi/2 up to 2^62 pi/2 and the float32
// nearest one of all (relative to its size), random bit patterns of every exponent, and C's
// special cases.
TEST(CpuMath, Float32SinCosWithinOneUlpForEveryExponent) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> xs;
  for (double v = -30; v <= 30; v += 0.00091) xs.push_back(static_cast<float>(v));
  for (double v = 1.2e-38; v < 3.4e38; v *= 1.0137)
    xs.push_back(static_cast<float>(v)), xs.push_back(-static_cast<float>(v));
  const long double half_pi = 1.570796326794896619231321691639751442L;
  auto near = [&](long double k) {
    float x = static_cast<float>(k * half_pi);
    for (int i = 0; i < 3; ++i) x = std::nextafter(x, 0.0f);
    for (int i = 0; i < 7; ++i, x = std::nextafter(x, inf)) xs.push_back(x);
  };
  for (int k = 1; k < 3000; ++k) near(k);
  for (float x : {0x1.f37c8ap+95f, -0x1.f37c8ap+95f}) xs.push_back(x);  // the nearest of all
  for (int j = 12; j < 63; ++j)
    for (int k = 1; k < 200; k += 2) near(std::ldexp(static_cast<long double>(k), j));
  uint32_t state = 12345;
  for (int i = 0; i < 100000; ++i) {
    state = state * 1664525u + 1013904223u;
    float x;
    std::memcpy(&x, &state, sizeof x);
    if (std::isfinite(x)) xs.push_back(x);
  }
  const int64_t n = static_cast<int64_t>(xs.size());
  Tensor t = loom::tensor(xs, {n});
  const std::vector<float> s = loom::sin(t).to_vector<float>();
  const std::vector<float> c = loom::cos(t).to_vector<float>();
  auto check = [&](const char* name, float x, float got, long double exact) {
    const float want = static_cast<float>(exact);
    if (std::fabs(want) < FLT_MIN) {  // subnormal results: runs flush them to zero
      EXPECT_LE(std::fabs(got), std::fabs(want)) << name << "(" << x << ")";
      return;
    }
    const float ulp = std::nextafter(std::fabs(want), inf) - std::fabs(want);
    ASSERT_LE(std::fabs(got - want), ulp)
        << name << "(" << std::hexfloat << x << ") = " << got << ", sinl/cosl " << want;
  };
  for (size_t i = 0; i < xs.size(); ++i) {
    check("sin", xs[i], s[i], std::sin(static_cast<long double>(xs[i])));
    check("cos", xs[i], c[i], std::cos(static_cast<long double>(xs[i])));
  }

  const std::vector<float> special = {0.0f, -0.0f, inf, -inf, std::nanf(""), FLT_MAX, -FLT_MAX};
  Tensor sp = loom::tensor(special, {static_cast<int64_t>(special.size())});
  const std::vector<float> ss = loom::sin(sp).to_vector<float>();
  const std::vector<float> cs = loom::cos(sp).to_vector<float>();
  EXPECT_EQ(ss[0], 0.0f);
  EXPECT_FALSE(std::signbit(ss[0]));
  EXPECT_EQ(ss[1], 0.0f);
  EXPECT_TRUE(std::signbit(ss[1])) << "sin(-0) = -0";
  EXPECT_EQ(cs[0], 1.0f);
  EXPECT_EQ(cs[1], 1.0f);
  for (size_t i = 2; i < 5; ++i) {
    EXPECT_TRUE(std::isnan(ss[i])) << special[i];
    EXPECT_TRUE(std::isnan(cs[i])) << special[i];
  }
  check("sin", FLT_MAX, ss[5], std::sin(static_cast<long double>(FLT_MAX)));
  check("cos", -FLT_MAX, cs[6], std::cos(static_cast<long double>(-FLT_MAX)));
}
