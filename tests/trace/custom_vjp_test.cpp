// loom::CustomVjp: a user-defined backward replaces autodiff's; values and gradients against
// the same function without it, inside a scan against the unrolled loop, the backward traced
// once per use, and bad backwards.
#include <gtest/gtest.h>

#include <cmath>

#include "expect_error.h"
#include "loom/loom.h"

namespace {

using loom::Tensor;
using loom::testing::expect_error;

std::vector<double> dv(const Tensor& t) { return t.to_vector<double>(); }

// sin with its derivative written by hand; `calls` counts bwd's runs.
loom::CustomVjp custom_sin(int* calls) {
  return loom::CustomVjp(
      [](const std::vector<Tensor>& a) { return std::vector<Tensor>{loom::sin(a[0])}; },
      [](const std::vector<Tensor>& a) {
        return std::pair{std::vector<Tensor>{loom::sin(a[0])},
                         std::vector<Tensor>{loom::cos(a[0])}};
      },
      [calls](const std::vector<Tensor>& res, const std::vector<Tensor>& g) {
        ++*calls;
        return std::vector<Tensor>{g[0] * res[0]};
      });
}

TEST(CustomVjpTest, TheUsersBackwardReplacesAutodiff) {
  loom::CustomVjp sq([](const std::vector<Tensor>& a) { return std::vector<Tensor>{a[0] * a[0]}; },
                     [](const std::vector<Tensor>& a) {
                       return std::pair{std::vector<Tensor>{a[0] * a[0]},
                                        std::vector<Tensor>{a[0]}};
                     },
                     [](const std::vector<Tensor>& res, const std::vector<Tensor>& g) {
                       return std::vector<Tensor>{g[0] * res[0] * 3.0};
                     });
  Tensor x = loom::tensor(std::vector<double>{1, -2, 0.5}, {3}).requires_grad_();
  Tensor y = sq({x})[0];
  loom::sum(y).backward();
  EXPECT_EQ(dv(y), (std::vector<double>{1, 4, 0.25}));
  EXPECT_EQ(dv(x.grad()), (std::vector<double>{3, -6, 1.5}));  // 3 g x, not 2 g x
}

// A scan of h = sin(h * w) over 5 weights: values and both gradients equal the unrolled loop
// with loom::sin, and bwd was traced once for the body's one use.
TEST(CustomVjpTest, InsideAScanEqualsTheUnrolledLoop) {
  loom::manual_seed(3);
  const Tensor h0 = loom::to(loom::randn({4}), loom::DType::Float64);
  const Tensor ws = loom::to(loom::randn({5, 4}), loom::DType::Float64);
  int calls = 0;
  loom::CustomVjp s = custom_sin(&calls);
  std::vector<double> got[3], want[3];
  for (int custom = 0; custom < 2; ++custom) {
    Tensor h = h0.detach().requires_grad_(), w = ws.detach().requires_grad_();
    Tensor out;
    if (custom) {
      out =
          loom::scan(
              [&](const Tensor& c, const Tensor& wk) { return std::pair{s({c * wk})[0], c}; }, h, w)
              .first;
    } else {
      out = h;
      for (int64_t k = 0; k < 5; ++k) out = loom::sin(out * loom::select(w, 0, k));
    }
    loom::sum(out).backward();
    std::vector<double>* r = custom ? got : want;
    r[0] = dv(out);
    r[1] = dv(h.grad());
    r[2] = dv(w.grad());
  }
  EXPECT_EQ(calls, 1);
  for (int k = 0; k < 3; ++k) {
    ASSERT_EQ(got[k].size(), want[k].size());
    for (size_t i = 0; i < got[k].size(); ++i) EXPECT_NEAR(got[k][i], want[k][i], 1e-12) << k;
  }
}

TEST(CustomVjpTest, BadBackwardsAreClearErrors) {
  Tensor x = loom::ones({2}).requires_grad_();
  auto fwd = [](const std::vector<Tensor>& a) {
    return std::pair{std::vector<Tensor>{a[0] * 2.0}, std::vector<Tensor>{}};
  };
  auto id = [](const std::vector<Tensor>& a) { return a; };
  loom::CustomVjp two(id, fwd, [](const std::vector<Tensor>&, const std::vector<Tensor>& g) {
    return std::vector<Tensor>{g[0], g[0]};
  });
  expect_error<loom::TraceError>([&] { two({x}); },
                                 {"[custom_vjp] bwd returned 2 gradient(s) for 1 argument(s)"});
  loom::CustomVjp shape(id, fwd, [](const std::vector<Tensor>&, const std::vector<Tensor>& g) {
    return std::vector<Tensor>{loom::sum(g[0])};
  });
  expect_error<loom::ShapeError>(
      [&] { shape({x}); }, {"[custom_vjp] bwd's gradient 0 is f32[] but argument 0 is f32[2]"});
  loom::CustomVjp dtype(id, fwd, [](const std::vector<Tensor>&, const std::vector<Tensor>& g) {
    return std::vector<Tensor>{loom::to(g[0], loom::DType::Float64)};
  });
  expect_error<loom::DTypeError>(
      [&] { dtype({x}); }, {"[custom_vjp] bwd's gradient 0 is f64[2] but argument 0 is f32[2]"});
  Tensor w = loom::ones({2}).requires_grad_();
  loom::CustomVjp reads(
      id,
      [w](const std::vector<Tensor>& a) {
        return std::pair{std::vector<Tensor>{a[0] * w}, std::vector<Tensor>{}};
      },
      [](const std::vector<Tensor>&, const std::vector<Tensor>& g) { return g; });
  expect_error<loom::TraceError>([&] { reads({x}); },
                                 {"fwd reads a tensor f32[2] that requires grad from outside"});
  loom::sync();
}

}  // namespace
