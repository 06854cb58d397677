// The compile cache: keys, hits, misses, LRU eviction, and the debug-build structural check.
#include <gtest/gtest.h>

#include "loom/core/config.h"
#include "loom/ir/builder.h"
#include "loom/loom.h"
#include "loom/runtime/engine.h"

namespace {

using namespace loom;

ir::Graph unary_graph(ir::OpKind op, Shape s, DType dt = DType::Float32) {
  ir::Graph g;
  ir::Builder b(g);
  ir::Value x = b.parameter({dt, s});
  g.outputs().push_back(b.unary(op, x));
  return g;
}

std::vector<Buffer> inputs_for(const ir::Graph& g) {
  std::vector<Buffer> in;
  for (ir::NodeId p : g.params()) in.push_back(Buffer::allocate(g.node(p).type.nbytes()));
  return in;
}

class CacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    runtime::clear_compile_cache();
    runtime::set_compile_cache_capacity(config().cache_size);
    reset_metrics();
  }
  void TearDown() override { runtime::set_compile_cache_capacity(config().cache_size); }
};

TEST_F(CacheTest, SameStructureHitsOtherStructureMisses) {
  ir::Graph a = unary_graph(ir::OpKind::Exp, {4});
  runtime::run_graph(a, inputs_for(a));
  runtime::run_graph(unary_graph(ir::OpKind::Exp, {4}), inputs_for(a));
  EXPECT_EQ(metrics().compiles, 1);
  EXPECT_EQ(metrics().cache_hits, 1);
  ir::Graph other_op = unary_graph(ir::OpKind::Log, {4});
  runtime::run_graph(other_op, inputs_for(other_op));
  ir::Graph other_shape = unary_graph(ir::OpKind::Exp, {5});
  runtime::run_graph(other_shape, inputs_for(other_shape));
  ir::Graph other_dtype = unary_graph(ir::OpKind::Exp, {4}, DType::Float64);
  runtime::run_graph(other_dtype, inputs_for(other_dtype));
  EXPECT_EQ(metrics().compiles, 4);
  EXPECT_EQ(metrics().executions, 5);
  EXPECT_EQ(runtime::compile_cache_size(), 4);
}

TEST_F(CacheTest, LruEvictsTheLeastRecentlyUsed) {
  runtime::set_compile_cache_capacity(2);
  ir::Graph g1 = unary_graph(ir::OpKind::Exp, {1}), g2 = unary_graph(ir::OpKind::Exp, {2}),
            g3 = unary_graph(ir::OpKind::Exp, {3});
  runtime::compile_cached(g1);
  runtime::compile_cached(g2);
  runtime::compile_cached(g1);  // g1 is now the most recent
  runtime::compile_cached(g3);  // evicts g2
  EXPECT_EQ(metrics().cache_evictions, 1);
  EXPECT_EQ(runtime::compile_cache_size(), 2);
  reset_metrics();
  runtime::compile_cached(g1);
  EXPECT_EQ(metrics().cache_hits, 1);
  runtime::compile_cached(g2);
  EXPECT_EQ(metrics().compiles, 1);
}

TEST_F(CacheTest, ExecutableChecksItsInputs) {
  ir::Graph g = unary_graph(ir::OpKind::Exp, {4});
  std::vector<Buffer> none;
  EXPECT_THROW(runtime::run_graph(g, none), ExecError);
  std::vector<Buffer> small = {Buffer::allocate(4)};
  EXPECT_THROW(runtime::run_graph(g, small), ExecError);
}

TEST_F(CacheTest, UnknownBackendIsAnError) {
  std::string before(runtime::current_backend().name());
  EXPECT_THROW(runtime::set_backend("tpu"), Error);
  EXPECT_EQ(runtime::current_backend().name(), before);  // unchanged
}

}  // namespace
