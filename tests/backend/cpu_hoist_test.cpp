// Rank-0 values inside a kernel's loops are computed once before the loops (emitter.cpp,
// hoisted()): an AdamW-like step whose step counts are incremented in the same graph (one
// count's update is a stage of the kernel that reads it), bias corrections by pow and exp in
// f64, used by elementwise stages, a row reduction and a column reduction; a rank-0 value
// that is itself a reduction; a rank-0 random draw. Each against the reference backend over
// several replays of a trace_once step, so the hoisted values must follow the state.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "loom/loom.h"
#include "loom/runtime/engine.h"

namespace {

using loom::DType;
using loom::Tensor;

Tensor data(loom::Shape s, float scale) {
  std::vector<float> v(static_cast<size_t>(s.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * static_cast<float>((i * 7919) % 101) - 0.5f;
  return loom::tensor(v, s);
}

// Three replays of a compiled step on `backend`; every output of every replay, read back.
std::vector<std::vector<double>> run(const std::string& backend) {
  loom::sync();
  loom::runtime::set_backend(backend);
  loom::runtime::clear_compile_cache();
  loom::manual_seed(5);
  Tensor step = loom::zeros({}, DType::Float64), own = loom::zeros({}, DType::Float64);
  Tensor p = data({64, 256}, 0.01f), m = data({64, 256}, 0.002f), q = data({256}, 0.01f),
         mq = data({256}, 0.003f);
  loom::sync();
  auto once = loom::compile(
      [&](const Tensor& g) {
        step.copy_(step + 1.0);
        Tensor c1 = loom::to(1.0 - loom::pow(loom::tensor(0.9), step), DType::Float32);
        Tensor c2 = loom::to(loom::sqrt(1.0 - loom::exp(step * std::log(0.99))), DType::Float32);
        m.copy_(m * 0.9 + g * 0.1);
        p.copy_(p - (m / c1) / (loom::abs(g) / c2 + 1e-3) * 0.01);
        Tensor rows = loom::sum(p * c1, {1});     // a row reduction reading c1
        Tensor cols = loom::sum(g / c2, {0});     // a column reduction reading c2
        Tensor centred = g - loom::mean(g) * c1;  // a rank-0 reduction, then c1
        Tensor noisy = g + loom::rand({}) * c2;   // a rank-0 draw
        // A count read only by q's update: its increment is a stage of q's kernel, before the
        // loop that reads it.
        own.copy_(own + 1.0);
        Tensor gq = loom::select(g, 0, 3);
        mq.copy_(mq * 0.9 + gq * 0.1);
        q.copy_(q - mq * loom::to(loom::pow(loom::tensor(0.75), own), DType::Float32));
        return std::vector<Tensor>{rows, cols, centred, noisy};
      },
      {.name = "hoist_step", .trace_once = true});
  std::vector<std::vector<double>> out;
  for (int k = 0; k < 3; ++k) {
    std::vector<Tensor> r = once(data({64, 256}, 0.02f + 0.01f * static_cast<float>(k)));
    for (const Tensor& t : r) out.push_back(loom::to(t, DType::Float64).to_vector<double>());
    out.push_back(loom::to(p, DType::Float64).to_vector<double>());
    out.push_back(loom::to(q, DType::Float64).to_vector<double>());
  }
  out.push_back(step.to_vector<double>());
  loom::sync();
  return out;
}

TEST(CpuHoist, RankZeroValuesInLoopsMatchTheReference) {
  const std::string previous(loom::runtime::current_backend().name());
  const auto want = run("ref");
  const auto got = run("cpu");
  loom::runtime::set_backend(previous);
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < got.size(); ++k) {
    ASSERT_EQ(got[k].size(), want[k].size()) << "output " << k;
    for (size_t i = 0; i < got[k].size(); ++i)
      ASSERT_NEAR(got[k][i], want[k][i], 2e-4 * (1 + std::abs(want[k][i])))
          << "output " << k << " element " << i;
  }
  EXPECT_EQ(got.back()[0], 3.0);  // the step count followed every replay
}

}  // namespace
