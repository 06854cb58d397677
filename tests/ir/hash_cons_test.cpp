// Hash-consing (ir::Builder): an op on operands that an earlier identical op already used
// returns that node, and any other op adds one. The oracle is a map from (op, operands) to
// the first value built, over random programs that reuse old values, repeat operands, add
// parameters and reindex midway (as a compaction does). The table leaves out nodes whose
// operand had no other user; these programs make the next user of such an operand either a
// duplicate or a new node.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <tuple>
#include <vector>

#include "loom/ir/builder.h"

namespace loom::ir {
namespace {

constexpr NodeId kNone = UINT32_MAX;

// (op, first operand, second operand) as node and result index; a unary op's second is kNone.
using Key = std::tuple<OpKind, NodeId, uint32_t, NodeId, uint32_t>;

TEST(HashConsTest, EqualOpsOnEqualOperandsAreOneNode) {
  for (uint32_t seed : {1u, 2u, 3u, 4u}) {
    std::mt19937 rng(seed);
    Graph g;
    Builder b(g);
    std::vector<Value> pool;
    for (int i = 0; i < 3; ++i) pool.push_back(b.parameter({float32, {4}}, i));
    std::map<Key, Value> built;
    int hits = 0;
    for (int step = 0; step < 4000; ++step) {
      if (step % 997 == 996) b.reindex();  // the table and the first users rebuilt
      if (step % 401 == 400) pool.push_back(b.parameter({float32, {4}}));
      // Mostly the newest values (chains, with operands no node uses yet), sometimes any.
      auto pick = [&] {
        const size_t n = pool.size();
        const size_t back = rng() % 4 == 0 ? rng() % n : rng() % std::min<size_t>(n, 3);
        return pool[n - 1 - back];
      };
      static constexpr OpKind kUnary[] = {OpKind::Exp, OpKind::Neg};
      static constexpr OpKind kBinary[] = {OpKind::Add, OpKind::Mul, OpKind::Sub};
      const bool unary = rng() % 3 == 0;
      const OpKind op = unary ? kUnary[rng() % 2] : kBinary[rng() % 3];
      const Value x = pick(), y = unary ? Value{kNone, 0} : rng() % 5 == 0 ? x : pick();
      const size_t size = g.size();
      const Value v = unary ? b.unary(op, x) : b.binary(op, x, y);
      const Key key{op, x.node, x.index, y.node, y.index};
      if (auto it = built.find(key); it != built.end()) {
        ASSERT_EQ(v, it->second) << "seed " << seed << " step " << step << ": a duplicate";
        ASSERT_EQ(g.size(), size);
        ++hits;
      } else {
        ASSERT_EQ(v.node, size) << "seed " << seed << " step " << step << ": merged wrongly";
        ASSERT_EQ(g.size(), size + 1);
        built.emplace(key, v);
        pool.push_back(v);
      }
    }
    EXPECT_GT(hits, 50) << "seed " << seed;  // the programs do repeat themselves
  }
}

// The cases by hand: a chain's second user of a value finds the first; x * x; a node whose
// first operand was used before and whose second was not.
TEST(HashConsTest, TheFirstUserOfAValueIsFoundByTheNext) {
  Graph g;
  Builder b(g);
  const Value x = b.parameter({float32, {4}}, 0), y = b.parameter({float32, {4}}, 1);
  const Value e = b.unary(OpKind::Exp, x);  // x had no user: e is left out of the table
  const Value s = b.binary(OpKind::Add, e, y);
  EXPECT_EQ(b.unary(OpKind::Exp, x), e);
  EXPECT_EQ(b.binary(OpKind::Add, e, y), s);
  const Value sq = b.binary(OpKind::Mul, s, s);
  EXPECT_EQ(b.binary(OpKind::Mul, s, s), sq);
  const Value n = b.unary(OpKind::Neg, sq);
  const Value m = b.binary(OpKind::Mul, y, n);  // y used before, n not
  EXPECT_NE(b.binary(OpKind::Mul, n, y), m);    // other operand order: another node
  EXPECT_EQ(b.binary(OpKind::Mul, y, n), m);
  const size_t size = g.size();
  b.reindex();
  EXPECT_EQ(b.binary(OpKind::Mul, y, n), m);
  EXPECT_EQ(b.unary(OpKind::Exp, x), e);
  EXPECT_EQ(g.size(), size);
}

// A host number's parameter (unique_parameter) is a node of its own, the ops on it hash-cons
// as any other's, and after a reindex parameter() of its index finds it.
TEST(HashConsTest, UniqueParametersAreNodesOfTheirOwn) {
  Graph g;
  Builder b(g);
  const Value x = b.parameter({float32, {4}}, 0);
  const Value s1 = b.unique_parameter({float32, {}}, 1), s2 = b.unique_parameter({float32, {}}, 2);
  EXPECT_NE(s1, s2);
  EXPECT_EQ(g.params(), (std::vector<NodeId>{x.node, s1.node, s2.node}));
  const Value m = b.binary(OpKind::Mul, x, b.expand(s1, {4}));
  EXPECT_EQ(b.binary(OpKind::Mul, x, b.expand(s1, {4})), m);
  const size_t size = g.size();
  b.reindex();
  EXPECT_EQ(b.parameter({float32, {}}, 1), s1);
  EXPECT_EQ(b.parameter({float32, {}}, 2), s2);
  EXPECT_EQ(g.size(), size);
}

}  // namespace
}  // namespace loom::ir
