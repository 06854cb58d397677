// The cpu backend's step graph (step_graph.cpp): a small program's steps run as a dependency
// graph on the pool's threads. An MLP training step compiled with trace_once (its parameters
// updated in place in donated buffers, a reference fallback for the labels' gather, products
// with post-ops, independent bias and weight updates) against the same step run step by step,
// bit for bit over several steps; a failing fallback inside the graph raises its ExecError on
// the caller and leaves the pool working. Random programs are compared the same way in
// random_programs_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/onednn.h"
#include "backend/cpu/program.h"
#include "backend/cpu/thread_pool.h"
#include "loom/loom.h"
#include "loom/passes/pass.h"
#include "loom/runtime/engine.h"
#include "loom/trace/interop.h"

namespace loom {
namespace {

struct Mlp : nn::Module {
  std::shared_ptr<nn::Linear> a, b;
  Mlp() {
    a = register_module("a", std::make_shared<nn::Linear>(784, 256));
    b = register_module("b", std::make_shared<nn::Linear>(256, 10));
  }
  Tensor forward(const Tensor& x) override { return (*b)(relu((*a)(x))); }
};

class StepGraph : public ::testing::Test {
 protected:
  void SetUp() override {
    sync();
    previous_ = std::string(runtime::current_backend().name());
    runtime::set_backend("cpu");
  }
  void TearDown() override {
    sync();
    cpu::set_step_graph(cpu::StepGraphMode::Auto);
    runtime::clear_compile_cache();
    runtime::set_backend(previous_);
  }
  std::string previous_;
};

struct Trained {
  std::vector<std::vector<float>> params;
  std::vector<float> losses;
  int64_t graph_runs = 0;
};

// Four SGD steps of the MLP from seed 3, the step compiled once with trace_once.
Trained train(bool graph) {
  cpu::set_step_graph(graph ? cpu::StepGraphMode::Auto : cpu::StepGraphMode::Off);
  runtime::clear_compile_cache();
  manual_seed(3);
  Mlp model;
  optim::SGD opt(model.parameters(), 0.05);
  Tensor x = randn({64, 784});
  Tensor y = argmax(randn({64, 10}), 1);
  sync();
  auto step = compile(
      [&](const Tensor& xb, const Tensor& yb) {
        Tensor loss = cross_entropy(model(xb), yb);
        loss.backward();
        opt.step();
        opt.zero_grad();
        return loss;
      },
      {.name = "step_graph_mlp", .trace_once = true});
  Trained t;
  const int64_t before = cpu::step_graph_runs();
  for (int i = 0; i < 4; ++i) t.losses.push_back(step(x, y).item<float>());
  t.graph_runs = cpu::step_graph_runs() - before;
  for (const Tensor& p : model.parameters()) t.params.push_back(p.to_vector<float>());
  return t;
}

TEST_F(StepGraph, MlpTrainingStepsMatchStepByStepBitForBit) {
  const Trained plain = train(false), graph = train(true);
  EXPECT_EQ(plain.graph_runs, 0);
  EXPECT_GE(graph.graph_runs, 3) << "the trace_once step did not run as a step graph";
  ASSERT_EQ(plain.losses.size(), graph.losses.size());
  for (size_t i = 0; i < plain.losses.size(); ++i)
    EXPECT_EQ(std::memcmp(&plain.losses[i], &graph.losses[i], sizeof(float)), 0)
        << "loss of step " << i << ": " << plain.losses[i] << " vs " << graph.losses[i];
  EXPECT_LT(plain.losses.back(), plain.losses.front());  // it trains
  ASSERT_EQ(plain.params.size(), graph.params.size());
  for (size_t k = 0; k < plain.params.size(); ++k) {
    ASSERT_EQ(plain.params[k].size(), graph.params[k].size());
    EXPECT_EQ(std::memcmp(plain.params[k].data(), graph.params[k].data(),
                          plain.params[k].size() * sizeof(float)),
              0)
        << "parameter " << k << " differs after 4 steps";
  }
}

TEST_F(StepGraph, AFailingIndexStepRaisesOnTheCallerAndThePoolGoesOn) {
  cpu::set_step_graph(cpu::StepGraphMode::Always);  // its steps are too small to split
  runtime::clear_compile_cache();
  Tensor x = reshape(arange(0, 12), {3, 4});
  Tensor w = ones({4, 4});
  sync();
  const int64_t before = cpu::step_graph_runs();
  // Two independent branches, one of them a gather (an index step) with index 4 of a
  // 4-wide axis: the graph runs, the gather throws on whichever thread took it.
  auto program = [&](int64_t bad) {
    Tensor branch = exp(matmul(x, w) * 0.01);
    Tensor picked = gather(x * 2, 1, tensor(std::vector<int64_t>{0, bad, 1}, {3, 1}));
    return std::pair{sum(branch), sum(picked)};
  };
  for (int round = 0; round < 3; ++round) {
    auto [a, b] = program(4);
    EXPECT_THROW(sync(), ExecError) << "round " << round;
  }
  EXPECT_GE(cpu::step_graph_runs() - before, 3);
  // The same program with a good index: the pool and the executable still work.
  auto [a, b] = program(3);
  EXPECT_FLOAT_EQ(b.item<float>(), 2 * (0 + 7 + 9));
  double want = 0;
  for (int r = 0; r < 3; ++r) {
    double row = 0;
    for (int c = 0; c < 4; ++c) row += 4 * r + c;
    want += 4 * std::exp(0.01 * row);
  }
  EXPECT_NEAR(a.item<float>(), want, 1e-4 * want);
}

// Work that does not read an index step's result stays out of the kernels behind it:
// cross entropy counts its labels (for the mean) in a kernel of its own, not in the one that
// sums the loss behind the labels' gather, so the gradient, which needs only the count, does
// not wait for the gather.
TEST_F(StepGraph, WorkIndependentOfAFallbackIsNotMergedBehindIt) {
  Tensor logits = randn({64, 10});
  Tensor labels = tensor(std::vector<int64_t>(64, 3), {64});
  ir::Graph g = ir::parse(pending_ir({cross_entropy(logits, labels)}));
  passes::default_pipeline().run(g);
  cpu::Program p = cpu::compile_program(g, /*region=*/false);
  std::vector<int> gather_outs;
  for (const cpu::Step& st : p.plan.steps)
    if (st.kind == cpu::Step::Native)
      gather_outs.insert(gather_outs.end(), st.outs.begin(), st.outs.end());
  ASSERT_FALSE(gather_outs.empty());  // the gather
  int counts = 0;
  for (const cpu::Step& st : p.plan.steps) {
    if (st.kind != cpu::Step::Kernel) continue;
    bool count = false;
    for (const cpu::Stage& stage : p.plan.kernels[st.kernel].stages)
      count = count || (stage.reduce && g.node(stage.node).type.dtype == DType::Int64);
    if (!count) continue;
    ++counts;
    for (int b : p.kernels[st.kernel].bufs)
      EXPECT_EQ(std::count(gather_outs.begin(), gather_outs.end(), b), 0)
          << "the labels' count reads the gather's result (buffer " << b << ")";
  }
  EXPECT_EQ(counts, 1);
  sync();
}

// Row runs (cpu_backend.cpp): a stack of layers, x = gelu(x W^T + b) + x, each product in the
// same row parts reading the layer before only at its own rows, runs as one job with no join
// between layers; the values match the run that joins every product, bit for bit (the same
// parts compute the same rows), and the reference backend. A layer that reads the one before
// transposed (every row of it) ends the run before it; a stack of products too small to split
// makes no run.
class RowRuns : public StepGraph {};

std::vector<std::vector<float>> stack_values(bool row_runs, int64_t rows, bool transposed_read) {
  cpu::set_row_runs(row_runs);
  cpu::set_step_graph(cpu::StepGraphMode::Off);  // row runs are a step-by-step schedule
  runtime::clear_compile_cache();
  std::vector<Tensor> w, b;
  for (int l = 0; l < 6; ++l) {
    std::vector<float> wv(128 * 128), bv(128);
    for (size_t i = 0; i < wv.size(); ++i) wv[i] = 0.05f * std::sin(0.37f * i + l);
    for (size_t i = 0; i < bv.size(); ++i) bv[i] = 0.1f * std::cos(0.11f * i + l);
    w.push_back(tensor(wv, {128, 128}));
    b.push_back(tensor(bv, {128}));
  }
  std::vector<float> xv(static_cast<size_t>(rows * 128));
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = std::sin(0.013f * i);
  Tensor x = tensor(xv, {rows, 128});
  std::vector<Tensor> outs;
  for (int l = 0; l < 6; ++l) {
    x = gelu(matmul(x, transpose(w[l], 0, 1)) + b[l]) + x;
    // Layer 3 also feeds a product that reads it transposed: [128,rows] x [rows,128].
    if (transposed_read && l == 3) outs.push_back(matmul(transpose(x, 0, 1), x));
  }
  outs.push_back(x);
  std::vector<std::vector<float>> v;
  for (const Tensor& t : outs) v.push_back(t.to_vector<float>());
  cpu::set_row_runs(true);
  return v;
}

TEST_F(RowRuns, ALayerStackMatchesTheJoinedRunBitForBit) {
  for (bool transposed_read : {false, true}) {
    SCOPED_TRACE(transposed_read ? "a transposed read of layer 3" : "a plain stack");
    const int64_t before = cpu::row_runs_taken();
    auto joined = stack_values(false, 256, transposed_read);
    EXPECT_EQ(cpu::row_runs_taken(), before);
    auto runs = stack_values(true, 256, transposed_read);
    // Taken whenever the pool has threads to split the products across.
    if (cpu::ThreadPool::instance().size() >= 2) EXPECT_GT(cpu::row_runs_taken(), before);
    ASSERT_EQ(joined.size(), runs.size());
    for (size_t o = 0; o < joined.size(); ++o)
      EXPECT_EQ(std::memcmp(joined[o].data(), runs[o].data(), joined[o].size() * sizeof(float)), 0)
          << "output " << o;
    runtime::set_backend("ref");
    auto want = stack_values(false, 256, transposed_read);
    runtime::set_backend("cpu");
    for (size_t o = 0; o < want.size(); ++o)
      for (size_t i = 0; i < want[o].size(); ++i)
        ASSERT_NEAR(runs[o][i], want[o][i], 2e-4 * (1 + std::abs(want[o][i])))
            << "output " << o << " element " << i;
  }
  // 8 rows: one part per product, nothing to run in rows.
  const int64_t before = cpu::row_runs_taken();
  stack_values(true, 8, false);
  EXPECT_EQ(cpu::row_runs_taken(), before);
}

}  // namespace
}  // namespace loom
