// loom::pure_callback against the same function in loom's ops (CPU and reference), inside the
// loop tools, through its vjp, once per use; and its errors.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

#include "expect_error.h"
#include "loom/loom.h"
#include "loom/runtime/engine.h"

namespace {

using loom::HostArray;
using loom::Tensor;
using loom::testing::expect_error;

std::vector<double> dv(const Tensor& t) { return t.to_vector<double>(); }

class PureCallbackTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    loom::sync();
    previous_ = std::string(loom::runtime::current_backend().name());
    loom::runtime::set_backend(GetParam());
  }
  void TearDown() override {
    loom::sync();
    loom::runtime::set_backend(previous_);
  }
  std::string previous_;
};

// sin on the host, elementwise over float64; `calls` counts its runs.
loom::HostCallback host_sin(int* calls) {
  return loom::HostCallback("host_sin", [calls](const std::vector<HostArray>& a) {
    ++*calls;
    HostArray r = HostArray::zeros(a[0].type);
    for (int64_t i = 0; i < r.numel(); ++i) r.data<double>()[i] = std::sin(a[0].data<double>()[i]);
    return std::vector<HostArray>{r};
  });
}

// Its VJP: (x, sin x, g) -> g cos x.
loom::HostCallback host_sin_vjp(int* calls) {
  return loom::HostCallback("host_sin_vjp", [calls](const std::vector<HostArray>& a) {
    ++*calls;
    HostArray r = HostArray::zeros(a[0].type);
    for (int64_t i = 0; i < r.numel(); ++i)
      r.data<double>()[i] = a[2].data<double>()[i] * std::cos(a[0].data<double>()[i]);
    return std::vector<HostArray>{r};
  });
}

loom::TensorType type_of(const Tensor& t) { return {t.dtype(), t.shape()}; }

TEST_P(PureCallbackTest, ResultsEqualTheSameFunctionInLoom) {
  int calls = 0;
  loom::HostCallback s = host_sin(&calls);
  // Two results of other types: the row sums as float32 and the argmax as int64.
  loom::HostCallback stats("row_stats", [](const std::vector<HostArray>& a) {
    const int64_t rows = a[0].type.shape[0], cols = a[0].type.shape[1];
    HostArray sums = HostArray::zeros({loom::DType::Float32, {rows}});
    HostArray best = HostArray::zeros({loom::DType::Int64, {rows}});
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const double v = a[0].data<double>()[r * cols + c];
        sums.data<float>()[r] += static_cast<float>(v);
        if (v > a[0].data<double>()[r * cols + best.data<int64_t>()[r]])
          best.data<int64_t>()[r] = c;
      }
    return std::vector<HostArray>{sums, best};
  });
  loom::manual_seed(1);
  Tensor x = loom::to(loom::randn({3, 5}), loom::DType::Float64);
  Tensor y = loom::pure_callback(s, {type_of(x)}, {x * 2.0})[0] + 1.0;
  std::vector<Tensor> st =
      loom::pure_callback(stats, {{loom::DType::Float32, {3}}, {loom::DType::Int64, {3}}}, {y});
  const std::vector<double> want = dv(loom::sin(x * 2.0) + 1.0);
  const std::vector<double> got = dv(y);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_DOUBLE_EQ(got[i], want[i]);
  const std::vector<float> sums = st[0].to_vector<float>();
  const std::vector<double> want_sums = dv(loom::sum(loom::sin(x * 2.0) + 1.0, {1}));
  for (size_t r = 0; r < 3; ++r) EXPECT_NEAR(sums[r], want_sums[r], 1e-5);
  EXPECT_EQ(st[1].to_vector<int64_t>(), loom::argmax(y, 1).to_vector<int64_t>());
  EXPECT_EQ(calls, 1);
}

// h = sin(h * w_k) over 4 weights: the scan with the callback equals the unrolled loop with
// loom::sin in values and in both gradients (through the callback's vjp), and the vjp runs
// once per step of the backward.
TEST_P(PureCallbackTest, InsideAScanWithItsVjpEqualsTheUnrolledLoop) {
  loom::manual_seed(3);
  const Tensor h0 = loom::to(loom::randn({4}), loom::DType::Float64);
  const Tensor ws = loom::to(loom::randn({4, 4}), loom::DType::Float64);
  int calls = 0, vjp_calls = 0;
  loom::HostCallback s = host_sin(&calls), ds = host_sin_vjp(&vjp_calls);
  std::vector<double> got[3], want[3];
  for (int host = 0; host < 2; ++host) {
    Tensor h = h0.detach().requires_grad_(), w = ws.detach().requires_grad_();
    Tensor out;
    if (host) {
      out = loom::scan(
                [&](const Tensor& c, const Tensor& wk) {
                  Tensor z = c * wk;
                  return std::pair{loom::pure_callback(s, {type_of(z)}, {z}, {.vjp = ds})[0], c};
                },
                h, w)
                .first;
    } else {
      out = h;
      for (int64_t k = 0; k < 4; ++k) out = loom::sin(out * loom::select(w, 0, k));
    }
    loom::sum(out).backward();
    std::vector<double>* r = host ? got : want;
    r[0] = dv(out);
    r[1] = dv(h.grad());
    r[2] = dv(w.grad());
  }
  // The forward runs it 4 times and the scan's backward recomputes each step's body (a node of
  // several results is recomputed, not saved: src/autodiff/control_flow.cpp); the vjp runs once
  // per step.
  EXPECT_EQ(calls, 8);
  EXPECT_EQ(vjp_calls, 4);
  for (int k = 0; k < 3; ++k) {
    ASSERT_EQ(got[k].size(), want[k].size());
    for (size_t i = 0; i < got[k].size(); ++i) EXPECT_NEAR(got[k][i], want[k][i], 1e-12) << k;
  }
}

TEST_P(PureCallbackTest, InsideWhileAssumePureAndCompile) {
  int calls = 0;
  loom::HostCallback s = host_sin(&calls);
  auto hsin = [&](const Tensor& x) { return loom::pure_callback(s, {type_of(x)}, {x})[0]; };
  // while: x = sin(x) + 1 until x > 1.9 (a fixed point near 1.93 is approached from 0.5).
  auto [x, n] = loom::while_loop(
      [](const Tensor& x, const Tensor&) { return x < 1.9; },
      [&](const Tensor& x, const Tensor& n) { return std::tuple{hsin(x) + 1.0, n + 1}; },
      std::tuple{loom::tensor(0.5), loom::tensor(int64_t{0})});
  double hx = 0.5;
  int64_t hn = 0;
  while (hx < 1.9) hx = std::sin(hx) + 1.0, ++hn;
  EXPECT_DOUBLE_EQ(x.item<double>(), hx);
  EXPECT_EQ(n.item<int64_t>(), hn);
  EXPECT_EQ(calls, hn);
  // assume_pure: traced once, the callback runs at every call.
  auto f = loom::assume_pure([&](const Tensor& a) { return hsin(a) * 2.0; });
  calls = 0;
  for (double v : {0.25, 0.5}) EXPECT_DOUBLE_EQ(f(loom::tensor(v)).item<double>(), 2 * std::sin(v));
  EXPECT_EQ(calls, 2);
  // compile(trace_once): the same.
  auto step = loom::compile([&](const Tensor& a) { return hsin(a) - a; }, {.trace_once = true});
  for (double v : {1.0, 2.0, 3.0})
    EXPECT_DOUBLE_EQ(step(loom::tensor(v)).item<double>(), std::sin(v) - v);
  EXPECT_EQ(calls, 5);
}

TEST_P(PureCallbackTest, AResultOfTheWrongTypeIsAnExecError) {
  loom::HostCallback wrong("wrong_shape", [](const std::vector<HostArray>& a) {
    return std::vector<HostArray>{HostArray::zeros({a[0].type.dtype, {2}})};
  });
  Tensor x = loom::ones({3});
  Tensor y = loom::pure_callback(wrong, {type_of(x)}, {x})[0];
  expect_error<loom::ExecError>([&] { y.to_vector<float>(); },
                                {"[pure_callback] the callback 'wrong_shape' returned f32[2]",
                                 "expected f32[3]", "pure_callback_test.cpp"});
  expect_error<loom::ExecError>([&] { y.to_vector<float>(); }, {"wrong_shape"});  // poisoned
  Tensor z = loom::pure_callback(wrong, {{loom::DType::Float64, {2}}}, {x})[0];
  expect_error<loom::ExecError>([&] { z.to_vector<double>(); }, {"returned f32[2]", "f64[2]"});
  expect_error<loom::ShapeError>([&] { loom::pure_callback(wrong, {}, {x}); },
                                 {"declares no results"});
  expect_error<loom::ShapeError>(
      [&] { loom::pure_callback(wrong, {{loom::DType::Float32, {-1}}}, {x}); }, {"pure_callback"});
}

// An exception thrown by the callback reaches the caller as itself; the tensors that depend on
// the call hold it, everything else stays usable, and a later run calls the callback again.
TEST_P(PureCallbackTest, AnExceptionInTheCallbackPropagatesAndLoomStaysUsable) {
  bool fail = true;
  loom::HostCallback flaky("flaky", [&fail](const std::vector<HostArray>& a) {
    if (fail) throw std::runtime_error("flaky failed on purpose");
    return std::vector<HostArray>{a[0]};
  });
  Tensor x = loom::ones({3}) * 2.0;
  Tensor y = loom::pure_callback(flaky, {type_of(x)}, {x})[0] + 1.0;
  Tensor other = x * 5.0;
  try {
    y.to_vector<float>();
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "flaky failed on purpose");
  }
  EXPECT_THROW(y.to_vector<float>(), std::runtime_error);
  EXPECT_EQ(other.to_vector<float>(), (std::vector<float>{10, 10, 10}));
  fail = false;
  Tensor y2 = loom::pure_callback(flaky, {type_of(x)}, {x})[0] + 1.0;
  EXPECT_EQ(y2.to_vector<float>(), (std::vector<float>{3, 3, 3}));
}

TEST_P(PureCallbackTest, AGradientWithoutAVjpIsAnAutodiffError) {
  int calls = 0;
  loom::HostCallback s = host_sin(&calls);
  Tensor x = loom::tensor(std::vector<double>{0.5, 1.0}, {2}).requires_grad_();
  Tensor y = loom::pure_callback(s, {type_of(x)}, {x})[0];
  expect_error<loom::AutodiffError>([&] { loom::sum(y).backward(); },
                                    {"[pure_callback]", "'host_sin' has no VJP", "vjp"});
  // Without a gradient through it, the call is fine next to differentiated work.
  Tensor w = loom::tensor(std::vector<double>{2.0}, {1}).requires_grad_();
  Tensor logged = loom::pure_callback(s, {type_of(x)}, {x.detach()})[0];
  loom::sum(w * 3.0).backward();
  EXPECT_EQ(dv(w.grad()), (std::vector<double>{3.0}));
  EXPECT_DOUBLE_EQ(dv(logged)[0], std::sin(0.5));
}

INSTANTIATE_TEST_SUITE_P(Backends, PureCallbackTest, ::testing::Values("cpu", "ref"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
