// The graph's node arena (ir::NodeStore): nodes never move while the graph grows, and copies,
// moves, pops and clears keep the graph's text (the printer is the oracle); freed chunks are
// reused by the next graphs of the thread, across threads and through a thread's exit.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "loom/ir/builder.h"

namespace loom::ir {
namespace {

// A chain of n distinct nodes: x, x+1, (x+1)*x, ... (no two hash-cons to one node).
Graph chain(int n) {
  Graph g;
  Builder b(g);
  Value x = b.parameter({float32, {4}});
  Value v = x;
  for (int i = 0; i < n; ++i) v = b.binary(i % 2 ? OpKind::Mul : OpKind::Add, v, x);
  g.outputs().push_back(v);
  return g;
}

// Graphs built one after another reuse the chunks the earlier ones freed (the thread's cache)
// and read back exactly; graphs made on one thread and freed on another, and thread-local
// graphs destroyed after the thread's cache at its exit, free their chunks cleanly (ASan and
// TSan builds check the memory).
TEST(NodeStoreTest, FreedChunksAreReusedAcrossGraphsAndThreads) {
  const std::string want = to_text(chain(300));
  for (int round = 0; round < 40; ++round) {
    Graph g = chain(300);  // 5 chunks, freed at the end of each round
    ASSERT_EQ(to_text(g), want) << "round " << round;
  }
  std::vector<std::unique_ptr<Graph>> made;
  std::thread maker([&] {
    for (int i = 0; i < 20; ++i) made.push_back(std::make_unique<Graph>(chain(70 + i)));
  });
  maker.join();
  for (int i = 0; i < 20; ++i) EXPECT_EQ(to_text(*made[i]), to_text(chain(70 + i)));
  made.clear();  // freed here, into this thread's cache
  std::thread exiting([] {
    thread_local Graph late;  // made before the thread's chunk cache, so destroyed after it
    Builder b(late);
    Value x = b.parameter({float32, {4}});
    Value v = x;
    for (int i = 0; i < 200; ++i) v = b.binary(OpKind::Add, v, x);
    late.outputs().push_back(v);
    for (int i = 0; i < 5; ++i) Graph passing = chain(100);  // cached chunks on this thread
  });
  exiting.join();
  EXPECT_EQ(to_text(chain(300)), want);
}

TEST(NodeStoreTest, NodesStayPutWhileTheGraphGrows) {
  Graph g;
  Builder b(g);
  Value x = b.parameter({float32, {4}});
  Value y = b.unary(OpKind::Exp, x);
  const Node* px = &g.node(x.node);
  const Node& ny = g.node(y.node);
  std::vector<const Node*> seen;
  Value v = y;
  for (int i = 0; i < 5000; ++i) {  // many chunks, and more than a vector's doublings
    v = b.binary(OpKind::Add, v, x);
    seen.push_back(&g.node(v.node));
  }
  EXPECT_EQ(&g.node(x.node), px);
  EXPECT_EQ(ny.op, OpKind::Exp);  // the reference taken before the growth still reads it
  EXPECT_EQ(ny.operands[0], x);
  for (size_t i = 0; i < seen.size(); ++i) {
    ASSERT_EQ(seen[i], &g.node(static_cast<NodeId>(i + 2))) << "node " << i + 2 << " moved";
    ASSERT_EQ(seen[i]->op, OpKind::Add);
  }
  // Hash-consing an existing node appends and pops a node: the earlier ones stay put.
  size_t before = g.size();
  EXPECT_EQ(b.binary(OpKind::Add, y, x), (Value{2, 0}));
  EXPECT_EQ(g.size(), before);
  EXPECT_EQ(&g.node(2), seen[0]);
}

TEST(NodeStoreTest, CopyMoveIterateAndClearKeepTheGraph) {
  for (int n : {0, 1, 62, 63, 64, 65, 200, 1000}) {
    Graph g = chain(n);
    const std::string text = to_text(g);
    Graph copy = g;
    EXPECT_EQ(to_text(copy), text) << n;
    EXPECT_EQ(copy.size(), g.size());
    EXPECT_NE(&copy.node(0), &g.node(0));  // a deep copy (every chain has its parameter)
    Graph assigned = chain(3);
    assigned = g;
    EXPECT_EQ(to_text(assigned), text) << n;
    Graph moved = std::move(copy);
    EXPECT_EQ(to_text(moved), text) << n;
    EXPECT_EQ(copy.size(), 0u);  // NOLINT: a moved-from graph is empty
    size_t i = 0;
    for (const Node& node : g.nodes()) EXPECT_EQ(&node, &g.node(static_cast<NodeId>(i++)));
    EXPECT_EQ(i, g.size());
    EXPECT_EQ(static_cast<size_t>(g.nodes().end() - g.nodes().begin()), g.size());
    // Cleared, then refilled through a builder: the same text as a fresh graph's.
    moved.clear();
    EXPECT_EQ(moved.size(), 0u);
    Builder b(moved);
    Value x = b.parameter({float32, {4}});
    Value v = x;
    for (int k = 0; k < n; ++k) v = b.binary(k % 2 ? OpKind::Mul : OpKind::Add, v, x);
    moved.outputs().push_back(v);
    EXPECT_EQ(to_text(moved), text) << n;
  }
}

// compact keeps what prune keeps, in place: the same text as prune's copy (the oracle), the
// parameters in order, and the same chunks, which the graph refills without new memory.
TEST(NodeStoreTest, CompactKeepsWhatPruneKeepsInPlace) {
  Graph g;
  Builder b(g);
  Value x = b.parameter({float32, {4}}, 0);
  Value dead = b.unary(OpKind::Exp, x);
  Value y = b.parameter({float32, {4}}, 1);
  Value v = x;
  for (int i = 0; i < 300; ++i) {  // live nodes with dead ones between them, over chunks
    v = b.binary(i % 2 ? OpKind::Mul : OpKind::Add, v, i % 3 ? x : y);
    dead = b.binary(OpKind::Sub, dead, v);
  }
  Value z = b.parameter({float32, {4}}, 2);  // a parameter the roots do not need
  b.binary(OpKind::Add, z, dead);
  const size_t before = g.size();
  std::vector<const Node*> addr;
  for (NodeId id = 0; id < before; ++id) addr.push_back(&g.node(id));

  const std::vector<Value> roots{v};
  std::vector<NodeId> oracle_remap;
  Graph oracle = prune(g, roots, false, &oracle_remap);  // returns the roots
  std::vector<NodeId> keep;
  for (NodeId id = 0; id < before; ++id)
    if (oracle_remap[id] != UINT32_MAX) keep.push_back(id);

  std::vector<NodeId> remap;
  g.compact(keep, remap);
  EXPECT_EQ(remap, oracle_remap);
  g.outputs().push_back({remap[v.node], 0});
  EXPECT_EQ(to_text(g), to_text(oracle));
  ASSERT_EQ(g.size(), keep.size());
  EXPECT_EQ(g.params(), (std::vector<NodeId>{remap[x.node], remap[y.node]}));
  // Grown back to the old size: every node sits where the node of that id sat before.
  Builder b2(g);
  Value w = {remap[v.node], 0};
  while (g.size() < before) w = b2.unary(OpKind::Neg, w);
  for (NodeId id = 0; id < before; ++id) ASSERT_EQ(&g.node(id), addr[id]) << "node " << id;
}

}  // namespace
}  // namespace loom::ir
