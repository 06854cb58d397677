// compile(step): one graph per call and trace_once against the untraced step (bit for bit
// over 20 training steps); its full_graph and max_different_graphs errors are in
// tests/trace/footguns_test.cpp.
#include <gtest/gtest.h>

#include <functional>

#include "expect_error.h"
#include "loom/loom.h"
#include "loom/runtime/engine.h"

namespace {

using loom::Tensor;
namespace nn = loom::nn;

class CompileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    loom::sync();
    loom::manual_seed(3);
    loom::reset_metrics();
  }
  void TearDown() override { loom::sync(); }
};

using loom::testing::expect_error;

TEST_F(CompileTest, OneGraphPerCallCompiledOnce) {
  Tensor w = loom::ones({4});
  auto step = loom::compile([&](const Tensor& x) { return loom::sum(x * w); }, {.name = "dot"});
  loom::sync();
  loom::reset_metrics();
  for (int i = 0; i < 5; ++i) {
    Tensor r = step(loom::full({4}, i));
    EXPECT_FALSE(r.is_pending());  // cut after
    EXPECT_EQ(r.item<float>(), 4 * i);
  }
  EXPECT_EQ(loom::metrics().compiles, 1);
}

struct Mlp : nn::Module {
  std::shared_ptr<nn::Linear> a, b;
  Mlp() {
    a = register_module("a", std::make_shared<nn::Linear>(6, 16));
    b = register_module("b", std::make_shared<nn::Linear>(16, 3));
  }
  Tensor forward(const Tensor& x) override { return (*b)(loom::relu((*a)(x))); }
};

// 20 training steps, with the step traced every time or traced once and replayed.
void train(bool trace_once, bool adamw, std::vector<std::vector<float>>* params,
           std::vector<float>* losses, int* traced) {
  loom::manual_seed(11);
  Mlp model;
  Tensor x = loom::randn({12, 6});
  Tensor y = loom::argmax(loom::randn({12, 3}), 1);
  std::unique_ptr<loom::optim::Optimizer> opt;
  if (adamw)
    opt = std::make_unique<loom::optim::AdamW>(model.parameters(), 0.01);
  else
    opt = std::make_unique<loom::optim::SGD>(model.parameters(), 0.1, 0.9, 1e-3);
  loom::sync();
  *traced = 0;
  auto body = [&](const Tensor& xb, const Tensor& yb) {
    ++*traced;
    Tensor loss = loom::cross_entropy(model(xb), yb);
    loss.backward();
    opt->step();
    opt->zero_grad();
    return loss;
  };
  auto step = loom::compile(body, {.name = "train", .trace_once = trace_once});
  for (int i = 0; i < 20; ++i) losses->push_back(step(x, y).item<float>());
  for (const Tensor& p : model.parameters()) params->push_back(p.to_vector<float>());
}

TEST_F(CompileTest, TraceOnceEqualsTheUntracedStepBitForBit) {
  for (bool adamw : {false, true}) {
    SCOPED_TRACE(adamw ? "AdamW" : "SGD momentum");
    std::vector<std::vector<float>> pa, pb;
    std::vector<float> la, lb;
    int ta = 0, tb = 0;
    train(false, adamw, &pa, &la, &ta);
    train(true, adamw, &pb, &lb, &tb);
    EXPECT_EQ(ta, 20);
    EXPECT_EQ(tb, 1);  // traced once, replayed 19 times
    EXPECT_EQ(la, lb);
    ASSERT_EQ(pa.size(), pb.size());
    for (size_t k = 0; k < pa.size(); ++k) EXPECT_EQ(pa[k], pb[k]) << "parameter " << k;
    EXPECT_LT(lb.back(), lb.front());
  }
}

// A loop that reads only loss.item(), no sync and no compile(): each read computes, with the
// loss, the parameters and optimizer state updated from it (SGD's momentum buffers, AdamW's
// moments and step count), so nothing stays pending, the loop compiles a fixed set of graphs,
// and the losses and parameters equal the loop that syncs every step bit for bit.
TEST_F(CompileTest, ALoopReadingOnlyTheLossIsSteady) {
  for (bool adamw : {false, true}) {
    SCOPED_TRACE(adamw ? "AdamW" : "SGD momentum");
    std::vector<float> losses[2];
    std::vector<std::vector<float>> params[2];
    for (int synced : {0, 1}) {
      loom::manual_seed(11);
      Mlp model;
      Tensor x = loom::randn({12, 6});
      Tensor y = loom::argmax(loom::randn({12, 3}), 1);
      std::unique_ptr<loom::optim::Optimizer> opt;
      if (adamw)
        opt = std::make_unique<loom::optim::AdamW>(model.parameters(), 0.01);
      else
        opt = std::make_unique<loom::optim::SGD>(model.parameters(), 0.1, 0.9, 1e-3);
      loom::sync();
      loom::reset_metrics();
      std::vector<int64_t> compiles;
      for (int i = 0; i < 40; ++i) {
        opt->zero_grad();
        Tensor loss = loom::cross_entropy(model(x), y);
        loss.backward();
        opt->step();
        if (synced) loom::sync();
        losses[synced].push_back(loss.item<float>());
        if (!synced) {
          EXPECT_EQ(loom::pending_graph_size(), 0) << "step " << i;
          compiles.push_back(loom::metrics().compiles);
        }
      }
      for (const Tensor& p : model.parameters()) params[synced].push_back(p.to_vector<float>());
      if (!synced) {
        EXPECT_EQ(std::vector<int64_t>(compiles.begin() + 3, compiles.end()),
                  std::vector<int64_t>(compiles.size() - 3, compiles[3]));
      }
    }
    EXPECT_EQ(losses[0], losses[1]);
    EXPECT_EQ(params[0], params[1]);
    EXPECT_LT(losses[0].back(), losses[0].front());
  }
}

// The first call records the step's graph and then syncs what it left pending: the two cut
// the same graph (one compile), whichever order the step made its results and updates in.
TEST_F(CompileTest, TraceOnceCompilesOnceWhateverItReturns) {
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE(variant);
    loom::manual_seed(11);
    Mlp model;
    loom::optim::AdamW opt(model.parameters(), 0.01);
    Tensor x = loom::randn({12, 6});
    Tensor y = loom::argmax(loom::randn({12, 3}), 1);
    loom::sync();
    loom::reset_metrics();
    auto step = loom::compile(
        [&](const Tensor& xb, const Tensor& yb) {
          Tensor loss = loom::cross_entropy(model(xb), yb);
          loss.backward();
          opt.step();
          opt.zero_grad();
          if (variant == 0) return std::pair{loss, loss * 2.0};  // results made last
          if (variant == 1) return std::pair{loss.detach() + 1.0, loss};
          return std::pair{model.a->weight * 1.0, loss};  // a result of the updated weights
        },
        {.name = "returns", .trace_once = true});
    for (int i = 0; i < 4; ++i) {
      auto [a, b] = step(x, y);
      EXPECT_FALSE(a.is_pending());
      EXPECT_FALSE(b.is_pending());
    }
    EXPECT_EQ(loom::metrics().compiles, 1);
  }
}

// Gradients a trace_once step writes (micro-batches accumulating into .grad, as torch does):
// a replay reads the leaf's grad of the call and gives the leaf its new one; starting a grad
// and accumulating into one are two entries, each traced once, against closed forms.
TEST_F(CompileTest, TraceOnceAccumulatesGradientsAcrossCalls) {
  Tensor w = loom::tensor<float>({1, 2}, {2}).requires_grad_();
  loom::sync();
  int traced = 0;
  auto micro = loom::compile(
      [&](const Tensor& x) {
        ++traced;
        Tensor loss = loom::sum(w * x);
        loss.backward();
        return loss;
      },
      {.name = "micro", .trace_once = true});
  const Tensor x = loom::tensor<float>({3, 4}, {2});
  for (int call = 1; call <= 3; ++call) {
    micro(x);
    EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{3.0f * call, 4.0f * call}));
  }
  w.reset_grad();  // zero_grad(set_to_none) between accumulations
  for (int call = 1; call <= 2; ++call) {
    micro(x);
    EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{3.0f * call, 4.0f * call}));
  }
  EXPECT_EQ(traced, 2);
  // A step that resets the grad itself first: any grad before the call fits.
  auto fresh = loom::compile(
      [&](const Tensor& xb) {
        w.reset_grad();
        Tensor loss = loom::sum(w * xb * xb);
        loss.backward();
        return loss;
      },
      {.name = "fresh", .trace_once = true});
  for (int call = 0; call < 3; ++call) {
    fresh(x);
    EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{9.0f, 16.0f}));
    if (call == 1) w.reset_grad();
  }
  // The backward outside, the update and the reset inside (a step of the optimizer alone):
  // each replay reads the grad of its call.
  auto update = loom::compile(
      [&](const Tensor& rate) {
        {
          loom::NoGradGuard no_grad;
          w.add_(w.grad() * rate);
        }
        w.reset_grad();
        return w;
      },
      {.name = "update", .trace_once = true});
  w.reset_grad();
  float w0 = w.to_vector<float>()[0];
  for (int call = 1; call <= 3; ++call) {
    loom::sum(w * static_cast<float>(call)).backward();  // dw = call
    update(loom::tensor(-0.5f));
    w0 -= 0.5f * static_cast<float>(call);
    EXPECT_EQ(w.to_vector<float>()[0], w0);
    EXPECT_FALSE(w.grad().defined());
  }
  // No grad at this call: not the recorded step (which reads one), but a trace of its own.
  EXPECT_THROW(update(loom::tensor(-0.5f)), loom::Error);
}

TEST_F(CompileTest, TraceOnceReplaysFreshRandomNumbersAndRetracesOnNewShapes) {
  int traced = 0;
  auto step = loom::compile(
      [&](const Tensor& x) {
        ++traced;
        return loom::dropout(x, 0.5);
      },
      {.trace_once = true});
  std::vector<float> a = step(loom::ones({64})).to_vector<float>();
  std::vector<float> b = step(loom::ones({64})).to_vector<float>();
  EXPECT_NE(a, b);
  EXPECT_EQ(traced, 1);
  step(loom::ones({32}));
  EXPECT_EQ(traced, 2);
}

}  // namespace
