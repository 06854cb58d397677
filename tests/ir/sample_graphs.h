// Sample graphs for the IR tests (text, fingerprint, parser fuzz), built with the Builder so
// that they are well-typed by construction. Together they use every op in ops.def.
#pragma once

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "ir/region_util.h"
#include "loom/core/host_callback.h"
#include "loom/ir/builder.h"

namespace loom::ir::testing {

// Elementwise ops of every family, on float, int and bool operands, with broadcasting.
inline Graph elementwise_graph() {
  Graph g;
  Builder b(g);
  Value x = b.parameter({float32, {2, 3}});
  Value y = b.parameter({float32, {2, 3}});
  Value r = b.parameter({float32, {3}});
  Value n = b.parameter({int32, {2, 3}});
  std::vector<Value> outs;
  for (OpKind op : {OpKind::Neg, OpKind::Abs, OpKind::Exp, OpKind::Log, OpKind::Sqrt, OpKind::Tanh,
                    OpKind::Sin, OpKind::Cos, OpKind::Erf})
    outs.push_back(b.unary(op, x));
  for (OpKind op : {OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Div, OpKind::Pow,
                    OpKind::Maximum, OpKind::Minimum, OpKind::Rem})
    outs.push_back(b.binary(op, x, r));
  outs.push_back(b.binary(OpKind::Div, n, b.convert(x, int32)));
  outs.push_back(b.binary(OpKind::Rem, n, b.convert(x, int32)));
  Value lt = b.binary(OpKind::Lt, x, y);
  for (OpKind op : {OpKind::Eq, OpKind::Ne, OpKind::Le, OpKind::Gt, OpKind::Ge})
    outs.push_back(b.binary(op, x, r));
  Value ge = b.binary(OpKind::Ge, n, b.constant(0, int32));
  outs.push_back(b.binary(OpKind::And, lt, ge));
  outs.push_back(b.binary(OpKind::Or, b.unary(OpKind::Not, lt), ge));
  outs.push_back(b.where(lt, x, b.constant(-0.5, float32)));
  outs.push_back(b.convert(x, float64));
  outs.push_back(b.convert(n, bool_));
  g.outputs() = outs;
  return g;
}

// Sources, reductions, matmul, layout, indexing and random ops, with 16-bit floats.
inline Graph structural_graph() {
  Graph g;
  Builder b(g);
  Value c = b.constant(2.5, float32);  // a node before the parameters
  Value x = b.parameter({float32, {2, 3}});
  Value h = b.parameter({bfloat16, {4}});
  Value k = b.parameter({int64, {2}});
  Value i = b.parameter({int64, {2, 2}});
  Value half = b.parameter({float16, {3, 1}});
  std::vector<Value> outs;
  outs.push_back(b.binary(OpKind::Mul, x, c));
  outs.push_back(b.iota({int32, {2, 5}}, 1));
  outs.push_back(b.reduce(OpKind::ReduceSum, x, {1}, false));
  outs.push_back(b.reduce(OpKind::ReduceMax, x, {0, 1}, true));
  outs.push_back(b.reduce(OpKind::ReduceMin, x, {}, false));
  outs.push_back(b.argmax(x, 1, true));
  outs.push_back(b.argsort(x, 1, true));
  Value xt = b.permute(x, {1, 0});
  outs.push_back(b.matmul(x, xt));
  outs.push_back(b.reshape(x, {3, 2}));
  outs.push_back(b.expand(half, {2, 3, 4}));
  outs.push_back(b.slice(x, 1, 0, 3, 2));
  Value parts[] = {x, x, b.slice(x, 0, 1, 2)};
  outs.push_back(b.concat(parts, 0));
  outs.push_back(b.gather(x, 1, i));
  outs.push_back(b.index_select(x, 1, b.convert(k, int32)));
  outs.push_back(b.index_add(x, 1, k, b.slice(x, 1, 0, 2)));
  outs.push_back(b.random(OpKind::RandUniform, k, {float32, {2, 2}}));
  outs.push_back(b.random(OpKind::RandNormal, k, {float64, {3}}));
  outs.push_back(b.unary(OpKind::Exp, h));
  g.outputs() = outs;
  return g;
}

// Constants whose printing is delicate: infinities, NaN, signed zero, subnormals, extremes,
// integers beyond 2^53, and a dead node.
inline Graph constants_graph() {
  Graph g;
  Builder b(g);
  std::vector<Value> outs;
  for (double v :
       {0.1, -0.0, 1e308, 4.9406564584124654e-324, -1e-300, 1.0 / 3,
        std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
        std::numeric_limits<double>::quiet_NaN(), -std::numeric_limits<double>::quiet_NaN()})
    outs.push_back(b.constant(v, float64));
  outs.push_back(b.constant(9007199254740993.0, int64));  // rounds to 2^53 in the double
  outs.push_back(b.constant(-2147483648.0, int32));
  outs.push_back(b.constant(1, bool_));
  outs.push_back(b.constant(65504, float16));
  b.constant(7, float32);  // dead
  Value p = b.parameter({float32, {}});
  outs.push_back(b.binary(OpKind::Add, p, p));
  g.outputs() = outs;
  return g;
}

// A graph with a parameter nobody uses, no-op-free outputs, and a repeated output.
inline Graph small_graph() {
  Graph g;
  Builder b(g);
  Value x = b.parameter({float32, {4}});
  b.parameter({int64, {}});
  Value e = b.unary(OpKind::Exp, x);
  g.outputs() = {e, x, e};
  return g;
}

// Control flow: a scan whose body holds another scan, a while inside a call (with a captured
// operand), and a reversed scan without carries.
inline Graph control_flow_graph() {
  const TensorType i64{int64, {}}, f32{float32, {}}, row{float32, {3}};
  auto inner = region({i64, f32, f32}, [](Builder& b, std::vector<Value> p) {
    return std::vector<Value>{b.binary(OpKind::Add, p[1], p[2]), b.binary(OpKind::Mul, p[1], p[2])};
  });
  auto outer = region({i64, f32, row}, [&](Builder& b, std::vector<Value> p) {
    Attrs a;
    a.ints = {1, 1};
    a.i = 3;
    Value xs[] = {p[1], p[2]};
    return b.make_region(OpKind::Scan, xs, a, {inner});
  });
  auto cond = region({i64, row, row}, [](Builder& b, std::vector<Value> p) {
    return std::vector<Value>{b.binary(OpKind::Gt, p[0], b.constant(0, int64))};
  });
  auto body = region({i64, row, row}, [](Builder& b, std::vector<Value> p) {
    return std::vector<Value>{b.binary(OpKind::Sub, p[0], b.constant(1, int64)),
                              b.binary(OpKind::Add, p[1], p[2])};
  });
  auto call_body = region({i64, row, row}, [&](Builder& b, std::vector<Value> p) {
    Attrs a;
    a.ints = {2};
    return std::vector<Value>{b.make_region(OpKind::While, p, a, {cond, body})[1]};
  });
  auto rev_body = region({i64, row}, [](Builder& b, std::vector<Value> p) {
    Value i = b.expand(b.convert(p[0], float32), {3});
    return std::vector<Value>{b.binary(OpKind::Add, i, p[1])};
  });
  Graph g;
  Builder b(g);
  Value s = b.parameter(f32);
  Value x = b.parameter({float32, {4, 3}});
  Value k = b.parameter(i64);
  Attrs a;
  a.ints = {1, 1};
  a.i = 4;
  Value scan_ops[] = {s, x};
  std::vector<Value> sc = b.make_region(OpKind::Scan, scan_ops, a, {outer});
  Value call_ops[] = {k, b.reshape(b.slice(x, 0, 0, 1), {3}), b.reshape(b.slice(x, 0, 1, 2), {3})};
  Value c = b.make_region(OpKind::Call, call_ops, {}, {call_body})[0];
  Attrs ra;
  ra.ints = {0, 1};
  ra.i = 4;
  ra.flag = true;
  Value rv = b.make_region(OpKind::Scan, std::span<const Value>(&x, 1), ra, {rev_body})[0];
  // A custom VJP (custom_vjp): y = x * x with residual x, and a backward of 3 g x that also
  // reads the extra operand s.
  auto fwd = region({row, f32}, [](Builder& b, std::vector<Value> p) {
    return std::vector<Value>{b.binary(OpKind::Mul, p[0], p[0]), p[0]};
  });
  auto bwd = region({row, row, f32}, [](Builder& b, std::vector<Value> p) {
    Value three = b.binary(OpKind::Add, p[2], b.constant(3, float32));
    return std::vector<Value>{b.binary(OpKind::Mul, b.binary(OpKind::Mul, p[1], p[0]), three)};
  });
  Attrs ca;
  ca.ints = {1, 1, 1};
  Value custom_ops[] = {call_ops[1], s};
  Value cv = b.make_region(OpKind::Call, custom_ops, ca, {fwd, bwd})[0];
  g.outputs() = {sc[1], sc[0], c, rv, cv};
  return g;
}

// Every collective (world 2): built and printed here, run only with a communicator
// (tests/dist/).
inline Graph collective_graph() {
  Graph g;
  Builder b(g);
  Value x = b.parameter({float32, {4, 6}});
  Value n = b.parameter({int64, {3}});
  auto one = [&](OpKind op, Value v, std::vector<int64_t> ints, bool flag) {
    Attrs a;
    a.i = 2;
    a.ints.assign(ints.begin(), ints.end());
    a.flag = flag;
    return b.make(op, std::span<const Value>(&v, 1), a);
  };
  Value s = one(OpKind::AllReduceSum, x, {}, false);
  Value r = one(OpKind::AllReduceSum, x, {}, true);
  Value mx = one(OpKind::AllReduceMax, x, {}, false);
  Value mn = one(OpKind::AllReduceMin, x, {}, false);
  Value mni = one(OpKind::AllReduceMin, n, {}, false);
  Value ag = one(OpKind::AllGather, x, {1}, false);
  Value rs = one(OpKind::ReduceScatterSum, ag, {0}, false);
  Value bc = one(OpKind::DistBroadcast, x, {1}, false);
  Value ga = one(OpKind::GradAllReduce, x, {}, false);
  // mark_sharding's annotation (mesh [2, 1]: dim 0 over axis 0) and the partitioner's ops.
  Attrs sh;
  sh.ints = {2, 2, 1, 1, 0};
  Value sd = b.make(OpKind::Shard, std::span<const Value>(&x, 1), sh);
  auto mesh = [&](OpKind op, Value v, int64_t dim) {
    Attrs a;
    a.ints = {dim, 2, 1};
    a.i = 1;
    return b.make(op, std::span<const Value>(&v, 1), a);
  };
  Value ms = mesh(OpKind::MeshSlice, x, 0);
  Value mg = mesh(OpKind::MeshAllGather, ms, 0);
  Value mr = mesh(OpKind::MeshAllReduce, mg, 0);
  Value mrs = mesh(OpKind::MeshReduceScatter, mr, 0);
  Attrs aa;
  aa.ints = {1, 0, 2, 1};  // x's dim 1 split over axis 0 and its dim 0 gathered
  aa.i = 1;
  Value ma = b.make(OpKind::MeshAllToAll, std::span<const Value>(&ag, 1), aa);
  g.outputs() = {s, r, mx, mn, mni, rs, bc, ga, sd, mrs, ma};
  return g;
}

// The fused attention ops (several results, no regions): grouped heads with a broadcast
// additive mask, causal, and the gradient node.
inline Graph attention_graph() {
  Graph g;
  Builder b(g);
  Value q = b.parameter({float32, {2, 4, 5, 3}});
  Value k = b.parameter({float32, {2, 2, 7, 3}});
  Value v = b.parameter({float32, {2, 2, 7, 6}});
  Value m = b.parameter({float32, {5, 7}});
  Value d = b.parameter({float32, {2, 4, 5, 6}});
  Attrs a;
  a.i = 2;
  a.f = 0.5;
  Value masked[] = {q, k, v, m};
  std::vector<Value> o = b.make_region(OpKind::Attention, masked, a, {});
  Attrs c = a;
  c.flag = true;
  Value plain[] = {q, k, v};
  std::vector<Value> oc = b.make_region(OpKind::Attention, plain, c, {});
  Value delta = b.reduce(OpKind::ReduceSum, b.binary(OpKind::Mul, d, o[0]), {3}, false);
  Value grad_ops[] = {q, k, v, o[1], delta, d, m};
  std::vector<Value> gr = b.make_region(OpKind::AttentionGrad, grad_ops, a, {});
  g.outputs() = {o[0], o[1], oc[0], gr[0], gr[1], gr[2]};
  return g;
}

// A host callback (several results of declared types, no regions): its first operand back
// and a zero count. The callback is registered once per process.
inline Graph callback_graph() {
  static const int64_t id =
      loom::detail::register_host_callback("sample_callback", [](const std::vector<HostArray>& a) {
        return std::vector<HostArray>{a[0], HostArray::zeros({int64, {}})};
      });
  Graph g;
  Builder b(g);
  Value x = b.parameter({float32, {2, 3}});
  Value n = b.parameter({int64, {}});
  Attrs a;
  a.i = id;
  a.ints = {static_cast<int64_t>(float32), 2, 2, 3, static_cast<int64_t>(int64), 0};
  Value args[] = {b.unary(OpKind::Exp, x), n};
  std::vector<Value> r = b.make_region(OpKind::PureCallback, args, a, {});
  g.outputs() = {r[0], r[1]};
  return g;
}

inline std::vector<Graph> sample_graphs() {
  std::vector<Graph> gs;
  gs.push_back(elementwise_graph());
  gs.push_back(structural_graph());
  gs.push_back(constants_graph());
  gs.push_back(small_graph());
  gs.push_back(control_flow_graph());
  gs.push_back(collective_graph());
  gs.push_back(attention_graph());
  gs.push_back(callback_graph());
  gs.push_back(Graph());  // no parameters, no outputs
  return gs;
}

}  // namespace loom::ir::testing
