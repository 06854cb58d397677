// Gradients through while_loop (and fori_loop with tensor bounds) are a loud AutodiffError
// naming the loop's call site and the differentiable alternatives (the trial's
// while_grad_min.cpp returned silently with no gradient); loops off the gradient's path, and
// scans whose first carry is an integer, still differentiate.
#include <gtest/gtest.h>

#include <string>

#include "expect_error.h"
#include "loom/loom.h"

namespace {

using loom::Tensor;
using loom::testing::expect_error;

std::tuple<Tensor, Tensor> powers(const Tensor& w) {
  return loom::while_loop(
      [](const Tensor& i, const Tensor&) { return i > int64_t{0}; },
      [&](const Tensor& i, const Tensor& x) { return std::tuple{i - int64_t{1}, x * w}; },
      std::tuple{loom::tensor(int64_t{3}), loom::ones({})});
}

TEST(WhileGrad, BackwardThroughCapturedLeafRaisesNamingTheCallSite) {
  Tensor w = loom::full({}, 2.0).requires_grad_();
  auto [i, x] = powers(w);
  expect_error<loom::AutodiffError>([&] { x.backward(); },
                                    {"[backward]", "while_loop called at while_grad_test.cpp:",
                                     "fori_loop with integer bounds", "scan"});
  EXPECT_FALSE(w.grad().defined());
}

TEST(WhileGrad, BackwardThroughCarriedLeafRaises) {
  Tensor x0 = loom::full({}, 1.5).requires_grad_();
  auto [i, x] = loom::while_loop(
      [](const Tensor& i, const Tensor&) { return i > int64_t{0}; },
      [](const Tensor& i, const Tensor& x) { return std::tuple{i - int64_t{1}, x * 2.0}; },
      std::tuple{loom::tensor(int64_t{3}), x0});
  expect_error<loom::AutodiffError>([&] { loom::sum(x * x).backward(); },
                                    {"while_loop called at while_grad_test.cpp:"});
}

TEST(WhileGrad, ForiLoopWithTensorBoundsRaises) {
  Tensor w = loom::full({}, 2.0).requires_grad_();
  auto [f] = loom::fori_loop(
      loom::tensor(int64_t{0}), loom::tensor(int64_t{3}),
      [&](const Tensor&, const Tensor& f) { return f * w; }, loom::ones({}));
  expect_error<loom::AutodiffError>([&] { f.backward(); },
                                    {"while_grad_test.cpp:", "fori_loop with tensor bounds"});
}

TEST(WhileGrad, FunctionalGradRaises) {
  auto f = [](const Tensor& w) { return std::get<1>(powers(w)); };
  expect_error<loom::AutodiffError>([&] { (void)loom::grad(f)(loom::full({}, 2.0)); },
                                    {"[grad]", "while_loop called at while_grad_test.cpp:"});
  expect_error<loom::AutodiffError>([&] { (void)loom::value_and_grad(f)(loom::full({}, 2.0)); },
                                    {"while_loop called at"});
}

TEST(WhileGrad, LoopOffTheGradientPathDoesNotRaise) {
  Tensor w = loom::full({}, 2.0).requires_grad_();
  auto [i, x] = powers(w);  // active, but the loss does not read it
  Tensor loss = w * w * 3.0;
  loss.backward();
  EXPECT_DOUBLE_EQ(w.grad().item<float>(), 12.0);  // d(3 w^2)/dw at 2
  EXPECT_FLOAT_EQ(x.item<float>(), 8.0f);
}

TEST(WhileGrad, ScanWithAnIntegerFirstCarryDifferentiates) {
  // carries (count: i64, p: f32): p = w^3 after 3 steps; dp/dw = 3 w^2 = 12 at w = 2.
  Tensor w = loom::full({}, 2.0).requires_grad_();
  using C = std::pair<Tensor, Tensor>;
  auto [c, ys] = loom::scan(
      [&](const C& c, const Tensor& x) {
        return std::pair{C{c.first + int64_t{1}, c.second * w}, x};
      },
      C{loom::tensor(int64_t{0}), loom::ones({})}, loom::ones({3}));
  c.second.backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_FLOAT_EQ(w.grad().item<float>(), 12.0f);
  EXPECT_EQ(c.first.item<int64_t>(), 3);
}

TEST(WhileGrad, WhileInsideAScanBodyRaises) {
  Tensor w = loom::full({}, 2.0).requires_grad_();
  auto [h, ys] = loom::scan(
      [&](const Tensor& h, const Tensor& x) {
        auto [i, y] = loom::while_loop(
            [](const Tensor& i, const Tensor&) { return i > int64_t{0}; },
            [&](const Tensor& i, const Tensor& y) { return std::tuple{i - int64_t{1}, y * w}; },
            std::tuple{loom::tensor(int64_t{2}), h});
        return std::pair{y + x, x};
      },
      loom::ones({}), loom::ones({2}));
  expect_error<loom::AutodiffError>([&] { h.backward(); }, {"while loop", "scan"});
}

}  // namespace
