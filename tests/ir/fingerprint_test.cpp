// Fingerprint and structural equality: invariant under node order, sensitive to everything
// that changes the computation or its calling convention.
#include <gtest/gtest.h>

#include <memory>

#include "ir/sample_graphs.h"
#include "loom/ir/builder.h"

namespace loom::ir {
namespace {

void expect_same(const Graph& a, const Graph& b) {
  EXPECT_TRUE(structurally_equal(a, b)) << to_text(a) << to_text(b);
  EXPECT_EQ(fingerprint(a), fingerprint(b)) << to_text(a) << to_text(b);
}

void expect_different(const Graph& a, const Graph& b) {
  EXPECT_FALSE(structurally_equal(a, b)) << to_text(a) << to_text(b);
  EXPECT_NE(fingerprint(a), fingerprint(b)) << to_text(a) << to_text(b);
}

Graph from(const char* body) { return parse(body); }

TEST(FingerprintTest, SameStructureInAnotherNodeOrder) {
  Graph a, b;
  {
    Builder bb(a);
    Value x = bb.parameter({float32, {4}});
    Value y = bb.parameter({float32, {4}});
    Value e = bb.unary(OpKind::Exp, x);
    Value l = bb.unary(OpKind::Log, y);
    Value c = bb.constant(2, float32);
    a.outputs() = {bb.binary(OpKind::Mul, bb.binary(OpKind::Add, e, l), c), e};
  }
  {
    Builder bb(b);
    Value c = bb.constant(2, float32);  // constant first, then log before exp
    Value x = bb.parameter({float32, {4}});
    Value y = bb.parameter({float32, {4}});
    Value l = bb.unary(OpKind::Log, y);
    Value e = bb.unary(OpKind::Exp, x);
    b.outputs() = {bb.binary(OpKind::Mul, bb.binary(OpKind::Add, e, l), c), e};
  }
  expect_same(a, b);
  Graph c = from(
      "graph(%x: f32[4], %y: f32[4]) {\n"
      "  %l = log(%y) : f32[4]\n  %two = constant() {value=2} : f32[]\n"
      "  %e = exp(%x) : f32[4]\n  %s = add(%e, %l) : f32[4]\n  %m = mul(%s, %two) : f32[4]\n"
      "  return %m, %e\n}");
  expect_same(a, c);
}

TEST(FingerprintTest, IgnoresNodesNoOutputNeeds) {
  Graph a = from("graph(%0: f32[4]) {\n  %1 = exp(%0) : f32[4]\n  return %1\n}");
  Graph b =
      from("graph(%0: f32[4]) {\n  %d = log(%0) : f32[4]\n  %1 = exp(%0) : f32[4]\n  return %1\n}");
  expect_same(a, b);
}

TEST(FingerprintTest, DifferentAttributesTypesAndWiringDiffer) {
  const char* base =
      "graph(%0: f32[2,3], %1: f32[2,3]) {\n  %2 = sub(%0, %1) : f32[2,3]\n"
      "  %3 = reduce_sum(%2) {axes=[1], keepdim=false} : f32[2]\n  return %3\n}";
  Graph g = from(base);
  expect_same(g, from(base));
  expect_different(g, from("graph(%0: f32[2,3], %1: f32[2,3]) {\n  %2 = sub(%0, %1) : f32[2,3]\n"
                           "  %3 = reduce_sum(%2) {axes=[0], keepdim=false} : f32[3]\n"
                           "  return %3\n}"));
  expect_different(g, from("graph(%0: f32[2,3], %1: f32[2,3]) {\n  %2 = sub(%0, %1) : f32[2,3]\n"
                           "  %3 = reduce_sum(%2) {axes=[1], keepdim=true} : f32[2,1]\n"
                           "  return %3\n}"));
  expect_different(g, from("graph(%0: f64[2,3], %1: f64[2,3]) {\n  %2 = sub(%0, %1) : f64[2,3]\n"
                           "  %3 = reduce_sum(%2) {axes=[1], keepdim=false} : f64[2]\n"
                           "  return %3\n}"));
  expect_different(g, from("graph(%0: f32[2,3], %1: f32[2,3]) {\n  %2 = sub(%1, %0) : f32[2,3]\n"
                           "  %3 = reduce_sum(%2) {axes=[1], keepdim=false} : f32[2]\n"
                           "  return %3\n}"));
  expect_different(g, from("graph(%0: f32[2,3], %1: f32[2,3]) {\n  %2 = add(%0, %1) : f32[2,3]\n"
                           "  %3 = reduce_sum(%2) {axes=[1], keepdim=false} : f32[2]\n"
                           "  return %3\n}"));
}

TEST(FingerprintTest, ConstantValuesCompareByBits) {
  const char* fmt = "graph() {\n  %%0 = constant() {value=%s} : f32[]\n  return %%0\n}";
  auto g = [&](const char* v) {
    char buf[128];
    std::snprintf(buf, sizeof buf, fmt, v);
    return parse(buf);
  };
  expect_same(g("nan"), g("nan"));
  expect_different(g("0.5"), g("0.25"));
  expect_different(g("0"), g("-0"));
  expect_different(g("nan"), g("inf"));
}

TEST(FingerprintTest, SharedOperandDiffersFromTwoOperands) {
  Graph ab = from("graph(%a: f32[3], %b: f32[3]) {\n  %c = add(%a, %b) : f32[3]\n  return %c\n}");
  Graph aa = from("graph(%a: f32[3], %b: f32[3]) {\n  %c = add(%a, %a) : f32[3]\n  return %c\n}");
  expect_different(ab, aa);
  // Two equal nodes are not one shared node.
  Graph shared = from(
      "graph(%a: f32[3]) {\n  %e = exp(%a) : f32[3]\n  %c = add(%e, %e) : f32[3]\n  return %c\n}");
  Graph twice = from(
      "graph(%a: f32[3]) {\n  %e = exp(%a) : f32[3]\n  %f = exp(%a) : f32[3]\n"
      "  %c = add(%e, %f) : f32[3]\n  return %c\n}");
  expect_different(shared, twice);
}

TEST(FingerprintTest, OutputAndParameterOrderMatter) {
  Graph g = from("graph(%a: f32[3], %b: f32[2]) {\n  return %a, %b\n}");
  expect_different(g, from("graph(%a: f32[3], %b: f32[2]) {\n  return %b, %a\n}"));
  expect_different(g, from("graph(%b: f32[2], %a: f32[3]) {\n  return %a, %b\n}"));
  expect_different(g, from("graph(%a: f32[3], %b: f32[2]) {\n  return %a\n}"));
  // An unused parameter still counts: it is part of the calling convention.
  expect_different(from("graph(%a: f32[3]) {\n  return %a\n}"),
                   from("graph(%a: f32[3], %b: f32[2]) {\n  return %a\n}"));
}

TEST(FingerprintTest, StableAcrossPrintAndParse) {
  for (const Graph& g : testing::sample_graphs()) {
    Graph back = parse(to_text(g));
    expect_same(g, back);
    EXPECT_EQ(fingerprint(g).hex().size(), 32u);
  }
  // Different samples differ from each other.
  std::vector<Graph> gs = testing::sample_graphs();
  for (size_t i = 0; i < gs.size(); ++i) {
    for (size_t j = i + 1; j < gs.size(); ++j) expect_different(gs[i], gs[j]);
  }
}

TEST(FingerprintTest, RegionsAreHashedByStructure) {
  auto with_region = [](const char* region_text) {
    Graph g = from("graph(%0: f32[4]) {\n  %1 = exp(%0) : f32[4]\n  return %1\n}");
    // No op owns regions yet, so attach one by hand; the fingerprint must still see it.
    g.mutable_node(1).regions.push_back(std::make_shared<const Graph>(parse(region_text)));
    return g;
  };
  const char* r1 = "graph(%0: f32[]) {\n  %1 = neg(%0) : f32[]\n  return %1\n}";
  const char* r2 = "graph(%0: f32[]) {\n  %1 = abs(%0) : f32[]\n  return %1\n}";
  expect_same(with_region(r1), with_region(r1));
  expect_different(with_region(r1), with_region(r2));
  expect_different(with_region(r1), from("graph(%0: f32[4]) {\n  %1 = exp(%0) : f32[4]\n"
                                         "  return %1\n}"));
}

}  // namespace
}  // namespace loom::ir
