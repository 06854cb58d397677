// Trees: leaf order, paths, structure names and the unflatten round trip, for every container
// kind of API.md, nested.
#include <gtest/gtest.h>

#include "loom/loom.h"

namespace {

using loom::Tensor;
using Dict = std::map<std::string, Tensor>;

Tensor scalar(float v) { return loom::tensor(v); }
float value(const Tensor& t) { return t.item<float>(); }

TEST(Tree, FlattensInOrderWithPaths) {
  std::pair<Dict, std::vector<Tensor>> t{{{"sum", scalar(1)}, {"count", scalar(2)}},
                                         {scalar(3), scalar(4)}};
  std::vector<Tensor> leaves;
  std::vector<std::string> paths;
  loom::tree::flatten(t, &leaves, &paths, "carry");
  ASSERT_EQ(leaves.size(), 4u);
  // maps flatten by key: count before sum
  EXPECT_EQ(value(leaves[0]), 2);
  EXPECT_EQ(value(leaves[1]), 1);
  EXPECT_EQ(value(leaves[3]), 4);
  EXPECT_EQ(paths, (std::vector<std::string>{"carry[0]['count']", "carry[0]['sum']", "carry[1][0]",
                                             "carry[1][1]"}));
  EXPECT_EQ(loom::tree::structure(t), "({count:T,sum:T},[T,T])");
}

TEST(Tree, UnflattenRebuildsTheSameStructure) {
  std::tuple<Tensor, std::array<Tensor, 2>, std::tuple<>, Dict> like{
      scalar(0), {scalar(0), scalar(0)}, {}, {{"a", scalar(0)}}};
  std::vector<Tensor> fresh = {scalar(10), scalar(11), scalar(12), scalar(13)};
  auto r = loom::tree::unflatten(like, fresh);
  EXPECT_EQ(value(std::get<0>(r)), 10);
  EXPECT_EQ(value(std::get<1>(r)[1]), 12);
  EXPECT_EQ(value(std::get<3>(r).at("a")), 13);
  EXPECT_EQ(loom::tree::structure(r), "(T,[T,T],(),{a:T})");
  EXPECT_THROW(loom::tree::unflatten(like, std::vector<Tensor>{scalar(1)}), loom::Error);
  std::vector<Tensor> five = {scalar(1), scalar(2), scalar(3), scalar(4), scalar(5)};
  EXPECT_THROW(loom::tree::unflatten(like, five), loom::Error);
}

TEST(Tree, TheEmptyTupleIsNothing) {
  std::vector<Tensor> leaves;
  loom::tree::flatten(std::tuple<>{}, &leaves);
  EXPECT_TRUE(leaves.empty());
  EXPECT_EQ(loom::tree::structure(std::tuple<>{}), "()");
}

TEST(Tree, DynamicTreesNest) {
  loom::Tree t(loom::Tree::Dict{{"w", loom::Tree(scalar(1))},
                                {"layers", loom::Tree(loom::Tree::List{scalar(2), scalar(3)})}});
  std::vector<Tensor> leaves;
  std::vector<std::string> paths;
  loom::tree::flatten(t, &leaves, &paths, "params");
  EXPECT_EQ(paths, (std::vector<std::string>{"params['layers'][0]", "params['layers'][1]",
                                             "params['w']"}));
  EXPECT_EQ(loom::tree::structure(t), "{layers:[T,T],w:T}");
  loom::Tree r = loom::tree::unflatten(t, std::vector<Tensor>{scalar(7), scalar(8), scalar(9)});
  EXPECT_EQ(value(r.dict().at("w").leaf()), 9);
  EXPECT_EQ(value(r.dict().at("layers").list()[0].leaf()), 7);
}

}  // namespace
