// Recovery after a run-time error (the trial's recover.cpp): a failed run poisons only the
// tensors that depend on the op that failed, the error names the line that traced the op and
// the graph's sync site; and a partial read keeps the other values its run computed (the
// trial's grad_reads.cpp: gradients read one by one cost one execution).
#include <gtest/gtest.h>

#include <string>

#include "expect_error.h"
#include "loom/loom.h"

namespace {

using loom::Tensor;
using loom::testing::expect_error;

std::string line_here(int line) { return "recovery_test.cpp:" + std::to_string(line); }

TEST(Recovery, FailedRunPoisonsOnlyWhatDependsOnTheFailingOp) {
  loom::sync();
  Tensor good = loom::arange(0, 3) * 2.0;  // pending, unrelated to the bad index
  Tensor index = loom::tensor(std::vector<int64_t>{7}, {1});
  const int op_line = __LINE__ + 1;
  Tensor bad = loom::index_select(loom::arange(0, 3), 0, index);
  Tensor later = bad + 1;  // depends on the failing op: poisoned too
  const int sync_line = __LINE__ + 1;
  expect_error<loom::ExecError>([] { loom::sync(); },
                                {"[index_select]", "7", line_here(op_line), line_here(sync_line)});
  // The unrelated tensor is still computed, by a later sync, while the bad one lives.
  EXPECT_EQ(good.to_vector<double>(), (std::vector<double>{0, 2, 4}));
  loom::sync();
  // Reading a poisoned tensor, or using it, rethrows its error.
  expect_error<loom::ExecError>([&] { bad.to_vector<float>(); },
                                {"[index_select]", line_here(op_line)});
  expect_error<loom::ExecError>([&] { later.item<float>(); },
                                {"[index_select]", line_here(op_line)});
  expect_error<loom::ExecError>([&] { Tensor t = bad * 2; }, {"[index_select]"});
  EXPECT_FALSE(bad.is_pending());
  // Fresh work runs; a poisoned tensor takes a new value in place.
  EXPECT_EQ(loom::sum(loom::ones({4})).item<float>(), 4.0f);
  bad.copy_(loom::ones({1}));
  EXPECT_EQ(bad.item<float>(), 1.0f);
}

TEST(Recovery, EmbeddingNamesItsCallSite) {
  loom::sync();
  Tensor w = loom::ones({3, 2});
  const int op_line = __LINE__ + 1;
  Tensor e = loom::embedding(loom::tensor(std::vector<int64_t>{0, 5}, {2}), w);
  expect_error<loom::ExecError>([&] { e.to_vector<float>(); },
                                {"[index_select]", "5", line_here(op_line)});
  EXPECT_EQ(loom::sum(w).item<float>(), 6.0f);
}

TEST(Recovery, CrossEntropyTargetNamesItsCallSite) {
  loom::sync();
  Tensor logits = loom::zeros({2, 3});
  const int op_line = __LINE__ + 1;
  Tensor loss = loom::cross_entropy(logits, loom::tensor(std::vector<int64_t>{1, 9}, {2}));
  expect_error<loom::ExecError>([&] { loss.item<float>(); }, {"[gather]", "9", line_here(op_line)});
  EXPECT_EQ(loom::sum(logits).item<float>(), 0.0f);
}

// A run that fails without naming an op (an allocation failure) poisons every tensor it would
// have produced; the thread keeps working.
TEST(Recovery, AllocationFailurePoisonsItsRunOnly) {
  loom::sync();
  Tensor g2 = loom::ones({3}) + 1.0;
  Tensor huge = loom::zeros({int64_t{1} << 40}) + 1.0;
  expect_error<loom::ExecError>([] { loom::sync(); }, {"cannot allocate"});
  loom::sync();  // nothing of the failed run is pending any more
  expect_error<loom::ExecError>([&] { g2.to_vector<float>(); }, {"cannot allocate"});
  huge = Tensor();
  EXPECT_EQ(loom::sum(loom::ones({2})).item<float>(), 2.0f);
}

// Five gradients of a scan read one by one after backward() cost the executions (and
// compiles) of reading them after one sync().
struct Counts {
  int64_t executions, compiles;
  std::vector<std::vector<float>> grads;
};
Counts read_grads(bool sync_first) {
  loom::manual_seed(0);
  std::vector<Tensor> ws;
  for (int i = 0; i < 5; ++i) ws.push_back((loom::randn({8, 8}) * 0.05).detach().requires_grad_());
  Tensor xs = loom::randn({6, 4, 8});
  loom::sync();
  loom::reset_metrics();
  auto [h, ys] = loom::scan(
      [&](const Tensor& h, const Tensor& x) {
        Tensor n = h;
        for (auto& w : ws) n = loom::tanh(loom::matmul(n, w) + x);
        return std::pair{n, loom::sum(n)};
      },
      loom::zeros({4, 8}), xs);
  loom::sum(ys).backward();
  if (sync_first) loom::sync();
  Counts c;
  for (auto& w : ws) c.grads.push_back(w.grad().to_vector<float>());
  loom::Metrics m = loom::metrics();
  c.executions = m.executions;
  c.compiles = m.compiles + m.cache_hits;
  return c;
}

TEST(Recovery, GradientsReadOneByOneCostOneExecution) {
  Counts one_by_one = read_grads(false);
  Counts synced = read_grads(true);
  EXPECT_EQ(synced.executions, 1);
  EXPECT_EQ(one_by_one.executions, synced.executions);
  EXPECT_EQ(one_by_one.compiles, synced.compiles);
  EXPECT_EQ(one_by_one.grads, synced.grads);
}

// Index ops inside loop bodies name their own call line too (the error comes from the loop's
// node, whose body holds the op): a scan body, a while body, and a scan inside a scan.
TEST(Recovery, IndexOpsInLoopBodiesNameTheirCallSite) {
  loom::sync();
  Tensor table = loom::tensor(std::vector<float>{0, 1, 2}, {3});
  int scan_line = 0;
  auto [sum, seen] = loom::scan(
      [&](const Tensor& c, const Tensor& i) {
        scan_line = __LINE__ + 1;
        Tensor v = loom::index_select(table, 0, i);
        return std::pair{c + v, v};
      },
      loom::zeros({1}), loom::tensor(std::vector<int64_t>{1, 8}, {2, 1}));
  expect_error<loom::ExecError>([&] { sum.to_vector<float>(); },
                                {"[index_select]", "8", line_here(scan_line)});

  int while_line = 0;
  auto [k, acc] =
      loom::while_loop([](const Tensor& k, const Tensor&) { return k < 3; },
                       [&](const Tensor& k, const Tensor& acc) {
                         while_line = __LINE__ + 1;
                         Tensor w = loom::embedding(loom::reshape(k * 4, {1}), loom::ones({3, 1}));
                         return std::tuple{k + 1, acc + loom::reshape(w, {1})};
                       },
                       std::tuple{loom::tensor(int64_t{0}), loom::zeros({1})});
  expect_error<loom::ExecError>([&] { acc.to_vector<float>(); },
                                {"[index_select]", line_here(while_line)});

  int inner_line = 0;
  auto [outer, ys] = loom::scan(
      [&](const Tensor& c, const Tensor& i) {
        auto [inner, vs] = loom::scan(
            [&](const Tensor& d, const Tensor& j) {
              inner_line = __LINE__ + 1;
              Tensor v = loom::gather(table, 0, j + i);
              return std::pair{d + v, v};
            },
            c, loom::tensor(std::vector<int64_t>{0, 1}, {2, 1}));
        return std::pair{inner, i};
      },
      loom::zeros({1}), loom::tensor(std::vector<int64_t>{0, 5}, {2, 1}));
  expect_error<loom::ExecError>([&] { outer.to_vector<float>(); },
                                {"[gather]", line_here(inner_line)});
  EXPECT_EQ(loom::sum(table).item<float>(), 3.0f);  // unrelated work still runs
}

}  // namespace
