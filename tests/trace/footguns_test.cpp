// The tracing pitfalls, one test each: every one raises a TraceError whose message names
// what was done, where (the body, the call site) and what to do instead. Trace-time errors,
// so they are backend-independent and run on the default backend.
#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <tuple>
#include <vector>

#include "expect_error.h"
#include "loom/loom.h"

namespace {

using loom::Tensor;
using loom::testing::expect_error;

class Footguns : public ::testing::Test {
 protected:
  void SetUp() override {
    loom::sync();
    loom::reset_metrics();
  }
  void TearDown() override { loom::sync(); }
};

// A value read inside a body (it does not exist yet): the message names the body and the
// call site of the scan.
TEST_F(Footguns, ReadingAValueInsideAScanBody) {
  expect_error<loom::TraceError>(
      [] {
        loom::scan(
            [](const Tensor& c, const Tensor& x) {
              (void)x.item<float>();
              return std::pair{c, x};
            },
            loom::zeros({}), loom::ones({3}));
      },
      {"[item]", "body of scan", "footguns_test.cpp", "ReadingAValueInsideAScanBody"});
  // The context is intact afterwards.
  EXPECT_EQ((loom::ones({2}) + 1).to_vector<float>(), (std::vector<float>{2, 2}));
}

TEST_F(Footguns, PrintingATensorInsideAScanBody) {
  expect_error<loom::TraceError>(
      [] {
        loom::scan(
            [](const Tensor& c, const Tensor& x) {
              std::ostringstream os;
              os << c;
              return std::pair{c, x};
            },
            loom::zeros({}), loom::ones({3}));
      },
      {"[to_vector]", "body of scan"});
}

TEST_F(Footguns, SyncInsideAWhileCondition) {
  expect_error<loom::TraceError>(
      [] {
        loom::while_loop(
            [](const Tensor& i) {
              loom::sync();
              return i > 0;
            },
            [](const Tensor& i) { return i - 1; }, std::tuple{loom::tensor(int64_t{3})});
      },
      {"[sync]", "cond of while_loop"});
}

TEST_F(Footguns, ReadingAValueInsideAssumePure) {
  auto f = loom::assume_pure([](const Tensor& x) {
    if (x.item<float>() > 0) return x;
    return -x;
  });
  expect_error<loom::TraceError>([&] { f(loom::ones({})); },
                                 {"[item]", "function of assume_pure", "footguns_test.cpp"});
}

// An in-place update of a tensor from outside the body: it must be a carry instead.
TEST_F(Footguns, InPlaceUpdateOfAnOutsideTensorInABody) {
  Tensor outside = loom::zeros({1});
  expect_error<loom::TraceError>(
      [&] {
        loom::scan(
            [&](const Tensor& c, const Tensor& x) {
              outside.add_(x);
              return std::pair{c, x};
            },
            loom::zeros({1}), loom::ones({3, 1}));
      },
      {"[in-place]", "f32[1]", "body of scan", "carry"});
}

// A tensor created in a body and kept outside it: using or reading it later.
TEST_F(Footguns, UsingATensorLeakedFromABody) {
  Tensor leaked;
  loom::scan(
      [&](const Tensor& c, const Tensor& x) {
        leaked = c + x;
        return std::pair{c, x};
      },
      loom::zeros({1}), loom::ones({3, 1}));
  expect_error<loom::TraceError>([&] { (void)(leaked + 1).is_pending(); },
                                 {"created while tracing", "return it"});
  expect_error<loom::TraceError>([&] { (void)leaked.to_vector<float>(); },
                                 {"created while tracing"});
}

// A body that returns a carry of another structure than the initial one.
TEST_F(Footguns, ScanBodyChangesTheCarryStructure) {
  expect_error<loom::TraceError>(
      [] {
        loom::scan([](const std::vector<Tensor>& c,
                      const Tensor& x) { return std::pair{std::vector<Tensor>{c[0]}, x}; },
                   std::vector<Tensor>{loom::zeros({1}), loom::zeros({1})}, loom::ones({3}));
      },
      {"[scan]", "structure", "carry", "[T,T]", "[T]"});
}

// assume_pure over a function that is not pure: check_purity names the first differing op.
TEST_F(Footguns, AssumePureOverAnImpureFunction) {
  int counter = 0;
  // Reads a host counter: the cached trace would bake in the first value.
  auto impure = loom::assume_pure(
      [&](const Tensor& x) { return x + static_cast<double>(counter++); }, {.check_purity = true});
  impure(loom::zeros({2}));
  expect_error<loom::TraceError>([&] { impure(loom::zeros({2})); },
                                 {"[assume_pure]", "traced differently", "constant", "became"});
  bool flag = false;
  auto branchy = loom::assume_pure(
      [&](const Tensor& x) { return flag ? loom::exp(x) : loom::tanh(x); }, {.check_purity = true});
  branchy(loom::zeros({2}));
  flag = true;
  expect_error<loom::TraceError>([&] { branchy(loom::zeros({2})); }, {"tanh", "exp", "became"});
  // A pure function passes the check on every hit.
  auto pure =
      loom::assume_pure([](const Tensor& x) { return loom::exp(x) * 2.0; }, {.check_purity = true});
  for (int i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(pure(loom::zeros({1})).item<float>(), 2.0f);
}

// A read inside a compile(step) with full_graph: the step would be cut in two.
TEST_F(Footguns, ReadingAValueInAFullGraphStep) {
  auto step = loom::compile(
      [](const Tensor& x) {
        if (loom::sum(x).item<float>() > 0) return x * 2.0;
        return x;
      },
      {.name = "branchy", .full_graph = true});
  expect_error<loom::TraceError>([&] { step(loom::ones({2})); },
                                 {"[item]", "'branchy'", "full_graph"});
  // Without full_graph the read is allowed (it cuts the graph).
  auto loose = loom::compile([](const Tensor& x) { return x * loom::sum(x).item<float>(); });
  EXPECT_EQ(loose(loom::ones({2})).to_vector<float>(), (std::vector<float>{2, 2}));
}

// A step whose graph changes from call to call beyond max_different_graphs.
TEST_F(Footguns, AStepThatTracesADifferentGraphEachCall) {
  int calls = 0;
  auto step = loom::compile(
      [&](const Tensor& x) {
        ++calls;
        return calls > 2 ? loom::exp(x) : loom::tanh(x);
      },
      {.name = "drifting", .max_different_graphs = 1});
  step(loom::ones({3}));
  step(loom::ones({3}));
  expect_error<loom::TraceError>(
      [&] { step(loom::ones({3})); },
      {"'drifting'", "max_different_graphs = 1", "tanh", "exp", "became"});
}

}  // namespace
