// Lazy tensors and sync: recording, materialization, in-place ops, the bounded pending
// graph, the compile cache and host scalars.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "loom/loom.h"
#include "loom/runtime/engine.h"

namespace {

using loom::Shape;
using loom::Tensor;

class LazyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    loom::sync();
    loom::runtime::clear_compile_cache();
    loom::reset_metrics();
  }
};

TEST_F(LazyTest, OpsRecordAndSyncRuns) {
  Tensor x = loom::tensor(std::vector<float>{1, 2, 3}, {3});
  Tensor y = loom::exp(x) + 1;
  EXPECT_TRUE(y.is_pending());
  EXPECT_FALSE(x.is_pending());
  EXPECT_EQ(loom::metrics().executions, 0);
  loom::sync();
  EXPECT_FALSE(y.is_pending());
  EXPECT_EQ(loom::metrics().executions, 1);
  EXPECT_EQ(loom::pending_graph_size(), 0);
  std::vector<float> v = y.to_vector<float>();
  EXPECT_NEAR(v[2], std::exp(3.0f) + 1, 1e-4);
  EXPECT_EQ(loom::metrics().executions, 1);  // reading a materialized tensor runs nothing
}

TEST_F(LazyTest, SyncMaterializesEveryLivePendingTensorInOneGraph) {
  Tensor x = loom::ones({4});
  Tensor a = x + 1, b = x * 3, c = a - b;
  loom::sync();
  EXPECT_EQ(loom::metrics().executions, 1);
  EXPECT_EQ(loom::metrics().compiles, 1);
  for (const Tensor* t : {&a, &b, &c}) EXPECT_FALSE(t->is_pending());
  EXPECT_EQ(c.to_vector<float>(), std::vector<float>(4, -1));
}

TEST_F(LazyTest, ReadingAValueMaterializesOnlyWhatItNeeds) {
  Tensor x = loom::ones({4});
  Tensor a = x + 1;
  Tensor b = loom::exp(x) * 7;
  EXPECT_EQ(a.to_vector<float>(), std::vector<float>(4, 2));
  EXPECT_TRUE(b.is_pending());
  EXPECT_EQ(loom::metrics().executions, 1);
  EXPECT_THROW(a.item<float>(), loom::ShapeError);
  EXPECT_NEAR(b.to_vector<float>()[0], 7 * std::exp(1.0f), 1e-4);
}

TEST_F(LazyTest, PartialMaterializationIsReusedNotRecomputed) {
  Tensor x = loom::ones({4});
  Tensor a = loom::exp(x) + 1;
  EXPECT_NEAR(a.to_vector<float>()[0], std::exp(1.0f) + 1, 1e-5);
  Tensor b = a * 2;
  std::string ir = loom::pending_ir({b});
  EXPECT_EQ(ir.find("exp"), std::string::npos) << ir;  // a's value is an input now
  EXPECT_NEAR(b.to_vector<float>()[3], 2 * (std::exp(1.0f) + 1), 1e-5);
}

// A read computes, with the tensors it reads, the live tensors whose pending graph shares a
// computed node with them (an in-place update of a parameter from the loss's graph), so that
// nothing the next step builds on stays pending; unrelated pending tensors stay pending.
TEST_F(LazyTest, AReadComputesTheLiveTensorsItsGraphReaches) {
  Tensor x = loom::ones({4});
  Tensor a = loom::exp(x) + 1;
  Tensor b = a * 2;             // built on a's computed nodes
  Tensor c = loom::sin(x) * 7;  // shares only the source x
  Tensor w = loom::zeros({4});
  w.add_(a * -0.5);  // an in-place update reaching a
  EXPECT_NEAR(a.to_vector<float>()[0], std::exp(1.0f) + 1, 1e-5);
  EXPECT_EQ(loom::metrics().executions, 1);
  EXPECT_FALSE(b.is_pending());
  EXPECT_FALSE(w.is_pending());
  EXPECT_TRUE(c.is_pending());
  EXPECT_NEAR(b.to_vector<float>()[3], 2 * (std::exp(1.0f) + 1), 1e-5);
  EXPECT_NEAR(w.to_vector<float>()[1], -(std::exp(1.0f) + 1) / 2, 1e-5);
  EXPECT_EQ(loom::metrics().executions, 1);
  EXPECT_NEAR(c.to_vector<float>()[2], 7 * std::sin(1.0f), 1e-5);
}

TEST_F(LazyTest, InPlaceOpsAreSeenThroughEveryCopy) {
  Tensor x = loom::tensor(std::vector<float>{1, 2}, {2});
  Tensor alias = x;
  x.add_(loom::tensor(std::vector<float>{10, 20}, {2}));
  EXPECT_EQ(alias.to_vector<float>(), (std::vector<float>{11, 22}));
  x.add_(loom::tensor(1.0f));  // broadcast source
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{12, 23}));
  x.copy_(loom::tensor(std::vector<int64_t>{5}, {1}));  // broadcast and convert
  EXPECT_EQ(alias.dtype(), loom::DType::Float32);
  EXPECT_EQ(alias.to_vector<float>(), (std::vector<float>{5, 5}));
  x.zero_();
  EXPECT_EQ(alias.to_vector<float>(), (std::vector<float>{0, 0}));
  Tensor d = x.detach();
  x.add_(loom::ones({2}));
  EXPECT_EQ(d.to_vector<float>(), (std::vector<float>{0, 0})) << "detach snapshots the value";
}

TEST_F(LazyTest, ValuesWrittenInPlaceAreSeenByLaterOps) {
  Tensor x = loom::ones({2});
  loom::sync();
  Tensor keep = x * 2;      // x enters the pending graph as data
  x.add_(loom::ones({2}));  // x is pending again
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{2, 2}));  // partial: keep stays pending
  Tensor y = x * 10;  // must read x's new buffer, not its old data node
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{20, 20}));
  EXPECT_EQ(keep.to_vector<float>(), (std::vector<float>{2, 2}));
  x.copy_(loom::full({2}, 5.0));
  loom::sync();
  EXPECT_EQ((x + 0).to_vector<float>(), (std::vector<float>{5, 5}));
}

TEST_F(LazyTest, PendingGraphStaysBoundedWithoutSync) {
  Tensor x = loom::ones({8});
  Tensor y;
  for (int i = 0; i < 100000; ++i) y = x * static_cast<double>(i);  // each y dies next turn
  EXPECT_LE(loom::pending_graph_size(), 3 * (1 << 14));
  EXPECT_GT(loom::metrics().pending_compactions, 0);
  loom::reset_metrics();
  loom::sync();
  // The graph cut at the sync holds only the live result: one product and its inputs.
  EXPECT_LE(loom::metrics().sync_nodes, 4);
  EXPECT_EQ(y.to_vector<float>()[0], 99999.0f);
}

// A compaction walk is skipped while nothing can have become garbage (a live chain). These
// loops make garbage in the other ways: an in-place update that replaces a value, and partial
// reads (the read tensor leaves the pending list and its node turns into data, so the chain
// before it loses its last user). The pending graph must stay bounded all along.
TEST_F(LazyTest, PendingGraphStaysBoundedWhenUpdatesOrReadsMakeTheGarbage) {
  constexpr int64_t kBound = 3 * (1 << 14);
  {
    Tensor x = loom::ones({2});
    Tensor w = loom::zeros({2});
    int64_t peak = 0;
    for (int i = 0; i < 100000; ++i) {
      w.copy_(x * static_cast<double>(i));
      peak = std::max(peak, loom::pending_graph_size());
    }
    EXPECT_LE(peak, kBound);
    EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{99999, 99999}));
  }
  loom::sync();
  loom::reset_metrics();
  Tensor acc = loom::zeros({2});
  Tensor one = loom::ones({2});
  Tensor keep = one * 2.0;  // pending throughout: every read below is partial
  int64_t peak = 0;
  for (int i = 0; i < 100000; ++i) {
    acc = acc + one;
    if (i % 100 == 99) ASSERT_EQ(acc.to_vector<float>()[0], i + 1.0f);
    peak = std::max(peak, loom::pending_graph_size());
  }
  EXPECT_LE(peak, kBound);
  EXPECT_GT(loom::metrics().pending_compactions, 0);
  EXPECT_EQ(keep.to_vector<float>(), (std::vector<float>{2, 2}));
}

TEST_F(LazyTest, LongLiveChainsStayCorrectAcrossCompactions) {
  Tensor acc = loom::zeros({2});
  Tensor one = loom::ones({2});
  for (int i = 0; i < 20000; ++i) acc = acc + one;  // live chain longer than the GC threshold
  EXPECT_EQ(acc.to_vector<float>(), (std::vector<float>{20000, 20000}));
}

// A compaction renumbers the pending graph. Backward wraps its gradients one by one; when the
// sweep pushed the graph past the compaction threshold, the first wrap used to compact and
// leave the other gradients' raw values pointing at other nodes (wrong types, crashes).
TEST_F(LazyTest, GradientsStayCorrectWhenWrappingThemCompacts) {
  constexpr int kParams = 8;
  int64_t compactions = 0;
  for (int offset = 0; offset < 400; offset += 7) {
    loom::sync();
    loom::reset_metrics();
    std::vector<Tensor> ws;
    for (int k = 0; k < kParams; ++k) ws.push_back(loom::ones({4}).requires_grad_());
    Tensor x = loom::ones({4});
    Tensor junk;  // dead nodes that bring the pending graph near the threshold
    for (int i = 0; i < (1 << 13) - offset; ++i) junk = x * static_cast<double>(i);
    junk = Tensor();
    Tensor loss = loom::sum(ws[0] * 1.0);
    for (int k = 1; k < kParams; ++k) loss = loss + loom::sum(ws[k] * static_cast<double>(k + 1));
    loss.backward();
    for (int k = 0; k < kParams; ++k) {
      ASSERT_TRUE(ws[k].grad().defined());
      ASSERT_EQ(ws[k].grad().dtype(), loom::DType::Float32)
          << "offset " << offset << " param " << k;
      EXPECT_EQ(ws[k].grad().to_vector<float>(), std::vector<float>(4, k + 1.0f))
          << "offset " << offset << " param " << k;
    }
    compactions += loom::metrics().pending_compactions;
  }
  EXPECT_GT(compactions, 0);  // the sweep crossed the threshold somewhere
}

// A partial read turns the read tensor's node into data; a later use of the materialized
// tensor adds a second parameter node of the same data slot. A compaction keeps both nodes and
// must keep the slot's buffer for both (it used to move it out for the first, leaving the
// second an empty buffer).
TEST_F(LazyTest, PartialReadsStayCorrectAcrossCompactions) {
  Tensor acc = loom::zeros({2});
  Tensor one = loom::ones({2});
  std::vector<Tensor> keep;  // pending until the end
  for (int i = 0; i < 20000; ++i) {
    acc = acc + one;
    if (i % 100 == 99) {
      keep.push_back(acc * 2.0);                       // reads acc's node, made data by the read
      EXPECT_EQ(acc.to_vector<float>()[0], i + 1.0f);  // partial: keep stays pending
      keep.push_back(acc * 3.0);                       // a parameter node of the same slot
    }
  }
  EXPECT_GT(loom::metrics().pending_compactions, 0);
  for (size_t j = 0; j < keep.size(); ++j) {
    const float v = 100.0f * static_cast<float>(j / 2 + 1) * (j % 2 ? 3.0f : 2.0f);
    ASSERT_EQ(keep[j].to_vector<float>(), (std::vector<float>{v, v})) << j;
  }
}

TEST_F(LazyTest, ChangingHostScalarDoesNotRecompile) {
  Tensor w = loom::ones({16});
  loom::sync();  // w is data from here on; step 0 then has the same structure as the others
  loom::reset_metrics();
  for (int step = 0; step < 20; ++step) {
    double lr = 0.1 / (1 + step);
    w = w - w * lr + static_cast<double>(step);
    loom::sync();
  }
  EXPECT_EQ(loom::metrics().compiles, 1);
  EXPECT_EQ(loom::metrics().cache_hits, 19);
  double want = 1;
  for (int step = 0; step < 20; ++step) want = want - want * (0.1 / (1 + step)) + step;
  EXPECT_NEAR(w.to_vector<float>()[0], want, 1e-3);
}

TEST_F(LazyTest, RandomDrawsEveryStepCompileOnce) {
  loom::manual_seed(3);
  std::vector<float> firsts;
  for (int step = 0; step < 5; ++step) {
    Tensor r = loom::rand({4}) + loom::randn({4});
    loom::sync();
    firsts.push_back(r.to_vector<float>()[0]);
  }
  EXPECT_EQ(loom::metrics().compiles, 1);
  EXPECT_NE(firsts[0], firsts[1]);
}

TEST_F(LazyTest, CacheHitsOnOtherDataMissesOnOtherShape) {
  auto step = [](const Tensor& x) { return loom::sum(loom::tanh(x) * 2, {0}); };
  Tensor a = step(loom::tensor(std::vector<float>{1, 2, 3, 4}, {2, 2}));
  loom::sync();
  Tensor b = step(loom::tensor(std::vector<float>{5, 6, 7, 8}, {2, 2}));
  loom::sync();
  EXPECT_EQ(loom::metrics().compiles, 1);
  EXPECT_EQ(loom::metrics().cache_hits, 1);
  Tensor c = step(loom::ones({3, 2}));
  loom::sync();
  EXPECT_EQ(loom::metrics().compiles, 2);
  Tensor d = step(loom::to(loom::ones({2, 2}), loom::DType::Float64));
  loom::sync();
  EXPECT_EQ(loom::metrics().compiles, 3);
  EXPECT_NEAR(b.to_vector<float>()[1], 2 * (std::tanh(6.0) + std::tanh(8.0)), 1e-5);
}

TEST_F(LazyTest, MetricsReportNamesEveryCounter) {
  Tensor x = loom::ones({2}) * 2;
  loom::sync();
  std::string r = loom::metrics_report();
  for (const char* k : {"compiles", "cache_hits", "executions", "trace_seconds", "compile_seconds",
                        "execute_seconds"})
    EXPECT_NE(r.find(k), std::string::npos) << r;
  EXPECT_GT(loom::metrics().ops_traced, 0);
  EXPECT_GT(loom::metrics().trace_seconds, 0);
}

TEST_F(LazyTest, PrintsLikeTorch) {
  auto str = [](const Tensor& t) {
    std::ostringstream os;
    os << t;
    return os.str();
  };
  EXPECT_EQ(str(loom::tensor(std::vector<float>{1, 3}, {2, 1})), "tensor([[1.], [3.]])");
  EXPECT_EQ(str(loom::tensor(std::vector<float>{1.5f, 2}, {2})), "tensor([1.5000, 2.0000])");
  EXPECT_EQ(str(loom::tensor(int64_t{13})), "tensor(13)");
  EXPECT_EQ(str(loom::tensor(std::vector<bool>{true, false}, {2})), "tensor([True, False])");
  EXPECT_EQ(str(loom::tensor(std::vector<double>{0.5}, {1})), "tensor([0.5000], dtype=float64)");
  EXPECT_EQ(str(loom::zeros({0, 3})), "tensor([], size=(0, 3))");
  EXPECT_EQ(str(loom::tensor(std::vector<float>{NAN, INFINITY}, {2})), "tensor([nan, inf])");
  EXPECT_EQ(str(loom::tensor(std::vector<float>{1e-5f, 1}, {2})),
            "tensor([1.0000e-05, 1.0000e+00])");
}

}  // namespace
