// Autograd mechanics (per-op gradients are rows of tests/ops/op_harness_test.cpp): the rule
// registry, a composite against float64 central differences, scan against the unrolled loop (saved
// residuals and remat), assume_pure against the undecorated function, fori_loop, the functional
// transforms, NoGradGuard and detach, a training loop that compiles its step once, and the errors.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>

#include "loom/autodiff/autodiff.h"
#include "loom/ir/op_kind.h"
#include "loom/loom.h"
#include "loom/runtime/engine.h"

namespace {

using loom::Shape;
using loom::Tensor;
using Inputs = std::vector<Tensor>;
using Fn = std::function<Tensor(const Inputs&)>;

class Autograd : public ::testing::Test {
 protected:
  void SetUp() override {
    loom::sync();
    loom::reset_metrics();
  }
  void TearDown() override { loom::sync(); }
};

// Deterministic values in [lo, hi), distinct.
std::vector<double> values(int64_t n, double lo, double hi, int salt) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    double u = std::fmod(0.6180339887 * static_cast<double>(i * 7 + salt * 13 + 1), 1.0);
    v[static_cast<size_t>(i)] = lo + (hi - lo) * u;
  }
  return v;
}

Tensor f64(const std::vector<double>& v, Shape s) { return loom::tensor(v, std::move(s)); }

// sum(f(x) * w) with fixed weights w, so that every output element matters.
Tensor weighted(const Tensor& y) {
  std::vector<double> w = values(y.numel(), -1.5, 1.5, 99);
  return loom::sum(loom::to(y, loom::float64) * f64(w, y.shape()));
}

void expect_close(const std::vector<double>& a, const std::vector<double>& b, double tol = 1e-12) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], tol) << i;
}

struct Arg {
  Shape shape;
  double lo = -1.5, hi = 1.5;
};

// Backward's gradients against central differences of the same function, in float64.
void check(const char* name, const Fn& f, const std::vector<Arg>& args, double tol = 1e-6,
           double eps = 1e-6) {
  SCOPED_TRACE(name);
  std::vector<std::vector<double>> xs;
  for (size_t i = 0; i < args.size(); ++i)
    xs.push_back(values(args[i].shape.numel(), args[i].lo, args[i].hi, static_cast<int>(i)));
  Inputs leaves;
  for (size_t i = 0; i < args.size(); ++i)
    leaves.push_back(f64(xs[i], args[i].shape).requires_grad_());
  Tensor loss = weighted(f(leaves));
  ASSERT_TRUE(loss.requires_grad());
  loss.backward();
  loom::sync();
  auto eval = [&](const std::vector<std::vector<double>>& v) {
    Inputs in;
    for (size_t i = 0; i < args.size(); ++i) in.push_back(f64(v[i], args[i].shape));
    return weighted(f(in)).item<double>();
  };
  for (size_t i = 0; i < args.size(); ++i) {
    ASSERT_TRUE(leaves[i].grad().defined()) << "input " << i << " got no gradient";
    std::vector<double> g = leaves[i].grad().to_vector<double>();
    ASSERT_EQ(g.size(), xs[i].size());
    for (size_t e = 0; e < xs[i].size(); ++e) {
      auto plus = xs, minus = xs;
      plus[i][e] += eps;
      minus[i][e] -= eps;
      double fd = (eval(plus) - eval(minus)) / (2 * eps);
      EXPECT_NEAR(g[e], fd, tol * std::max(1.0, std::abs(fd))) << "input " << i << " element " << e;
    }
  }
}

TEST_F(Autograd, EveryOpHasARuleOrIsMarkedNotDifferentiable) {
  using loom::autodiff::RuleKind;
  for (int op = 0; op < loom::ir::kNumOps; ++op) {
    auto kind = static_cast<loom::ir::OpKind>(op);
    SCOPED_TRACE(std::string(loom::ir::op_name(kind)));
    RuleKind k = loom::autodiff::rule_kind(kind);
    const uint32_t t = loom::ir::info(kind).traits;
    if (t & (loom::ir::kCompare | loom::ir::kBoolOnly | loom::ir::kRandom | loom::ir::kSource)) {
      EXPECT_EQ(k, RuleKind::NotDifferentiable);
    }
    if (t & loom::ir::kRegion) {
      EXPECT_EQ(k, RuleKind::ControlFlow);
    }
  }
}

// A composite of several ops (the per-op gradients are rows of tests/ops/op_harness_test.cpp).
TEST_F(Autograd, MlpAgainstFiniteDifferences) {
  check("mlp",
        [](const Inputs& x) {
          return loom::tanh(loom::matmul(loom::gelu(loom::matmul(x[0], x[1])), x[2]));
        },
        {{{2, 3}}, {{3, 4}}, {{4, 2}}});
}

// An empty contraction (k = 0): the product is zeros and so are both gradients, including
// a batched A against one B, whose dB folds the batch into rows.
TEST_F(Autograd, ProductsOverAnEmptyContraction) {
  for (Shape as : {Shape{4, 0}, Shape{2, 4, 0}}) {
    Tensor a = loom::zeros(as, loom::float64).requires_grad_();
    Tensor b = loom::zeros({0, 6}, loom::float64).requires_grad_();
    Tensor y = loom::matmul(a, b);
    loom::sum(y * 2.0).backward();
    for (double v : y.to_vector<double>()) EXPECT_EQ(v, 0.0);
    EXPECT_EQ(y.shape().back(), 6);
    EXPECT_EQ(a.grad().shape(), as);
    EXPECT_EQ(b.grad().shape(), (Shape{0, 6}));
  }
}

TEST_F(Autograd, AccumulatesAcrossBackwardCallsAndStopsAtDetachAndNoGrad) {
  Tensor x = f64({1, 2, 3}, {3}).requires_grad_();
  loom::sum(x * x).backward();
  loom::sum(x * 3.0).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{5, 7, 9}));
  Tensor y = f64({1, 2}, {2}).requires_grad_();
  Tensor d = (y * 2.0).detach();
  EXPECT_FALSE(d.requires_grad());
  Tensor z;
  {
    loom::NoGradGuard guard;
    EXPECT_FALSE(loom::grad_enabled());
    z = y * 5.0;
  }
  EXPECT_FALSE(z.requires_grad());
  loom::sum(y * y + d * y + z * y).backward();
  // d and z are constants: 2y + d + z = 2y + 2y + 5y
  EXPECT_EQ(y.grad().to_vector<double>(), (std::vector<double>{9, 18}));
}

TEST_F(Autograd, ReadingTheLossBeforeBackwardKeepsItDifferentiable) {
  Tensor w = f64({0.5, -1}, {2}).requires_grad_();
  Tensor loss = loom::sum(w * w);
  EXPECT_DOUBLE_EQ(loss.item<double>(), 1.25);
  loss.backward();
  EXPECT_EQ(w.grad().to_vector<double>(), (std::vector<double>{1, -2}));
}

TEST_F(Autograd, ExplicitGradientAndErrors) {
  Tensor x = f64({1, 2}, {2}).requires_grad_();
  (x * x).backward(f64({1, 10}, {2}));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{2, 40}));
  EXPECT_THROW((x * x).backward(), loom::AutodiffError);  // two elements, no gradient given
  EXPECT_THROW((x * x).backward(f64({1}, {1})), loom::ShapeError);
  EXPECT_THROW(loom::sum(f64({1}, {1})).backward(), loom::AutodiffError);  // no grad needed
  Tensor y = x * 2.0;
  EXPECT_THROW(y.requires_grad_(), loom::AutodiffError);        // not a leaf
  EXPECT_THROW(x.add_(f64({1, 1}, {2})), loom::AutodiffError);  // leaf updated in place
  {
    loom::NoGradGuard guard;
    x.add_(f64({1, 1}, {2}));  // allowed: an optimizer update
  }
  EXPECT_EQ(x.to_vector<double>(), (std::vector<double>{2, 3}));
  Tensor s = loom::sum(x * x);
  loom::sync();
  try {
    s.backward();
    ADD_FAILURE() << "expected an AutodiffError";
  } catch (const loom::AutodiffError& e) {
    EXPECT_NE(std::string(e.what()).find("before sync"), std::string::npos) << e.what();
  }
}

TEST_F(Autograd, FunctionalGradAndValueAndGradOverTrees) {
  using Dict = std::map<std::string, Tensor>;
  auto f = [](const Dict& p, const Tensor& x) {
    return loom::sum(loom::tanh(loom::matmul(x, p.at("w")) + p.at("b")));
  };
  Dict p{{"w", f64(values(6, -1, 1, 3), {3, 2})}, {"b", f64({0.1, -0.2}, {2})}};
  Tensor x = f64(values(6, -1, 1, 4), {2, 3});
  auto [v, g] = loom::value_and_grad(f)(p, x);
  Dict g2 = loom::grad(f)(p, x);
  // The same gradients through backward on leaves.
  Tensor w = p.at("w").detach().requires_grad_(), b = p.at("b").detach().requires_grad_();
  f(Dict{{"w", w}, {"b", b}}, x).backward();
  expect_close(g.at("w").to_vector<double>(), w.grad().to_vector<double>());
  expect_close(g2.at("b").to_vector<double>(), b.grad().to_vector<double>());
  EXPECT_FALSE(p.at("w").grad().defined());  // functional: no grad() touched
  EXPECT_NEAR(v.item<double>(), f(p, x).item<double>(), 1e-12);
}

// ---- control flow ----------------------------------------------------------------------

// Gradients of a scan equal those of the same loop unrolled, for a set of bodies.
void check_scan(const char* name, bool reverse, bool remat) {
  SCOPED_TRACE(std::string(name) + (reverse ? " reverse" : "") + (remat ? " remat" : ""));
  const int64_t T = 5, D = 3;
  auto make = [&] {
    return std::vector<Tensor>{f64(values(D * D, -0.8, 0.8, 1), {D, D}).requires_grad_(),
                               f64(values(T * D, -1, 1, 2), {T, D}).requires_grad_(),
                               f64(values(D, -0.5, 0.5, 3), {D}).requires_grad_(),
                               f64(values(2, 0.5, 1.5, 4), {2}).requires_grad_()};
  };
  // carry {h, s}; x row; captured W and scale; y = h * scale[0]
  auto step = [](const std::map<std::string, Tensor>& c, const Tensor& x, const Tensor& W,
                 const Tensor& scale) {
    Tensor h = loom::tanh(loom::squeeze(loom::matmul(loom::unsqueeze(c.at("h"), 0), W), 0) + x);
    Tensor s = c.at("s") + loom::sum(h * h) * scale[1];
    return std::pair{std::map<std::string, Tensor>{{"h", h}, {"s", s}}, h * scale[0]};
  };
  using C = std::map<std::string, Tensor>;
  std::vector<Tensor> a = make(), b = make();
  {
    auto [c, ys] = loom::scan([&](const C& c, const Tensor& x) { return step(c, x, a[0], a[3]); },
                              C{{"h", a[2]}, {"s", loom::zeros({}, loom::float64)}}, a[1],
                              {.reverse = reverse, .remat = remat});
    weighted(ys).backward();
    (c.at("s") * 0.7 + loom::sum(c.at("h"))).backward();
  }
  {
    C c{{"h", b[2]}, {"s", loom::zeros({}, loom::float64)}};
    std::vector<Tensor> ys(T);
    for (int64_t i = 0; i < T; ++i) {
      int64_t t = reverse ? T - 1 - i : i;
      auto [n, y] = step(c, b[1][t], b[0], b[3]);
      c = n;
      ys[t] = y;
    }
    weighted(loom::stack(ys, 0)).backward();
    (c.at("s") * 0.7 + loom::sum(c.at("h"))).backward();
  }
  for (size_t i = 0; i < a.size(); ++i) {
    std::vector<double> ga = a[i].grad().to_vector<double>(), gb = b[i].grad().to_vector<double>();
    ASSERT_EQ(ga.size(), gb.size());
    for (size_t e = 0; e < ga.size(); ++e) EXPECT_NEAR(ga[e], gb[e], 1e-10) << "input " << i;
  }
}

TEST_F(Autograd, ScanMatchesTheUnrolledLoop) {
  for (bool reverse : {false, true})
    for (bool remat : {false, true}) check_scan("tanh matmul tree carry captured", reverse, remat);
}

TEST_F(Autograd, ScanAgainstFiniteDifferencesAndNested) {
  check("scan cumprod",
        [](const Inputs& x) {
          return loom::scan(
                     [](const Tensor& c, const Tensor& v) {
                       Tensor n = c * v;
                       return std::pair{n, n};
                     },
                     x[1], x[0])
              .second;
        },
        {{{4, 2}}, {{2}}});
  check("nested scan",
        [](const Inputs& x) {
          return loom::scan(
                     [](const Tensor& c, const Tensor& row) {
                       Tensor inner = loom::scan(
                                          [](const Tensor& a, const Tensor& v) {
                                            return std::pair{loom::sin(a + v), std::tuple<>{}};
                                          },
                                          c, row)
                                          .first;
                       return std::pair{inner * c, std::tuple<>{}};
                     },
                     x[1], x[0])
              .first;
        },
        {{{3, 2}}, {{}}});
  check("fori static",
        [](const Inputs& x) {
          return std::get<0>(loom::fori_loop(
              0, 4,
              [&](const Tensor& i, const Tensor& h) {
                return loom::tanh(h * x[1] + loom::to(i, loom::float64));
              },
              x[0]));
        },
        {{{3}}, {{3}}});
}

TEST_F(Autograd, RematAndSavedResidualsGiveEqualGradientsAndDifferentGraphs) {
  auto run = [](bool remat) {
    Tensor w = f64(values(4, -1, 1, 5), {4}).requires_grad_();
    Tensor xs = f64(values(24, -1, 1, 6), {6, 4});
    auto [c, ys] = loom::scan(
        [&](const Tensor& h, const Tensor& x) {
          Tensor n = loom::sin(loom::exp(h * w) * x);
          return std::pair{n, std::tuple<>{}};
        },
        loom::zeros({4}, loom::float64), xs, {.remat = remat});
    loom::sum(c).backward();
    std::string ir = loom::pending_ir({w.grad()});
    return std::pair{w.grad().to_vector<double>(), ir};
  };
  auto [g_saved, ir_saved] = run(false);
  auto [g_remat, ir_remat] = run(true);
  ASSERT_EQ(g_saved.size(), g_remat.size());
  for (size_t i = 0; i < g_saved.size(); ++i) EXPECT_NEAR(g_saved[i], g_remat[i], 1e-12);
  EXPECT_NE(ir_remat.find("remat=1"), std::string::npos);
  EXPECT_NE(ir_saved, ir_remat);
}

TEST_F(Autograd, AssumePureGradientsEqualTheUndecoratedFunction) {
  auto body = [](const Tensor& x, const Tensor& w) { return loom::gelu(loom::matmul(x, w)) * x; };
  auto pure = loom::assume_pure(body);
  auto run = [&](bool decorated, bool x_grad) {
    Tensor x = f64(values(6, -1, 1, 7), {2, 3});
    if (x_grad) x.requires_grad_();
    Tensor w = f64(values(9, -1, 1, 8), {3, 3}).requires_grad_();
    for (int i = 0; i < 2; ++i) {  // a trace, then a hit
      Tensor y = decorated ? pure(x, w) : body(x, w);
      weighted(y).backward();
    }
    return std::pair{x_grad ? x.grad().to_vector<double>() : std::vector<double>{},
                     w.grad().to_vector<double>()};
  };
  for (bool x_grad : {true, false}) {
    auto [gx, gw] = run(true, x_grad);
    auto [hx, hw] = run(false, x_grad);
    ASSERT_EQ(gw.size(), hw.size());
    for (size_t i = 0; i < gw.size(); ++i) EXPECT_NEAR(gw[i], hw[i], 1e-12);
    ASSERT_EQ(gx.size(), hx.size());
    for (size_t i = 0; i < gx.size(); ++i) EXPECT_NEAR(gx[i], hx[i], 1e-12);
  }
}

TEST_F(Autograd, WhileLoopBackwardPointsToForiAndScan) {
  Tensor x = f64({1}, {}).requires_grad_();
  auto [y] = loom::while_loop([](const Tensor& v) { return v < 10.0; },
                              [](const Tensor& v) { return v * 2.0; }, std::tuple{x});
  try {
    y.backward();
    ADD_FAILURE() << "expected an AutodiffError";
  } catch (const loom::AutodiffError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("while_loop"), std::string::npos) << m;
    EXPECT_NE(m.find("fori_loop"), std::string::npos) << m;
  }
}

TEST_F(Autograd, TrainingAnMlpCompilesItsStepOnce) {
  loom::manual_seed(0);
  Tensor w1 = (loom::randn({8, 16}) * 0.3).detach(), w2 = (loom::randn({16, 3}) * 0.3).detach();
  Tensor x = loom::randn({32, 8});
  Tensor target = loom::argmax(loom::matmul(x, loom::randn({8, 3})), 1);
  loom::sync();
  w1.requires_grad_();
  w2.requires_grad_();
  double first = 0, last = 0;
  loom::reset_metrics();
  for (int step = 0; step < 100; ++step) {
    Tensor loss = loom::cross_entropy(loom::matmul(loom::relu(loom::matmul(x, w1)), w2), target);
    loss.backward();
    {
      loom::NoGradGuard guard;
      w1.copy_(w1 - w1.grad() * 0.5);
      w2.copy_(w2 - w2.grad() * 0.5);
      w1.reset_grad();  // zero_grad (set to none)
      w2.reset_grad();
    }
    loom::sync();
    if (step == 0) first = loss.item<float>();
    last = loss.item<float>();
  }
  EXPECT_LT(last, first * 0.5);
  EXPECT_EQ(loom::metrics().compiles, 1);
}

}  // namespace
