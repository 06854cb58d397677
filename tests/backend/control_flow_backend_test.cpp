// call, scan and while on the ref and cpu backends (through the runtime), each checked against
// a closed form computed here or, for the cpu backend's native loops, against the reference
// backend as oracle: cumulative sums forwards and backwards, zero-length scans, several
// carries and ys of different dtypes, bodies with BLAS products, copies, fallbacks, random
// numbers and threaded kernels, while loops with captures and zero trips, nested loops.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>

#include "backend/ref_test_util.h"
#include "ir/region_util.h"
#include "ir/sample_graphs.h"
#include "loom/backend/cpu_backend.h"
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
using loom::ir::testing::Region;
using reftest::decode_floats;
using reftest::decode_ints;
using reftest::encode_floats;
using reftest::encode_ints;

const TensorType kI64{DType::Int64, {}};
const TensorType kF32{DType::Float32, {}};
constexpr const char* kBackends[] = {"ref", "cpu"};

using loom::ir::testing::region;
using loom::ir::testing::scan_attrs;
using loom::ir::testing::while_attrs;

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
  std::vector<Value> r =
      b.make_region(OpKind::Scan, ops, scan_attrs(1, 1, n, reverse), {cumsum_body()});
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
  Region body =
      region({kI64, kI64, {DType::Float64, {2}}, row, kF32}, [&](Builder& b, std::vector<Value> p) {
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

// ---- The cpu backend's native loops against the reference backend -------------------------

// Runs g on the ref backend (the oracle) and on the cpu backend and compares every output:
// exactly when rtol is 0 (and always for integers and bools), else within rtol * (1 + |want|).
void expect_cpu_matches_ref(const Graph& g, const std::vector<Buffer>& in, double rtol = 0) {
  const std::string previous(runtime::current_backend().name());
  runtime::set_backend("ref");
  std::vector<Buffer> want = runtime::run_graph(g, in);
  runtime::set_backend("cpu");
  std::vector<Buffer> got = runtime::run_graph(g, in);
  runtime::set_backend(previous);
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < got.size(); ++k) {
    SCOPED_TRACE("output " + std::to_string(k));
    const DType dt = g.type(g.outputs()[k]).dtype;
    ASSERT_EQ(got[k].nbytes(), want[k].nbytes());
    if (!is_floating(dt)) {
      EXPECT_EQ(decode_ints(dt, got[k]), decode_ints(dt, want[k]));
      continue;
    }
    std::vector<double> gv = decode_floats(dt, got[k]), wv = decode_floats(dt, want[k]);
    if (rtol == 0) {
      EXPECT_EQ(gv, wv);
      continue;
    }
    for (size_t i = 0; i < gv.size(); ++i)
      EXPECT_NEAR(gv[i], wv[i], rtol * (1 + std::fabs(wv[i]))) << "element " << i;
  }
}

// n values that are multiples of 1/4 in [-2, 2]: sums of a few stay exact in any float type.
std::vector<double> quarters(int64_t n, int64_t salt = 0) {
  std::vector<double> v;
  for (int64_t i = 0; i < n; ++i)
    v.push_back(static_cast<double>((i * 37 + salt * 11) % 17 - 8) / 4);
  return v;
}

TEST(ControlFlowCpu, ScanBodyWithMatMulsMatchesRef) {
  // h' = tanh(h @ W + x), y = h' @ W^T (the transpose is a BLAS flag): two products per step.
  for (DType dt : {DType::Float32, DType::Float64}) {
    SCOPED_TRACE(std::string(short_name(dt)));
    const TensorType h{dt, {2, 3}}, w{dt, {3, 3}};
    Region body = region({kI64, h, h, w}, [&](Builder& b, std::vector<Value> p) {
      Value next = b.unary(OpKind::Tanh, b.binary(OpKind::Add, b.matmul(p[1], p[3]), p[2]));
      return std::vector<Value>{next, b.matmul(next, b.permute(p[3], {1, 0}))};
    });
    Graph g;
    Builder b(g);
    Value h0 = b.parameter(h);
    Value xs = b.parameter({dt, {6, 2, 3}});
    Value wv = b.parameter(w);
    Value ops[] = {h0, xs, wv};
    std::vector<Value> r = b.make_region(OpKind::Scan, ops, scan_attrs(1, 1, 6), {body});
    g.outputs() = {r[0], r[1]};
    std::vector<Buffer> in = {encode_floats(dt, quarters(6)), encode_floats(dt, quarters(36, 1)),
                              encode_floats(dt, quarters(9, 2))};
    expect_cpu_matches_ref(g, in, dt == DType::Float32 ? 2e-6 : 1e-13);
  }
}

TEST(ControlFlowCpu, BodyReturningParametersAndOneValueTwiceCopies) {
  // carries: a f32[3] returned unchanged, n i64[] -> n + 1; ys: the slice x itself, n + 1 (the
  // node that is also carry 1), a (a parameter that is also carry 0).
  const TensorType v3{DType::Float32, {3}};
  Region body = region({kI64, v3, kI64, v3}, [](Builder& b, std::vector<Value> p) {
    Value n1 = b.binary(OpKind::Add, p[2], b.constant(1, DType::Int64));
    return std::vector<Value>{p[1], n1, p[3], n1, p[1]};
  });
  for (bool reverse : {false, true}) {
    SCOPED_TRACE(reverse ? "reverse" : "forward");
    Graph g;
    Builder b(g);
    Value a = b.parameter(v3);
    Value n = b.parameter(kI64);
    Value xs = b.parameter({DType::Float32, {4, 3}});
    Value ops[] = {a, n, xs};
    std::vector<Value> r = b.make_region(OpKind::Scan, ops, scan_attrs(2, 1, 4, reverse), {body});
    g.outputs() = {r[0], r[1], r[2], r[3], r[4]};
    std::vector<double> av = {1.5, -2, 3}, x = quarters(12);
    std::vector<Buffer> in = {encode_floats(DType::Float32, av), encode_ints(DType::Int64, {10}),
                              encode_floats(DType::Float32, x)};
    std::vector<int64_t> want_n(4);
    for (int64_t t = 0; t < 4; ++t) want_n[t] = reverse ? 14 - t : 11 + t;
    std::vector<double> want_a;
    for (int t = 0; t < 4; ++t) want_a.insert(want_a.end(), av.begin(), av.end());
    on_each_backend(g, in, [&](const std::vector<Buffer>& out) {
      EXPECT_EQ(floats(g, out, 0), av);
      EXPECT_EQ(ints(g, out, 1), std::vector<int64_t>{14});
      EXPECT_EQ(floats(g, out, 2), x);
      EXPECT_EQ(ints(g, out, 3), want_n);
      EXPECT_EQ(floats(g, out, 4), want_a);
    });
  }
}

// carries: count i64, odd bool (flips on each positive x), sum f32; ys: 2 * count' (i64),
// x > 0 (bool), sum' (f32). Lengths 0..3 cover the empty scan and both carry parities.
TEST(ControlFlowCpu, CarriesAndYsOfThreeDtypesForShortLengths) {
  const TensorType kBool{DType::Bool, {}};
  Region body = region({kI64, kI64, kBool, kF32, kF32}, [&](Builder& b, std::vector<Value> p) {
    Value count = b.binary(OpKind::Add, p[1], b.constant(1, DType::Int64));
    Value pos = b.binary(OpKind::Gt, p[4], b.constant(0, DType::Float32));
    Value odd = b.binary(OpKind::Ne, p[2], pos);
    Value sum = b.binary(OpKind::Add, p[3], p[4]);
    Value twice = b.binary(OpKind::Mul, count, b.constant(2, DType::Int64));
    return std::vector<Value>{count, odd, sum, twice, pos, sum};
  });
  for (int64_t n = 0; n <= 3; ++n) {
    SCOPED_TRACE("length " + std::to_string(n));
    Graph g;
    Builder b(g);
    Value count = b.parameter(kI64);
    Value odd = b.parameter(kBool);
    Value sum = b.parameter(kF32);
    Value xs = b.parameter({DType::Float32, {n}});
    Value ops[] = {count, odd, sum, xs};
    std::vector<Value> r = b.make_region(OpKind::Scan, ops, scan_attrs(3, 1, n), {body});
    g.outputs() = {r[0], r[1], r[2], r[3], r[4], r[5]};
    std::vector<double> x = {2.5, -1, 0.75};
    x.resize(n);
    std::vector<Buffer> in = {encode_ints(DType::Int64, {7}), encode_ints(DType::Bool, {1}),
                              encode_floats(DType::Float32, {-0.5}),
                              encode_floats(DType::Float32, x)};
    int64_t c = 7, o = 1;
    double s = -0.5;
    std::vector<int64_t> want_twice, want_pos;
    std::vector<double> want_sums;
    for (double v : x) {
      ++c;
      o ^= v > 0;
      s += v;
      want_twice.push_back(2 * c);
      want_pos.push_back(v > 0);
      want_sums.push_back(s);
    }
    on_each_backend(g, in, [&](const std::vector<Buffer>& out) {
      EXPECT_EQ(ints(g, out, 0), std::vector<int64_t>{c});
      EXPECT_EQ(ints(g, out, 1), std::vector<int64_t>{o});
      EXPECT_EQ(floats(g, out, 2), std::vector<double>{s});
      EXPECT_EQ(ints(g, out, 3), want_twice);
      EXPECT_EQ(ints(g, out, 4), want_pos);
      EXPECT_EQ(floats(g, out, 5), want_sums);
    });
  }
}

TEST(ControlFlowCpu, MultiDimSlicesForwardAndReverseMatchRef) {
  // xs f32[4,2,3] and i32[4,3]; carry c f32[2,3]: c' = c * 0.5 + x; ys: the row sums of x
  // (f32[2]), the i32 slice times the index, and c' broadcast against the i32 slice.
  const TensorType m{DType::Float32, {2, 3}}, v{DType::Int32, {3}};
  Region body = region({kI64, m, m, v}, [&](Builder& b, std::vector<Value> p) {
    Value c =
        b.binary(OpKind::Add, b.binary(OpKind::Mul, p[1], b.constant(0.5, DType::Float32)), p[2]);
    Value rows = b.reduce(OpKind::ReduceSum, p[2], {1}, false);
    Value scaled = b.binary(OpKind::Mul, p[3], b.convert(p[0], DType::Int32));
    Value mixed = b.binary(OpKind::Sub, c, b.convert(p[3], DType::Float32));
    return std::vector<Value>{c, rows, scaled, mixed};
  });
  for (bool reverse : {false, true}) {
    SCOPED_TRACE(reverse ? "reverse" : "forward");
    Graph g;
    Builder b(g);
    Value c0 = b.parameter(m);
    Value xs = b.parameter({DType::Float32, {4, 2, 3}});
    Value is = b.parameter({DType::Int32, {4, 3}});
    Value ops[] = {c0, xs, is};
    std::vector<Value> r = b.make_region(OpKind::Scan, ops, scan_attrs(1, 2, 4, reverse), {body});
    g.outputs() = {r[0], r[1], r[2], r[3]};
    std::vector<int64_t> iv;
    for (int k = 0; k < 12; ++k) iv.push_back(k % 5 - 2);
    expect_cpu_matches_ref(
        g, {encode_floats(DType::Float32, quarters(6)),
            encode_floats(DType::Float32, quarters(24, 3)), encode_ints(DType::Int32, iv)});
  }
}

TEST(ControlFlowCpu, CapturedOperandsIncludingAGraphOutput) {
  // w = v * 2 + 1 is computed outside, captured by the body and also a graph output; v is a
  // parameter, captured and returned. Body: c' = c + v * w, y = c' - w.
  const TensorType v3{DType::Float32, {3}};
  Region body = region({kI64, v3, v3, v3}, [](Builder& b, std::vector<Value> p) {
    Value c = b.binary(OpKind::Add, p[1], b.binary(OpKind::Mul, p[2], p[3]));
    return std::vector<Value>{c, b.binary(OpKind::Sub, c, p[3])};
  });
  Graph g;
  Builder b(g);
  Value c0 = b.parameter(v3);
  Value v = b.parameter(v3);
  Value w = b.binary(OpKind::Add, b.binary(OpKind::Mul, v, b.constant(2, DType::Float32)),
                     b.constant(1, DType::Float32));
  Value ops[] = {c0, v, w};
  std::vector<Value> r = b.make_region(OpKind::Scan, ops, scan_attrs(1, 0, 3), {body});
  g.outputs() = {r[0], r[1], w, v};
  std::vector<double> cv = {0, 1, -1}, vv = {0.5, -1, 2}, wv, want_c = cv, want_y;
  for (double x : vv) wv.push_back(2 * x + 1);
  for (int t = 0; t < 3; ++t)
    for (int j = 0; j < 3; ++j) want_y.push_back((want_c[j] += vv[j] * wv[j]) - wv[j]);
  std::vector<Buffer> in = {encode_floats(DType::Float32, cv), encode_floats(DType::Float32, vv)};
  on_each_backend(g, in, [&](const std::vector<Buffer>& out) {
    EXPECT_EQ(floats(g, out, 0), want_c);
    EXPECT_EQ(floats(g, out, 1), want_y);
    EXPECT_EQ(floats(g, out, 2), wv);
    EXPECT_EQ(floats(g, out, 3), vv);
  });
}

TEST(ControlFlowCpu, BigBodyRunsThreadedKernelsAndMatchesRef) {
  // [256,1024] per step: the body's kernels are big enough to split across the pool.
  const TensorType m{DType::Float32, {256, 1024}};
  Region body = region({kI64, m, m}, [](Builder& b, std::vector<Value> p) {
    Value c =
        b.binary(OpKind::Add, b.binary(OpKind::Mul, p[1], b.constant(0.5, DType::Float32)), p[2]);
    return std::vector<Value>{c, b.reduce(OpKind::ReduceMax, c, {1}, false)};
  });
  Graph g;
  Builder b(g);
  Value c0 = b.parameter(m);
  Value xs = b.parameter({DType::Float32, {3, 256, 1024}});
  Value ops[] = {c0, xs};
  std::vector<Value> r = b.make_region(OpKind::Scan, ops, scan_attrs(1, 1, 3), {body});
  g.outputs() = {r[0], r[1]};
  expect_cpu_matches_ref(g, {encode_floats(DType::Float32, quarters(256 * 1024)),
                             encode_floats(DType::Float32, quarters(3 * 256 * 1024, 5))});
}

TEST(ControlFlowCpu, WhileAndCallInsideAScan) {
  // For each x: v = 1; i = 0; while i < x { i += 1; v = call double(v) }; acc += v; y = v.
  const TensorType kF64{DType::Float64, {}};
  Region twice = region({kF64}, [&](Builder& b, std::vector<Value> p) {
    return std::vector<Value>{b.binary(OpKind::Add, p[0], p[0])};
  });
  Region cond = region({kI64, kF64, kI64}, [](Builder& b, std::vector<Value> p) {
    return std::vector<Value>{b.binary(OpKind::Lt, p[0], p[2])};
  });
  Region wbody = region({kI64, kF64, kI64}, [&](Builder& b, std::vector<Value> p) {
    Value ops[] = {p[1]};
    Value v = b.make_region(OpKind::Call, ops, {}, {twice})[0];
    return std::vector<Value>{b.binary(OpKind::Add, p[0], b.constant(1, DType::Int64)), v};
  });
  Region body = region({kI64, kF64, kI64}, [&](Builder& b, std::vector<Value> p) {
    Value ops[] = {b.constant(0, DType::Int64), b.constant(1, DType::Float64), p[2]};
    Value v = b.make_region(OpKind::While, ops, while_attrs(2), {cond, wbody})[1];
    return std::vector<Value>{b.binary(OpKind::Add, p[1], v), v};
  });
  Graph g;
  Builder b(g);
  Value acc = b.parameter(kF64);
  Value xs = b.parameter({DType::Int64, {5}});
  Value ops[] = {acc, xs};
  std::vector<Value> r = b.make_region(OpKind::Scan, ops, scan_attrs(1, 1, 5), {body});
  g.outputs() = {r[0], r[1]};
  std::vector<int64_t> x = {3, 0, 5, 1, 0};
  std::vector<double> want_y;
  double want_acc = 0.25;
  for (int64_t k : x) want_acc += want_y.emplace_back(std::ldexp(1.0, static_cast<int>(k)));
  on_each_backend(g, {encode_floats(DType::Float64, {0.25}), encode_ints(DType::Int64, x)},
                  [&](const std::vector<Buffer>& out) {
                    EXPECT_EQ(floats(g, out, 0), std::vector<double>{want_acc});
                    EXPECT_EQ(floats(g, out, 1), want_y);
                  });
}

TEST(ControlFlowCpu, WhileWithCapturesAndZeroTrips) {
  // while i < limit { acc += f32(i) * scale; i += step } with limit, step, scale captured.
  const TensorType v2{DType::Float32, {2}};
  Region cond = region({kI64, v2, kI64, kI64, v2}, [](Builder& b, std::vector<Value> p) {
    return std::vector<Value>{b.binary(OpKind::Lt, p[0], p[2])};
  });
  Region body = region({kI64, v2, kI64, kI64, v2}, [](Builder& b, std::vector<Value> p) {
    Value fi = b.convert(p[0], DType::Float32);
    Value acc = b.binary(OpKind::Add, p[1], b.binary(OpKind::Mul, fi, p[4]));
    return std::vector<Value>{b.binary(OpKind::Add, p[0], p[3]), acc};
  });
  Graph g;
  Builder b(g);
  Value i0 = b.parameter(kI64);
  Value acc0 = b.parameter(v2);
  Value limit = b.parameter(kI64);
  Value step = b.parameter(kI64);
  Value scale = b.parameter(v2);
  Value ops[] = {i0, acc0, limit, step, scale};
  std::vector<Value> r = b.make_region(OpKind::While, ops, while_attrs(2), {cond, body});
  g.outputs() = {r[0], r[1]};
  struct Trip {
    int64_t start, limit, step;
  };
  for (Trip tr : {Trip{0, 10, 3}, Trip{5, 5, 1}, Trip{7, 3, 1}, Trip{-2, 0, 1}}) {
    SCOPED_TRACE(std::to_string(tr.start) + " to " + std::to_string(tr.limit));
    std::vector<double> acc = {1, -1};
    int64_t i = tr.start;
    for (; i < tr.limit; i += tr.step) {
      acc[0] += static_cast<double>(i) * 0.5;
      acc[1] += static_cast<double>(i) * -2;
    }
    std::vector<Buffer> in = {
        encode_ints(DType::Int64, {tr.start}), encode_floats(DType::Float32, {1, -1}),
        encode_ints(DType::Int64, {tr.limit}), encode_ints(DType::Int64, {tr.step}),
        encode_floats(DType::Float32, {0.5, -2})};
    on_each_backend(g, in, [&](const std::vector<Buffer>& out) {
      EXPECT_EQ(ints(g, out, 0), std::vector<int64_t>{i});
      EXPECT_EQ(floats(g, out, 1), acc);
    });
  }
}

TEST(ControlFlowCpu, WhileStateWithABoolThatIsTheCondition) {
  // state (n, more, x): cond returns `more` itself; body: n - 1, n - 1 > 0, x * 3.
  const TensorType kBool{DType::Bool, {}};
  Region cond = region({kI64, kBool, kF32},
                       [](Builder&, std::vector<Value> p) { return std::vector<Value>{p[1]}; });
  Region body = region({kI64, kBool, kF32}, [](Builder& b, std::vector<Value> p) {
    Value n = b.binary(OpKind::Sub, p[0], b.constant(1, DType::Int64));
    return std::vector<Value>{n, b.binary(OpKind::Gt, n, b.constant(0, DType::Int64)),
                              b.binary(OpKind::Mul, p[2], b.constant(3, DType::Float32))};
  });
  Graph g;
  Builder b(g);
  Value n = b.parameter(kI64);
  Value more = b.parameter(kBool);
  Value x = b.parameter(kF32);
  Value ops[] = {n, more, x};
  std::vector<Value> r = b.make_region(OpKind::While, ops, while_attrs(3), {cond, body});
  g.outputs() = {r[0], r[1], r[2]};
  for (int64_t start : {3, 4, 1}) {
    for (int64_t go : {1, 0}) {
      SCOPED_TRACE(std::to_string(start) + (go ? " go" : " stop"));
      std::vector<Buffer> in = {encode_ints(DType::Int64, {start}), encode_ints(DType::Bool, {go}),
                                encode_floats(DType::Float32, {0.5})};
      const int64_t trips = go ? start : 0;
      on_each_backend(g, in, [&](const std::vector<Buffer>& out) {
        EXPECT_EQ(ints(g, out, 0), std::vector<int64_t>{start - trips});
        EXPECT_EQ(ints(g, out, 1), std::vector<int64_t>{0});
        EXPECT_EQ(floats(g, out, 2), std::vector<double>{0.5 * std::pow(3.0, trips)});
      });
    }
  }
}

TEST(ControlFlowCpu, CallReturningItsParameters) {
  // (a, b) -> (b, a + b, a, a): parameters returned directly, one of them twice.
  const TensorType v2{DType::Int64, {2}};
  Region body = region({v2, v2}, [](Builder& b, std::vector<Value> p) {
    return std::vector<Value>{p[1], b.binary(OpKind::Add, p[0], p[1]), p[0], p[0]};
  });
  Graph g;
  Builder b(g);
  Value x = b.parameter(v2);
  Value y = b.parameter(v2);
  Value ops[] = {x, y};
  std::vector<Value> r = b.make_region(OpKind::Call, ops, {}, {body});
  g.outputs() = {r[0], r[1], r[2], r[3], x};
  on_each_backend(g, {encode_ints(DType::Int64, {1, 2}), encode_ints(DType::Int64, {10, -5})},
                  [&](const std::vector<Buffer>& out) {
                    EXPECT_EQ(ints(g, out, 0), (std::vector<int64_t>{10, -5}));
                    EXPECT_EQ(ints(g, out, 1), (std::vector<int64_t>{11, -3}));
                    EXPECT_EQ(ints(g, out, 2), (std::vector<int64_t>{1, 2}));
                    EXPECT_EQ(ints(g, out, 3), (std::vector<int64_t>{1, 2}));
                    EXPECT_EQ(ints(g, out, 4), (std::vector<int64_t>{1, 2}));
                  });
}

TEST(ControlFlowCpu, RandomNumbersKeyedByTheIndexAreBitExact) {
  // key = {seed, 7 t + 3}; y = rand_uniform(key) f32[2,5] and f64[3]; carry: the last key.
  const TensorType key{DType::Int64, {2}};
  Region body = region({kI64, key, kI64}, [&](Builder& b, std::vector<Value> p) {
    Value off = b.binary(OpKind::Add, b.binary(OpKind::Mul, p[0], b.constant(7, DType::Int64)),
                         b.constant(3, DType::Int64));
    Value parts[] = {b.reshape(p[2], {1}), b.reshape(off, {1})};
    Value k = b.concat(parts, 0);
    return std::vector<Value>{k, b.random(OpKind::RandUniform, k, {DType::Float32, {2, 5}}),
                              b.random(OpKind::RandUniform, k, {DType::Float64, {3}})};
  });
  for (bool reverse : {false, true}) {
    Graph g;
    Builder b(g);
    Value k0 = b.parameter(key);
    Value seed = b.parameter(kI64);
    Value ops[] = {k0, seed};
    std::vector<Value> r = b.make_region(OpKind::Scan, ops, scan_attrs(1, 0, 6, reverse), {body});
    g.outputs() = {r[0], r[1], r[2]};
    expect_cpu_matches_ref(g, {encode_ints(DType::Int64, {0, 0}), encode_ints(DType::Int64, {42})});
  }
}

TEST(ControlFlowCpu, IndexSelectAndGatherInABodyMatchRef) {
  // rows = index_select(table, 0, idx) f32[2,3]; picked = gather(rows, 1, idx2) f32[2,1];
  // acc += rows summed over axis 0 (the reference fallbacks run inside the native loop).
  const TensorType table{DType::Float32, {5, 3}}, v3{DType::Float32, {3}};
  const TensorType idx{DType::Int64, {2}}, idx2{DType::Int64, {2, 1}};
  Region body = region({kI64, v3, idx, idx2, table}, [&](Builder& b, std::vector<Value> p) {
    Value rows = b.index_select(p[4], 0, p[2]);
    Value picked = b.gather(rows, 1, p[3]);
    Value acc = b.binary(OpKind::Add, p[1], b.reduce(OpKind::ReduceSum, rows, {0}, false));
    return std::vector<Value>{acc, rows, picked};
  });
  Graph g;
  Builder b(g);
  Value acc = b.parameter(v3);
  Value is = b.parameter({DType::Int64, {4, 2}});
  Value is2 = b.parameter({DType::Int64, {4, 2, 1}});
  Value tab = b.parameter(table);
  Value ops[] = {acc, is, is2, tab};
  std::vector<Value> r = b.make_region(OpKind::Scan, ops, scan_attrs(1, 2, 4), {body});
  g.outputs() = {r[0], r[1], r[2]};
  expect_cpu_matches_ref(g, {encode_floats(DType::Float32, {1, 2, 3}),
                             encode_ints(DType::Int64, {0, 4, 2, 2, 1, 3, 4, 0}),
                             encode_ints(DType::Int64, {0, 2, 1, 1, 2, 0, 0, 1}),
                             encode_floats(DType::Float32, quarters(15))});
}

// A scan of c' = 0.5 c + v over a 64 KiB carry: with native loops a run's pool traffic (its
// result and scratch blocks) does not grow with the length; a loop that allocated per step
// would take one block per step.
TEST(ControlFlowCpu, ScanDoesNotAllocatePerIteration) {
  const TensorType big{DType::Float32, {16384}};
  Region body = region({kI64, big, big}, [](Builder& b, std::vector<Value> p) {
    return std::vector<Value>{
        b.binary(OpKind::Add, b.binary(OpKind::Mul, p[1], b.constant(0.5, DType::Float32)), p[2])};
  });
  const std::string previous(runtime::current_backend().name());
  runtime::set_backend("cpu");
  std::vector<size_t> hits;
  for (int64_t n : {8, 256}) {
    Graph g;
    Builder b(g);
    Value c0 = b.parameter(big);
    Value v = b.parameter(big);
    Value ops[] = {c0, v};
    g.outputs() = {b.make_region(OpKind::Scan, ops, scan_attrs(1, 0, n), {body})[0]};
    std::vector<Buffer> in = {encode_floats(DType::Float32, std::vector<double>(16384, 0)),
                              encode_floats(DType::Float32, std::vector<double>(16384, 1))};
    for (int warm = 0; warm < 2; ++warm) runtime::run_graph(g, in);  // compiled, pool filled
    const size_t before = Buffer::pool_hits();
    std::vector<Buffer> out = runtime::run_graph(g, in);
    hits.push_back(Buffer::pool_hits() - before);
    float want = 0;
    for (int64_t t = 0; t < n; ++t) want = 0.5f * want + 1.0f;
    std::vector<double> got = decode_floats(DType::Float32, out[0]);
    EXPECT_EQ(got.front(), want);
    EXPECT_EQ(got.back(), want);
  }
  runtime::set_backend(previous);
  EXPECT_EQ(hits[0], hits[1]);
  EXPECT_LE(hits[1], 4u);
}

// Donation around a loop: a donated input that the loop reads (its init carry) never lends
// its memory to the loop's results; one last read by an earlier step does.
TEST(ControlFlowCpu, LoopResultsTakeOnlyDonatedInputsTheLoopDoesNotRead) {
  const TensorType v{DType::Float32, {4096}};
  Region body = region({kI64, v}, [](Builder& b, std::vector<Value> p) {
    Value c = b.binary(OpKind::Add, p[1], b.constant(1, DType::Float32));
    return std::vector<Value>{c};
  });
  for (bool read_by_loop : {true, false}) {
    SCOPED_TRACE(read_by_loop ? "init is the input" : "init is computed from the input");
    Graph g;
    Builder b(g);
    Value a = b.parameter(v);
    Value init = read_by_loop ? a : b.binary(OpKind::Mul, a, b.constant(2, DType::Float32));
    Value ops[] = {init};
    g.outputs() = {b.make_region(OpKind::Scan, ops, scan_attrs(1, 0, 3), {body})[0]};
    auto exe = backend::make_cpu_backend()->compile(g, backend::CompileOptions{});
    std::vector<Buffer> in = {encode_floats(DType::Float32, std::vector<double>(4096, 0.5))};
    const void* donated_memory = in[0].data();
    const uint8_t donate[] = {1};
    std::vector<Buffer> out = exe->run(in, donate);
    const double want = read_by_loop ? 3.5 : 4;
    EXPECT_EQ(decode_floats(DType::Float32, out[0]), std::vector<double>(4096, want));
    if (read_by_loop)
      EXPECT_NE(out[0].data(), donated_memory);
    else
      EXPECT_EQ(out[0].data(), donated_memory);  // its last reader ran before the loop
  }
}

}  // namespace
}  // namespace loom
