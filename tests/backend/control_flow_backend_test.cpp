// call, scan and while on the ref and cpu backends (through the runtime), each checked against
// a closed form computed here: cumulative sums forwards and backwards, zero-length scans,
// several carries and ys of different dtypes, a counting while loop, nested scans and calls.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "backend/ref_test_util.h"
#include "ir/sample_graphs.h"
#include "ir/region_util.h"
#include "loom/backend/ref_backend.h"
#include "loom/ir/builder.h"
#include "loom/runtime/engine.h"

namespace loom {
namespace {

using ir::Attrs;
using ir::Builder;
using ir::Graph;
using ir::OpKind;
using ir::Value;
using reftest::decode_floats;
using reftest::decode_ints;
using reftest::encode_floats;
using reftest::encode_ints;
using loom::ir::testing::Region;

const TensorType kI64{DType::Int64, {}};
const TensorType kF32{DType::Float32, {}};
constexpr const char* kBackends[] = {"ref", "cpu"};

using loom::ir::testing::region;
using loom::ir::testing::scan_attrs;

// Runs g on each backend in turn and hands the outputs to check; restores the backend.
template <class Check>
void on_each_backend(const Graph& g, const std::vector<Buffer>& inputs, Check&& check) {
  const std::string previous(runtime::current_backend().name());
  for (const char* name : kBackends) {
    SCOPED_TRACE(name);
    runtime::set_backend(name);
    std::vector<Buffer> out = runtime::run_graph(g, inputs);
    ASSERT_EQ(out.size(), g.outputs().size());
    check(out);
  }
  runtime::set_backend(previous);
}

std::vector<double> floats(const Graph& g, const std::vector<Buffer>& out, size_t k) {
  return decode_floats(g.type(g.outputs()[k]).dtype, out[k]);
}
std::vector<int64_t> ints(const Graph& g, const std::vector<Buffer>& out, size_t k) {
  return decode_ints(g.type(g.outputs()[k]).dtype, out[k]);
}

// (t, c, x) -> (c + x, c + x, t): a running sum, its ys, and the step index as a y.
Region cumsum_body() {
  return region({kI64, kF32, kF32}, [](Builder& b, std::vector<Value> p) {
    Value s = b.binary(OpKind::Add, p[1], p[2]);
    return std::vector<Value>{s, s, p[0]};
  });
}

// A cumulative sum of n values, forwards or in reverse, with the index of each step's slice.
Graph cumsum_graph(int64_t n, bool reverse) {
  Graph g;
  Builder b(g);
  Value init = b.parameter(kF32);
  Value xs = b.parameter({DType::Float32, {n}});
  Value ops[] = {init, xs};
  std::vector<Value> r = b.make_region(OpKind::Scan, ops, scan_attrs(1, 1, n, reverse),
                                       {cumsum_body()});
  // Consumers of results 0 and 1 fuse on the cpu backend: they read per-result buffers.
  Value doubled = b.binary(OpKind::Mul, r[1], b.constant(2, DType::Float32));
  g.outputs() = {r[0], r[1], r[2], doubled, r[1]};
  return g;
}

TEST(ControlFlowBackend, CumsumByScanMatchesClosedForm) {
  const int64_t n = 7;
  std::vector<double> x;
  for (int64_t k = 0; k < n; ++k) x.push_back(0.5 * static_cast<double>(k) - 1);
  Graph g = cumsum_graph(n, false);
  std::vector<Buffer> in = {encode_floats(DType::Float32, {10}), encode_floats(DType::Float32, x)};
  std::vector<double> want;
  double s = 10;
  for (double v : x) want.push_back(s += v);
  on_each_backend(g, in, [&](const std::vector<Buffer>& out) {
    EXPECT_EQ(floats(g, out, 0), std::vector<double>{want.back()});
    EXPECT_EQ(floats(g, out, 1), want);
    EXPECT_EQ(ints(g, out, 2), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
    std::vector<double> twice;
    for (double v : want) twice.push_back(2 * v);
    EXPECT_EQ(floats(g, out, 3), twice);
    EXPECT_EQ(floats(g, out, 4), want);
  });
}

TEST(ControlFlowBackend, ReverseScanPairsYsWithTheirSlices) {
  const int64_t n = 5;
  std::vector<double> x = {1, 2, 4, 8, 16};
  Graph g = cumsum_graph(n, true);
  std::vector<Buffer> in = {encode_floats(DType::Float32, {0}), encode_floats(DType::Float32, x)};
  // ys[t] is the suffix sum from t: the step that read xs[t] wrote ys[t].
  std::vector<double> want(n);
  double s = 0;
  for (int64_t t = n; t-- > 0;) want[t] = s += x[t];
  on_each_backend(g, in, [&](const std::vector<Buffer>& out) {
    EXPECT_EQ(floats(g, out, 0), std::vector<double>{31});
    EXPECT_EQ(floats(g, out, 1), want);
    EXPECT_EQ(ints(g, out, 2), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  });
}

TEST(ControlFlowBackend, ZeroLengthScanReturnsTheInitCarries) {
  Graph g = cumsum_graph(0, false);
  std::vector<Buffer> in = {encode_floats(DType::Float32, {3.5}),
                            encode_floats(DType::Float32, {})};
  on_each_backend(g, in, [&](const std::vector<Buffer>& out) {
    EXPECT_EQ(floats(g, out, 0), std::vector<double>{3.5});
    EXPECT_EQ(out[1].nbytes(), 0u);
    EXPECT_EQ(out[2].nbytes(), 0u);
    EXPECT_EQ(g.type(g.outputs()[1]), (TensorType{DType::Float32, {0}}));
  });
}

TEST(ControlFlowBackend, TwoCarriesTwoYsOfDifferentDtypesAndACapture) {
  // carries: count i64[], sum f64[2]; xs: f32[4,2]; captured: scale f32[].
  // body: count + 1, sum + f64(x); ys: x * scale (f32[2]), x > 0 (bool[2]).
  const TensorType row{DType::Float32, {2}};
  Region body = region({kI64, kI64, {DType::Float64, {2}}, row, kF32},
                       [&](Builder& b, std::vector<Value> p) {
    Value count = b.binary(OpKind::Add, p[1], b.constant(1, DType::Int64));
    Value sum = b.binary(OpKind::Add, p[2], b.convert(p[3], DType::Float64));
    Value scaled = b.binary(OpKind::Mul, p[3], p[4]);
    Value pos = b.binary(OpKind::Gt, p[3], b.constant(0, DType::Float32));
    return std::vector<Value>{count, sum, scaled, pos};
  });
  Graph g;
  Builder b(g);
  Value count = b.parameter(kI64);
  Value sum = b.parameter({DType::Float64, {2}});
  Value xs = b.parameter({DType::Float32, {4, 2}});
  Value scale = b.parameter(kF32);
  Value ops[] = {count, sum, xs, scale};
  std::vector<Value> r = b.make_region(OpKind::Scan, ops, scan_attrs(2, 1, 4), {body});
  g.outputs() = {r[0], r[1], r[2], r[3]};
  std::vector<double> x = {1, -2, 0, 3, -0.5, 4, 2, -1};
  std::vector<Buffer> in = {encode_ints(DType::Int64, {5}),
                            encode_floats(DType::Float64, {0.25, 100}),
                            encode_floats(DType::Float32, x), encode_floats(DType::Float32, {3})};
  std::vector<double> want_sum = {0.25, 100}, want_scaled;
  std::vector<int64_t> want_pos;
  for (size_t k = 0; k < x.size(); ++k) {
    want_sum[k % 2] += x[k];
    want_scaled.push_back(3 * x[k]);
    want_pos.push_back(x[k] > 0);
  }
  on_each_backend(g, in, [&](const std::vector<Buffer>& out) {
    EXPECT_EQ(ints(g, out, 0), std::vector<int64_t>{9});
    EXPECT_EQ(floats(g, out, 1), want_sum);
    EXPECT_EQ(floats(g, out, 2), want_scaled);
    EXPECT_EQ(ints(g, out, 3), want_pos);
    EXPECT_EQ(g.type(g.outputs()[3]), (TensorType{DType::Bool, {4, 2}}));
  });
}

// The seed's example, as IR text: while i > 0 { i -= 1; x += 1 } from i = 10, x = 3.
const char* kCountDown =
    "graph(%i: i64[], %x: f32[]) {\n"
    "  %r:2 = while(%i, %x) {counts=[2]} : i64[], f32[]\n"
    "  graph(%ci: i64[], %cx: f32[]) {\n"
    "    %zero = constant() {value=0} : i64[]\n"
    "    %go = gt(%ci, %zero) : bool[]\n"
    "    return %go\n"
    "  } graph(%bi: i64[], %bx: f32[]) {\n"
    "    %one = constant() {value=1} : i64[]\n"
    "    %onef = constant() {value=1} : f32[]\n"
    "    %ni = sub(%bi, %one) : i64[]\n"
    "    %nx = add(%bx, %onef) : f32[]\n"
    "    return %ni, %nx\n"
    "  }\n"
    "  return %r#0, %r#1\n"
    "}\n";

TEST(ControlFlowBackend, WhileLoopCountsDown) {
  Graph g = ir::parse(kCountDown);
  for (int64_t start : {10, 0, -3}) {
    std::vector<Buffer> in = {encode_ints(DType::Int64, {start}),
                              encode_floats(DType::Float32, {3})};
    on_each_backend(g, in, [&](const std::vector<Buffer>& out) {
      EXPECT_EQ(ints(g, out, 0), std::vector<int64_t>{std::min<int64_t>(start, 0)});
      EXPECT_EQ(floats(g, out, 1), std::vector<double>{3.0 + std::max<int64_t>(start, 0)});
    });
  }
}

TEST(ControlFlowBackend, NestedScanSumsRowsAndAll) {
  // Outer scan over the rows of x [3,4], carry = the running total; its body runs an inner
  // scan over the row (a cumulative sum) and adds the row's total to the outer carry.
  const TensorType row{DType::Float32, {4}};
  Region inner = region({kI64, kF32, kF32}, [](Builder& b, std::vector<Value> p) {
    Value s = b.binary(OpKind::Add, p[1], p[2]);
    return std::vector<Value>{s, s};
  });
  Region outer = region({kI64, kF32, row}, [&](Builder& b, std::vector<Value> p) {
    Value zero = b.constant(0, DType::Float32);
    Value ops[] = {zero, p[2]};
    std::vector<Value> r = b.make_region(OpKind::Scan, ops, scan_attrs(1, 1, 4), {inner});
    return std::vector<Value>{b.binary(OpKind::Add, p[1], r[0]), r[1]};
  });
  Graph g;
  Builder b(g);
  Value x = b.parameter({DType::Float32, {3, 4}});
  Value zero = b.constant(0, DType::Float32);
  Value ops[] = {zero, x};
  std::vector<Value> r = b.make_region(OpKind::Scan, ops, scan_attrs(1, 1, 3), {outer});
  g.outputs() = {r[0], r[1]};
  std::vector<double> xv;
  for (int k = 0; k < 12; ++k) xv.push_back(k * k % 7 - 2);
  std::vector<double> want_rows;
  double total = 0;
  for (int i = 0; i < 3; ++i) {
    double s = 0;
    for (int j = 0; j < 4; ++j) want_rows.push_back(s += xv[4 * i + j]);
    total += s;
  }
  on_each_backend(g, {encode_floats(DType::Float32, xv)}, [&](const std::vector<Buffer>& out) {
    EXPECT_EQ(floats(g, out, 0), std::vector<double>{total});
    EXPECT_EQ(floats(g, out, 1), want_rows);
  });
}

TEST(ControlFlowBackend, CallReturnsEveryBodyOutput) {
  const TensorType v3{DType::Float64, {3}};
  Region body = region({v3, v3}, [](Builder& b, std::vector<Value> p) {
    return std::vector<Value>{b.binary(OpKind::Mul, p[0], p[1]), b.binary(OpKind::Sub, p[0], p[1])};
  });
  Graph g;
  Builder b(g);
  Value x = b.parameter(v3);
  Value y = b.parameter(v3);
  Value ops[] = {x, y};
  std::vector<Value> r = b.make_region(OpKind::Call, ops, {}, {body});
  // A fused consumer of result 1 reads its own buffer on the cpu backend.
  g.outputs() = {r[0], r[1], b.reduce(OpKind::ReduceSum, r[1], {0}, false)};
  std::vector<double> xv = {1, 2, 3}, yv = {0.5, -1, 4};
  on_each_backend(g, {encode_floats(DType::Float64, xv), encode_floats(DType::Float64, yv)},
                  [&](const std::vector<Buffer>& out) {
    EXPECT_EQ(floats(g, out, 0), (std::vector<double>{0.5, -2, 12}));
    EXPECT_EQ(floats(g, out, 1), (std::vector<double>{0.5, 3, -1}));
    EXPECT_EQ(floats(g, out, 2), (std::vector<double>{2.5}));
  });
}

// The IR tests' sample: a scan in a scan body, a while (with a capture) in a call, and a
// reversed scan without carries.
TEST(ControlFlowBackend, SampleGraphWithNestedRegions) {
  Graph g = ir::testing::control_flow_graph();
  std::vector<double> x = {1, -2, 3, 0, 2, -1, 4, 1, -3, 2, 2, -1};
  const double s0 = 0.5;
  const int64_t k = 3;
  // Scan in scan: one running sum threads through all rows; y = (sum before) * x.
  std::vector<double> want_ys;
  double acc = s0;
  for (double v : x) {
    want_ys.push_back(acc * v);
    acc += v;
  }
  std::vector<double> want_call, want_rev;
  for (int j = 0; j < 3; ++j) want_call.push_back(x[j] + k * x[3 + j]);
  for (int t = 0; t < 4; ++t)
    for (int j = 0; j < 3; ++j) want_rev.push_back(t + x[3 * t + j]);
  std::vector<Buffer> in = {encode_floats(DType::Float32, {s0}), encode_floats(DType::Float32, x),
                            encode_ints(DType::Int64, {k})};
  on_each_backend(g, in, [&](const std::vector<Buffer>& out) {
    EXPECT_EQ(floats(g, out, 0), want_ys);
    EXPECT_EQ(floats(g, out, 1), std::vector<double>{acc});
    EXPECT_EQ(floats(g, out, 2), want_call);
    EXPECT_EQ(floats(g, out, 3), want_rev);
  });
}

TEST(ControlFlowBackend, RefEvalNodeAllRunsARegionNode) {
  Graph g = ir::parse(kCountDown);
  const ir::NodeId w = g.outputs()[0].node;
  std::vector<Buffer> in = {encode_ints(DType::Int64, {4}), encode_floats(DType::Float32, {1})};
  std::vector<Buffer> out = backend::ref_eval_node_all(g, w, in);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(decode_ints(DType::Int64, out[0]), std::vector<int64_t>{0});
  EXPECT_EQ(decode_floats(DType::Float32, out[1]), std::vector<double>{5});
  EXPECT_EQ(decode_ints(DType::Int64, backend::ref_eval_node(g, w, in)), std::vector<int64_t>{0});
}

}  // namespace
}  // namespace loom
