// Control-flow ops in the IR: type inference of call, scan and while, every ill-typed input
// they reject (with the position and both types in the message), verify, the text round trip
// and fingerprints of nested regions, and the passes on graphs that hold regions.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "ir/region_util.h"
#include "ir/sample_graphs.h"
#include "loom/core/error.h"
#include "loom/ir/builder.h"
#include "loom/passes/pass.h"

namespace loom::ir {
namespace {

using loom::ir::testing::Region;

const TensorType kI64{int64, {}};
const TensorType kF32{float32, {}};

using loom::ir::testing::region;
using loom::ir::testing::scan_attrs;

Attrs while_attrs(int64_t carried) {
  Attrs a;
  a.ints = {carried};
  return a;
}

// Runs f, which must throw an Error whose message holds every one of `parts`.
template <class F>
void expect_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    for (const std::string& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << "\nlacks: " << p;
  }
}

// (i, acc: f32[], x: f32[]) -> (acc + x, acc * 2): a cumulative sum with a y of its own.
Region cumsum_body() {
  return region({kI64, kF32, kF32}, [](Builder& b, std::vector<Value> p) {
    Value two = b.constant(2, float32);
    return std::vector<Value>{b.binary(OpKind::Add, p[1], p[2]), b.binary(OpKind::Mul, p[1], two)};
  });
}

TEST(ControlFlowIr, ScanInfersCarriesAndStackedYs) {
  Graph g;
  Builder b(g);
  Value init = b.parameter(kF32);
  Value xs = b.parameter({float32, {5}});
  Value ops[] = {init, xs};
  std::vector<Value> r = b.make_region(OpKind::Scan, ops, scan_attrs(1, 1, 5), {cumsum_body()});
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(g.type(r[0]), kF32);
  EXPECT_EQ(g.type(r[1]), (TensorType{float32, {5}}));
  EXPECT_EQ(g.node(r[0].node).num_results(), 2u);
  // A zero-length scan still types its ys with a leading 0.
  Value empty = b.parameter({float32, {0}});
  Value ops0[] = {init, empty};
  r = b.make_region(OpKind::Scan, ops0, scan_attrs(1, 1, 0), {cumsum_body()});
  EXPECT_EQ(g.type(r[1]), (TensorType{float32, {0}}));
  EXPECT_NO_THROW(verify(g));
}

TEST(ControlFlowIr, ScanRejectsBadBodiesAndShapes) {
  Graph g;
  Builder b(g);
  Value init = b.parameter(kF32);
  Value xs = b.parameter({float32, {5}});
  Value ops[] = {init, xs};
  // The body turns the f32[] carry into f64[].
  Region widen = region({kI64, kF32, kF32}, [](Builder& b, std::vector<Value> p) {
    return std::vector<Value>{b.convert(b.binary(OpKind::Add, p[1], p[2]), float64)};
  });
  expect_error([&] { b.make_region(OpKind::Scan, ops, scan_attrs(1, 1, 5), {widen}); },
               {"[scan] carry 0 changed type in the body", "expected f32[]", "got f64[]"});
  // xs whose leading dim differs from length.
  expect_error([&] { b.make_region(OpKind::Scan, ops, scan_attrs(1, 1, 4), {cumsum_body()}); },
               {"[scan] xs 0 must have leading dim length = 4", "got f32[5]"});
  // A body whose parameters do not match: the slice of xs is f32[], not f32[5].
  Region wrong_slice = region({kI64, kF32, {float32, {5}}}, [](Builder&, std::vector<Value> p) {
    return std::vector<Value>{p[1]};
  });
  expect_error([&] { b.make_region(OpKind::Scan, ops, scan_attrs(1, 1, 5), {wrong_slice}); },
               {"[scan] body parameter 2 (a slice of xs 0) has type f32[5] but is given f32[]"});
  // The index must be i64[].
  Region i32_index = region({{int32, {}}, kF32, kF32}, [](Builder&, std::vector<Value> p) {
    return std::vector<Value>{p[1]};
  });
  expect_error([&] { b.make_region(OpKind::Scan, ops, scan_attrs(1, 1, 5), {i32_index}); },
               {"parameter 0 (the iteration index) has type i32[] but is given i64[]"});
  expect_error([&] { b.make_region(OpKind::Scan, ops, scan_attrs(2, 1, 5), {cumsum_body()}); },
               {"[scan] counts [2,1] do not fit 2 operands"});
  expect_error([&] { b.make_region(OpKind::Scan, ops, scan_attrs(1, 1, -1), {cumsum_body()}); },
               {"[scan] length must be >= 0"});
  expect_error([&] { b.make_region(OpKind::Scan, ops, scan_attrs(1, 1, 5), {}); },
               {"[scan] expected 1 region(s), got 0"});
  // Too few outputs for the carries.
  Region none =
      region({kI64, kF32, kF32}, [](Builder&, std::vector<Value>) { return std::vector<Value>{}; });
  expect_error([&] { b.make_region(OpKind::Scan, ops, scan_attrs(1, 1, 5), {none}); },
               {"[scan] body returns 0 value(s) but there are 1 carries"});
}

TEST(ControlFlowIr, WhileChecksCondAndCarriedTypes) {
  Graph g;
  Builder b(g);
  Value n = b.parameter(kI64);
  Value v = b.parameter({float32, {3}});
  Value ops[] = {n, v};
  Region cond = region({kI64, {float32, {3}}}, [](Builder& b, std::vector<Value> p) {
    return std::vector<Value>{b.binary(OpKind::Gt, p[0], b.constant(0, int64))};
  });
  Region body = region({kI64, {float32, {3}}}, [](Builder& b, std::vector<Value> p) {
    return std::vector<Value>{b.binary(OpKind::Sub, p[0], b.constant(1, int64)), p[1]};
  });
  std::vector<Value> r = b.make_region(OpKind::While, ops, while_attrs(2), {cond, body});
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(g.type(r[1]), (TensorType{float32, {3}}));
  // Only n is carried: v is captured, and the body returns n alone.
  Region body1 = region({kI64, {float32, {3}}}, [](Builder& b, std::vector<Value> p) {
    return std::vector<Value>{b.binary(OpKind::Sub, p[0], b.constant(1, int64))};
  });
  EXPECT_EQ(b.make_region(OpKind::While, ops, while_attrs(1), {cond, body1}).size(), 1u);

  Region f32_cond = region({kI64, {float32, {3}}}, [](Builder& b, std::vector<Value> p) {
    return std::vector<Value>{b.convert(p[0], float32)};
  });
  expect_error([&] { b.make_region(OpKind::While, ops, while_attrs(2), {f32_cond, body}); },
               {"[while] cond must return one bool[], got (f32[])"});
  Region shrink = region({kI64, {float32, {3}}}, [](Builder& b, std::vector<Value> p) {
    return std::vector<Value>{p[0], b.reduce(OpKind::ReduceSum, p[1], {0}, false)};
  });
  expect_error([&] { b.make_region(OpKind::While, ops, while_attrs(2), {cond, shrink}); },
               {"[while] carried 1 changed type in the body", "expected f32[3]", "got f32[]"});
  expect_error([&] { b.make_region(OpKind::While, ops, while_attrs(2), {body, cond}); },
               {"[while] cond must return one bool[]"});
  Region short_cond = region({kI64}, [](Builder& b, std::vector<Value> p) {
    return std::vector<Value>{b.binary(OpKind::Gt, p[0], b.constant(0, int64))};
  });
  expect_error([&] { b.make_region(OpKind::While, ops, while_attrs(2), {short_cond, body}); },
               {"[while] cond takes 1 parameter(s) (i64[]) but is given 2 (i64[], f32[3])"});
  expect_error([&] { b.make_region(OpKind::While, ops, while_attrs(0), {cond, body}); },
               {"[while] #carried = 0 must be in [1, 2]"});
  expect_error([&] { b.make_region(OpKind::While, ops, while_attrs(2), {cond}); },
               {"[while] expected 2 region(s), got 1"});
}

TEST(ControlFlowIr, CallChecksArityAndOutputs) {
  Graph g;
  Builder b(g);
  Value x = b.parameter({float32, {4}});
  Region exp_body = region({{float32, {4}}}, [](Builder& b, std::vector<Value> p) {
    return std::vector<Value>{b.unary(OpKind::Exp, p[0]), p[0]};
  });
  std::vector<Value> r = b.make_region(OpKind::Call, std::span<const Value>(&x, 1), {}, {exp_body});
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(g.type(r[0]), (TensorType{float32, {4}}));
  Value two[] = {x, x};
  expect_error([&] { b.make_region(OpKind::Call, two, {}, {exp_body}); },
               {"[call] body takes 1 parameter(s) (f32[4]) but is given 2 (f32[4], f32[4])"});
  Value y = b.parameter({float64, {4}});
  expect_error([&] { b.make_region(OpKind::Call, std::span<const Value>(&y, 1), {}, {exp_body}); },
               {"[call] body parameter 0 (operand 0) has type f32[4] but is given f64[4]"});
  Region empty =
      region({{float32, {4}}}, [](Builder&, std::vector<Value>) { return std::vector<Value>{}; });
  expect_error([&] { b.make_region(OpKind::Call, std::span<const Value>(&x, 1), {}, {empty}); },
               {"[call] body has no outputs"});
  // The plain entry point refuses region ops, and make_region refuses the others.
  expect_error([&] { b.make(OpKind::Call, std::span<const Value>(&x, 1)); },
               {"[call] has several results: build it with Builder::make_region"});
  expect_error([&] { b.make_region(OpKind::Exp, std::span<const Value>(&x, 1), {}, {}); },
               {"[exp] has one result; use infer_type"});
}

TEST(ControlFlowIr, VerifyRechecksRegionNodes) {
  Graph g = testing::control_flow_graph();
  EXPECT_NO_THROW(verify(g));
  Graph broken = g;
  NodeId scan = broken.outputs()[0].node;
  broken.mutable_node(scan).more_types[0] = {float32, {5, 3}};
  expect_error([&] { verify(broken); },
               {"(scan): recorded types f32[], f32[5,3] differ from the inferred f32[], f32[4,3]"});
  broken = g;
  broken.mutable_node(scan).attrs.flag = true;  // reverse is fine
  EXPECT_NO_THROW(verify(broken));
  broken.mutable_node(scan).attrs.i = 3;
  expect_error([&] { verify(broken); }, {"(scan): [scan] xs 0 must have leading dim length = 3"});
  // An ill-typed node inside a region is found through the regions.
  broken = g;
  auto bad = std::make_shared<Graph>(*broken.node(scan).regions[0]);
  bad->mutable_node(bad->outputs()[0].node).type = {float64, {}};
  broken.mutable_node(scan).regions[0] = bad;
  expect_error([&] { verify(broken); }, {"(scan): in region 0: [verify] node"});
}

// The documented text form of a scan (docs/ir.md), parsed, printed back and checked.
const char* kScanText =
    "graph(%0: f32[], %1: f32[5]) {\n"
    "  %2:2 = scan(%0, %1) {counts=[1,1], length=5, reverse=false} : f32[], f32[5] "
    "graph(%3: i64[], %4: f32[], %5: f32[]) {\n"
    "    %6 = add(%4, %5) : f32[]\n"
    "    return %6, %6\n"
    "  }\n"
    "  return %2#0, %2#1\n"
    "}\n";

TEST(ControlFlowIr, TextRoundTripsNestedRegions) {
  Graph s = parse(kScanText);
  EXPECT_EQ(to_text(s), kScanText);
  Graph g = testing::control_flow_graph();
  std::string text = to_text(g);
  Graph back = parse(text);
  EXPECT_EQ(to_text(back), text);
  EXPECT_TRUE(structurally_equal(g, back));
  EXPECT_EQ(fingerprint(g), fingerprint(back));
  EXPECT_NE(text.find("scan(%"), std::string::npos);
  EXPECT_NE(text.find("while("), std::string::npos);
  EXPECT_NE(text.find("reverse=true"), std::string::npos);
}

TEST(ControlFlowIr, FingerprintSeesInsideNestedRegions) {
  std::string text = to_text(testing::control_flow_graph());
  // The innermost scan body adds; make it subtract, three levels down.
  std::string changed = text;
  size_t at = changed.find("add(");
  ASSERT_NE(at, std::string::npos);
  changed.replace(at, 3, "sub");
  Graph a = parse(text), b = parse(changed);
  EXPECT_FALSE(structurally_equal(a, b));
  EXPECT_NE(fingerprint(a), fingerprint(b));
  EXPECT_EQ(fingerprint(a), fingerprint(parse(text)));  // stable across parses
}

TEST(ControlFlowIr, ParserChecksRegionNodes) {
  auto parse_error = [](const std::string& text, const std::string& what) {
    expect_error([&] { parse(text); }, {what});
  };
  std::string wrong_type = kScanText;
  wrong_type.replace(wrong_type.find(": f32[], f32[5] "), 16, ": f32[], f32[4] ");
  parse_error(wrong_type,
              "[scan] result types are written f32[], f32[4] but the operands and regions give "
              "f32[], f32[5]");
  std::string wrong_len = kScanText;
  wrong_len.replace(wrong_len.find("length=5"), 8, "length=6");
  parse_error(wrong_len, "[scan] xs 0 must have leading dim length = 6, got f32[5]");
  parse_error("graph(%0: f32[4]) {\n  %1 = call(%0) : f32[4]\n  return %1\n}",
              "[call] expected 1 region(s), got 0");
}

TEST(ControlFlowIr, PassesKeepRegionNodes) {
  // A dead scan goes, a used call stays, and the regions are shared, not copied.
  Graph g = parse(
      "graph(%x: f32[4]) {\n"
      "  %z = constant() {value=0} : f32[]\n"
      "  %s = scan(%z) {counts=[1,0], length=3} : f32[] graph(%i: i64[], %c: f32[]) {\n"
      "    return %c\n  }\n"
      "  %c = call(%x) : f32[4] graph(%a: f32[4]) {\n"
      "    %e = exp(%a) : f32[4]\n    return %e\n  }\n"
      "  %c2 = call(%x) : f32[4] graph(%a: f32[4]) {\n"
      "    %e = exp(%a) : f32[4]\n    return %e\n  }\n"
      "  %y = add(%c, %z) : f32[4]\n"
      "  return %y, %c2\n}");
  const Graph* body = g.node(3).regions[0].get();
  passes::Pipeline keep;  // the default pipeline without inline
  keep.add(passes::make_pass("simplify"))
      .add(passes::make_pass("cse"))
      .add(passes::make_pass("dce"));
  EXPECT_TRUE(keep.run(g));
  EXPECT_NO_THROW(verify(g));
  EXPECT_EQ(to_text(g),
            "graph(%0: f32[4]) {\n"
            "  %1 = call(%0) : f32[4] graph(%2: f32[4]) {\n"
            "    %3 = exp(%2) : f32[4]\n    return %3\n  }\n"
            "  %4 = call(%0) : f32[4] graph(%5: f32[4]) {\n"
            "    %6 = exp(%5) : f32[4]\n    return %6\n  }\n"
            "  return %1, %4\n}\n");
  EXPECT_EQ(g.node(1).regions[0].get(), body);  // regions are immutable and shared
}

TEST(ControlFlowIr, InlineReplacesCallsNestedOnesAndInsideLoops) {
  Graph g = parse(
      "graph(%x: f32[4]) {\n"
      "  %c:2 = call(%x, %x) : f32[4], f32[4] graph(%a: f32[4], %b: f32[4]) {\n"
      "    %d = call(%a) : f32[4] graph(%p: f32[4]) {\n"
      "      %e = exp(%p) : f32[4]\n      return %e\n    }\n"
      "    %m = mul(%d, %b) : f32[4]\n    return %m, %a\n  }\n"
      "  %z = constant() {value=0} : f32[]\n"
      "  %s = scan(%z) {counts=[1,0], length=3} : f32[] graph(%i: i64[], %q: f32[]) {\n"
      "    %k = call(%q) : f32[] graph(%r: f32[]) {\n      return %r\n    }\n"
      "    return %k\n  }\n"
      "  %y = add(%c#0, %c#1) : f32[4]\n"
      "  return %y, %s\n}");
  EXPECT_TRUE(passes::default_pipeline().run(g));
  EXPECT_NO_THROW(verify(g));
  std::string text = to_text(g);
  EXPECT_NE(text.find("%1 = exp(%0) : f32[4]\n  %2 = mul(%1, %0) : f32[4]\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("= add(%2, %0) : f32[4]"), std::string::npos) << text;
  EXPECT_EQ(text.find("call("), std::string::npos) << text;  // the scan body's call too
  EXPECT_NE(text.find("scan("), std::string::npos) << text;
}

}  // namespace
}  // namespace loom::ir
