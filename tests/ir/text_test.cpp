// IR text: printer/parser round trips over graphs that use every op, the printed form of
// attributes and special floats, and parse errors with their line and column.
#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <string>

#include "ir/sample_graphs.h"
#include "loom/core/error.h"
#include "loom/ir/builder.h"

namespace loom::ir {
namespace {

void expect_round_trip(const Graph& g) {
  std::string text = to_text(g);
  Graph back = parse(text);
  EXPECT_NO_THROW(verify(back)) << text;
  EXPECT_EQ(back.size(), g.size()) << text;
  EXPECT_TRUE(structurally_equal(g, back)) << text;
  EXPECT_EQ(fingerprint(g), fingerprint(back)) << text;
  EXPECT_EQ(to_text(back), text);
}

TEST(TextTest, RoundTripsSampleGraphs) {
  for (const Graph& g : testing::sample_graphs()) {
    verify(g);
    expect_round_trip(g);
  }
}

TEST(TextTest, SampleGraphsUseEveryOp) {
  std::set<OpKind> used;
  std::function<void(const Graph&)> walk = [&](const Graph& g) {  // regions included
    for (const Node& n : g.nodes()) {
      used.insert(n.op);
      for (const auto& r : n.regions) walk(*r);
    }
  };
  for (const Graph& g : testing::sample_graphs()) walk(g);
  for (int k = 0; k < kNumOps; ++k)
    EXPECT_TRUE(used.count(static_cast<OpKind>(k))) << "no sample uses " << static_cast<OpKind>(k);
}

TEST(TextTest, PrintsTheDocumentedForm) {
  Graph g;
  Builder b(g);
  Value x = b.parameter({float32, {4, 8}});
  Value y = b.parameter({float32, {8}});
  Value s = b.binary(OpKind::Add, x, b.expand(y, {4, 8}));
  Value r = b.reduce(OpKind::ReduceSum, s, {1}, false);
  b.constant(0.5, float32);
  b.slice(x, 1, 0, 4);
  b.constant(-std::numeric_limits<double>::infinity(), float32);
  b.constant(-3, int64);
  g.outputs() = {r, s};
  EXPECT_EQ(to_text(g),
            "graph(%0: f32[4,8], %1: f32[8]) {\n"
            "  %2 = expand(%1) {shape=[4,8]} : f32[4,8]\n"
            "  %3 = add(%0, %2) : f32[4,8]\n"
            "  %4 = reduce_sum(%3) {axes=[1], keepdim=false} : f32[4]\n"
            "  %5 = constant() {value=0.5} : f32[]\n"
            "  %6 = slice(%0) {range=[0,4,1], axis=1} : f32[4,4]\n"
            "  %7 = constant() {value=-inf} : f32[]\n"
            "  %8 = constant() {value=-3} : i64[]\n"
            "  return %4, %3\n"
            "}\n");
}

TEST(TextTest, SpecialFloatsRoundTripBitwise) {
  Graph g = parse(
      "graph() {\n"
      "  %a = constant() {value=nan} : f64[]\n"
      "  %b = constant() {value=-nan} : f64[]\n"
      "  %c = constant() {value=-0} : f64[]\n"
      "  %d = constant() {value=+inf} : f64[]\n"
      "  %e = constant() {value=4.9406564584124654e-324} : f64[]\n"
      "  %f = constant() {value=0.10000000000000001} : f64[]\n"
      "  return %a, %b, %c, %d, %e, %f\n"
      "}\n");
  EXPECT_TRUE(std::isnan(g.node(0).attrs.f) && !std::signbit(g.node(0).attrs.f));
  EXPECT_TRUE(std::isnan(g.node(1).attrs.f) && std::signbit(g.node(1).attrs.f));
  EXPECT_TRUE(g.node(2).attrs.f == 0 && std::signbit(g.node(2).attrs.f));
  EXPECT_EQ(g.node(3).attrs.f, std::numeric_limits<double>::infinity());
  EXPECT_EQ(g.node(4).attrs.f, std::numeric_limits<double>::denorm_min());
  EXPECT_EQ(g.node(5).attrs.f, 0.1);
  expect_round_trip(g);
}

TEST(TextTest, AcceptsCommentsAndArbitraryNames) {
  const char* text =
      "# a comment before the graph\n"
      "graph(%input.x: f32[2] # a comment in the header\n"
      "     , %w$1 : f32[2]) {   # and after the brace\n"
      "\t%sum_ = add( %input.x ,%w$1 )  :  f32 [ 2 ]# no space before the comment\n"
      "  %Z9 = exp(%sum_) : f32[2]\n"
      "  return %Z9, %sum_ # outputs\n"
      "} # trailing comment\n";
  Graph g = parse(text);
  EXPECT_EQ(to_text(g),
            "graph(%0: f32[2], %1: f32[2]) {\n"
            "  %2 = add(%0, %1) : f32[2]\n"
            "  %3 = exp(%2) : f32[2]\n"
            "  return %3, %2\n"
            "}\n");
}

TEST(TextTest, AcceptsAttributesInAnyOrder) {
  Graph g = parse(
      "graph(%0: f32[2,3]) {\n"
      "  %1 = reduce_max(%0) {keepdim=true, axes=[0]} : f32[1,3]\n"
      "  %2 = reduce_min(%0) {} : f32[2,3]\n"
      "  return %1, %2\n"
      "}");
  EXPECT_EQ(g.node(1).attrs.ints, (SmallVector<int64_t, 6>{0}));
  EXPECT_TRUE(g.node(1).attrs.flag);
}

// Parses `text`, expecting a ParseError at line:column whose message contains `what`.
void expect_error(const std::string& text, int line, int column, const std::string& what) {
  try {
    parse(text);
    ADD_FAILURE() << "parsed without error:\n" << text;
  } catch (const ParseError& e) {
    EXPECT_EQ(e.line(), line) << e.what();
    EXPECT_EQ(e.column(), column) << e.what();
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    EXPECT_EQ(
        std::string(e.what()).rfind(std::to_string(line) + ":" + std::to_string(column) + ": ", 0),
        0u)
        << e.what();
  }
}

TEST(TextTest, ErrorUnknownOp) {
  expect_error("graph(%0: f32[4]) {\n  %1 = exq(%0) : f32[4]\n  return %1\n}", 2, 8,
               "unknown op 'exq'");
  expect_error("graph(%0: f32[4]) {\n  %1 = parameter() : f32[4]\n  return %1\n}", 2, 8,
               "parameters are declared in the graph header");
}

TEST(TextTest, ErrorUndefinedValue) {
  expect_error("graph(%0: f32[4]) {\n  %1 = add(%0, %x) : f32[4]\n  return %1\n}", 2, 16,
               "undefined value '%x'");
  // A later name is not yet defined.
  expect_error(
      "graph(%0: f32[4]) {\n  %1 = exp(%2) : f32[4]\n  %2 = exp(%0) : f32[4]\n"
      "  return %1\n}",
      2, 12, "undefined value '%2'");
  expect_error("graph(%0: f32[4]) {\n  return %0, %9\n}", 2, 14, "undefined value '%9'");
  expect_error("graph(%0: f32[4]) {\n  %0 = exp(%0) : f32[4]\n  return %0\n}", 2, 3,
               "redefinition of '%0'");
  expect_error("graph(%0: f32[4]) {\n  %1 = exp(%0#1) : f32[4]\n  return %1\n}", 2, 15,
               "#1 does not exist");
}

TEST(TextTest, ErrorBadType) {
  expect_error("graph(%0: f33[4]) {\n  return %0\n}", 1, 11, "unknown dtype 'f33'");
  expect_error("graph(%0: f32[4]) {\n  %1 = exp(%0) : f32[-4]\n  return %1\n}", 2, 22,
               "negative extent");
  expect_error("graph(%0: f32[4) {\n  return %0\n}", 1, 16, "expected ']'");
  expect_error("graph(%0: f32[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]) {\n  return %0\n}", 1, 47,
               "rank exceeds");
  expect_error("graph(%0: f32[1048576,1048576,2]) {\n  return %0\n}", 1, 31, "2^40");
  expect_error("graph(%0: f32[99999999999999999999]) {\n  return %0\n}", 1, 15, "out of range");
}

TEST(TextTest, ErrorTypeDiffersFromInferred) {
  expect_error(
      "graph(%0: f32[4]) {\n  %1 = exp(%0) : f32[4]\n  %2 = add(%0, %1) : f32[5]\n"
      "  return %2\n}",
      3, 3, "written f32[5] but the operands give f32[4]");
  expect_error("graph(%0: f32[4]) {\n  %1 = lt(%0, %0) : f32[4]\n  return %1\n}", 2, 3,
               "written f32[4] but the operands give bool[4]");
}

TEST(TextTest, ErrorIllTypedNodeKeepsTheRuleMessage) {
  expect_error("graph(%0: f32[4], %1: i32[4]) {\n\n    %2 = add(%0, %1) : f32[4]\n  return %2\n}",
               3, 5, "[add] operands must have one dtype");
  expect_error("graph(%0: f32[4]) {\n  %1 = reshape(%0) {shape=[3]} : f32[3]\n  return %1\n}", 2, 3,
               "[reshape] cannot reshape");
  expect_error("graph(%0: f32[4]) {\n  %1 = add(%0) : f32[4]\n  return %1\n}", 2, 3,
               "expected 2 operands");
}

TEST(TextTest, ErrorMissingParen) {
  expect_error("graph(%0: f32[4]) {\n  %1 = add(%0, %0 : f32[4]\n  return %1\n}", 2, 19,
               "expected ')'");
  expect_error("graph(%0: f32[4] {\n  return %0\n}", 1, 18, "expected ')'");
  expect_error("graph(%0: f32[4]) {\n  %1 = exp %0 : f32[4]\n  return %1\n}", 2, 12,
               "expected '('");
}

TEST(TextTest, ErrorTrailingGarbage) {
  expect_error("graph(%0: f32[4]) {\n  return %0\n}\n  x", 4, 3, "unexpected text after the graph");
  expect_error("graph(%0: f32[4]) {\n  return %0\n}}", 3, 2, "unexpected text");
  expect_error("graph(%0: f32[4]) {\n  return %0\n", 3, 1, "found the end of the text");
}

TEST(TextTest, ErrorAttributes) {
  expect_error("graph(%0: f32[4]) {\n  %1 = exp(%0) {axes=[0]} : f32[4]\n  return %1\n}", 2, 17,
               "[exp] has no attribute 'axes'");
  expect_error(
      "graph(%0: f32[4]) {\n  %1 = reduce_sum(%0) {axes=[0], axes=[0]} : f32[]\n"
      "  return %1\n}",
      2, 34, "given twice");
  std::string long_list = "[";
  for (int k = 0; k < 65; ++k) long_list += k ? ",1" : "1";
  expect_error("graph(%0: f32[4]) {\n  %1 = reshape(%0) {shape=" + long_list +
                   "]} : f32[4]\n"
                   "  return %1\n}",
               2, 156, "longer than 64");
  expect_error(
      "graph(%0: f32[4]) {\n  %1 = argmax(%0) {axis=0, keepdim=maybe} : i64[]\n"
      "  return %1\n}",
      2, 36, "expected true or false");
  expect_error("graph() {\n  %1 = constant() {value=1e999} : f32[]\n  return %1\n}", 2, 26,
               "out of range");
  expect_error("graph() {\n  %1 = iota() {axis=1.5} : f32[3]\n  return %1\n}", 2, 21,
               "expected an integer");
}

TEST(TextTest, ErrorMultipleResultsAndRegionsNeedControlFlow) {
  expect_error("graph(%0: f32[4]) {\n  %1:2 = exp(%0) : f32[4], f32[4]\n  return %1#0\n}", 2, 3,
               "has one result");
  expect_error(
      "graph(%0: f32[4]) {\n  %1 = exp(%0) : f32[4] graph() {\n    return\n  }\n"
      "  return %1\n}",
      2, 3, "takes no regions");
}

TEST(TextTest, ErrorRegionsNestTooDeep) {
  std::string text;
  const int depth = 100000;
  for (int k = 0; k < depth; ++k) text += "graph() { %a = constant() : f32[] ";
  expect_error(text, 1, 1 + 34 * 64, "nest deeper than 64");
}

}  // namespace
}  // namespace loom::ir
