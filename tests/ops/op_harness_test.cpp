// The table-driven op harness (after ggml's test-backend-ops): for every row of op_rows.h and
// every dtype and case it checks
//   type rules   the result's dtype and shape against the closed form's,
//   IR           print, parse, print gives the same text, and the parsed graph's fingerprint
//                equals the fingerprint of the graph the tracer built (taken from the trace
//                context, not from text),
//   closed form  the values on the ref backend against the row's closed form in double,
//   ref vs cpu   the same program on cpu against ref (bitwise for exact rows),
//   VJP          for differentiable rows, backward() against float64 central differences,
//   wide         the row's wide cases (sizes across vector widths and thread splits, permuted,
//                strided and expanded operands, special values): ref against cpu only,
// and, once over the table, that every public op has a row and every ops.def op is reached.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "backend/diff_util.h"
#include "loom/ir/builder.h"
#include "loom/ir/op_kind.h"
#include "ops/op_rows.h"
#include "trace/context.h"

namespace loom::optest {
namespace {

// The graph the tracer built for `outs`: the trace context's cut, as sync would run it
// (test-only access through the private header; no text in between).
ir::Graph traced_graph(const std::vector<Tensor>& outs) {
  std::vector<detail::TensorImpl*> impls;
  for (const Tensor& t : outs) impls.push_back(t.impl());
  std::vector<uint32_t> slots;
  return detail::TraceContext::get().cut(impls, &slots);
}

void collect_ops(const ir::Graph& g, std::set<std::string>* ops) {
  for (const ir::Node& n : g.nodes()) {
    if (n.op != ir::OpKind::Parameter) ops->insert(std::string(ir::op_name(n.op)));
    for (const auto& r : n.regions) collect_ops(*r, ops);
  }
}

double tol_of(DType dt) {
  switch (dt) {
    case DType::Float64: return 1e-12;
    case DType::Float32: return 2e-6;
    case DType::Float16: return 2e-3;
    case DType::BFloat16: return 1.6e-2;
    default: return 0;
  }
}

bool same_value(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

// "" or the first mismatches of got against want.
std::string compare(const Row& row, const Expected& want, const std::vector<double>& got,
                    const char* what, double case_mult = 1) {
  std::ostringstream os;
  os.precision(17);
  if (got.size() != want.v.size()) {
    os << what << ": " << got.size() << " values, want " << want.v.size();
    return os.str();
  }
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double w = want.v[i], g = got[i];
    bool ok;
    if (row.exact || !is_floating(want.dtype) || std::isnan(w) || std::isinf(w)) {
      ok = same_value(w, g);
    } else {
      const double scale = want.scale.empty() ? std::fabs(w) : want.scale[i];
      ok = std::fabs(g - w) <= tol_of(want.dtype) * row.mult * case_mult * std::max(1.0, scale);
    }
    if (!ok && bad++ < 4) os << what << " element " << i << ": want " << w << ", got " << g << "\n";
  }
  return os.str();
}

struct Built {
  std::vector<HostArg> host;
  std::vector<Tensor> in;
};

std::vector<int64_t> coords_of(int64_t k, const Shape& s) {
  std::vector<int64_t> c(s.size());
  for (size_t d = s.size(); d-- > 0;) {
    c[d] = k % s[d];
    k /= s[d];
  }
  return c;
}
int64_t flat_of(const std::vector<int64_t>& c, const Shape& s) {
  int64_t k = 0;
  for (size_t d = 0; d < s.size(); ++d) k = k * s[d] + c[d];
  return k;
}

// The tensor of an input whose logical values (row-major over a.shape) are v, laid out as
// the Arg says: contiguous, permuted, strided or expanded (v's rows along dim 0 then repeat).
Tensor laid_out(const Arg& a, DType dt, std::vector<double>* v) {
  const Shape& s = a.shape;
  const int64_t n = s.numel();
  if (a.expand0) {
    const int64_t row = s.empty() || s[0] == 0 ? 0 : n / s[0];
    for (int64_t k = row; row > 0 && k < n; ++k) (*v)[k] = (*v)[k % row];
    std::vector<int64_t> bs(s.begin(), s.end());
    bs[0] = 1;
    return expand(
        difftest::from_values(dt, Shape(bs), std::vector<double>(v->begin(), v->begin() + row)), s);
  }
  if (!a.perm.empty()) {
    std::vector<int64_t> bs(s.size());
    for (size_t i = 0; i < s.size(); ++i) bs[a.perm[i]] = s[i];
    const Shape base(bs);
    std::vector<double> bv(n);
    for (int64_t k = 0; k < n; ++k) {
      const std::vector<int64_t> bc = coords_of(k, base);
      std::vector<int64_t> c(s.size());
      for (size_t i = 0; i < s.size(); ++i) c[i] = bc[a.perm[i]];
      bv[k] = (*v)[flat_of(c, s)];
    }
    return permute(difftest::from_values(dt, base, bv), a.perm);
  }
  if (a.step > 1) {
    const size_t d = a.step_dim < 0 ? s.size() + a.step_dim : a.step_dim;
    std::vector<int64_t> bs(s.begin(), s.end());
    bs[d] *= a.step;
    const Shape base(bs);
    // the elements the slice skips hold a value the inputs never draw
    std::vector<double> bv(base.numel(), difftest::representable(dt, 77));
    for (int64_t k = 0; k < base.numel(); ++k) {
      std::vector<int64_t> c = coords_of(k, base);
      if (c[d] % a.step != 0) continue;
      c[d] /= a.step;
      bv[k] = (*v)[flat_of(c, s)];
    }
    return slice(difftest::from_values(dt, base, bv), static_cast<int64_t>(d), 0, bs[d], a.step);
  }
  return difftest::from_values(dt, s, *v);
}

// The inputs of case `c` at dtype dt, seeded by the case's position.
Built build(const Case& c, DType dt, uint32_t seed) {
  Built b;
  for (const Arg& a : c.args) {
    const DType adt = a.dtype.value_or(dt);
    std::vector<double> v = a.values;
    if (v.empty()) v = difftest::host_values(adt, a.shape.numel(), seed, a.lo, a.hi);
    for (double& x : v) x = difftest::representable(adt, x);
    b.in.push_back(laid_out(a, adt, &v));
    b.host.push_back({adt, a.shape, std::move(v)});
    seed += 7;
  }
  return b;
}

bool runs_at(const Case& c, DType dt) {
  if (c.floats_only && !is_floating(dt)) return false;
  return c.only.empty() || std::find(c.only.begin(), c.only.end(), dt) != c.only.end();
}

// The cases of a row at dt: the ordinary ones, then the wide ones.
struct At {
  const Case* c;
  bool wide;
};
std::vector<At> cases_at(const Row& row, DType dt) {
  std::vector<At> cs;
  for (const Case& c : row.cases) {
    if (runs_at(c, dt)) cs.push_back({&c, false});
  }
  for (const Case& c : row.wide) {
    if (runs_at(c, dt)) cs.push_back({&c, true});
  }
  return cs;
}

std::string str_of(const std::set<std::string>& s) {
  std::string out;
  for (const std::string& x : s) out += (out.empty() ? "" : " ") + x;
  return out;
}

// Traces the row's cases at dt on `backend`, checks types and IR (on ref), runs, reads.
std::vector<std::vector<double>> run_cases(const Row& row, DType dt, const std::string& backend,
                                           std::set<std::string>* ops) {
  runtime::set_backend(backend);
  manual_seed(1234);
  std::vector<At> cs = cases_at(row, dt);
  std::vector<Built> built;
  for (size_t k = 0; k < cs.size(); ++k) built.push_back(build(*cs[k].c, dt, 100 + 31 * k));
  sync();
  std::vector<Tensor> ys;
  for (size_t k = 0; k < cs.size(); ++k) ys.push_back(row.op(built[k].in));
  std::vector<std::vector<double>> vals;
  for (size_t k = 0; k < cs.size(); ++k) {
    SCOPED_TRACE(cs[k].c->label);
    const Tensor& y = ys[k];
    if (backend == "ref") {
      const Expected want = row.closed(built[k].host);
      EXPECT_EQ(y.dtype(), want.dtype) << "type rule";
      EXPECT_EQ(y.shape(), want.shape) << "type rule";
      if (cs[k].wide) continue;  // layout ops in the graph, big inputs: no IR check
      const std::string text = pending_ir({y});
      const ir::Graph parsed = ir::parse(text);
      EXPECT_EQ(ir::to_text(parsed), text) << "IR round trip";
      const ir::Graph traced = traced_graph({y});
      EXPECT_EQ(ir::fingerprint(parsed), ir::fingerprint(traced))
          << "the parsed graph's fingerprint differs from the traced graph's:\n"
          << text;
      collect_ops(traced, ops);
    }
  }
  sync();
  for (const Tensor& y : ys) vals.push_back(y.to_vector<double>());
  return vals;
}

// sum(y * w) with fixed weights, so that every element of y matters.
Tensor weighted(const Tensor& y) {
  std::vector<double> w = difftest::host_values(DType::Float64, y.numel(), 99, -1.5, 1.5);
  return sum(to(y, DType::Float64) * difftest::from_values(DType::Float64, y.shape(), w));
}

// backward() against central differences of the same function, in float64, on ref.
void check_vjp(const Row& row, const Case& c) {
  SCOPED_TRACE("VJP " + c.label);
  runtime::set_backend("ref");
  Built b = build(c, DType::Float64, 500);
  std::vector<Tensor> leaves = b.in;
  std::vector<size_t> diff;
  for (size_t i = 0; i < c.args.size(); ++i) {
    if (c.args[i].diff && is_floating(b.host[i].dtype) && b.host[i].shape.numel() > 0) {
      leaves[i] = leaves[i].detach().requires_grad_();
      diff.push_back(i);
    }
  }
  ASSERT_FALSE(diff.empty()) << "no differentiable input";
  weighted(row.op(leaves)).backward();
  sync();
  auto eval = [&](size_t i, size_t e, double delta) {
    std::vector<double> v = b.host[i].v;
    v[e] += delta;
    std::vector<Tensor> in = b.in;
    in[i] = difftest::from_values(DType::Float64, b.host[i].shape, v);
    return weighted(row.op(in)).item<double>();
  };
  const double eps = 1e-6;
  for (size_t i : diff) {
    ASSERT_TRUE(leaves[i].grad().defined()) << "input " << i << " got no gradient";
    std::vector<double> g = leaves[i].grad().to_vector<double>();
    ASSERT_EQ(g.size(), b.host[i].v.size());
    for (size_t e = 0; e < g.size(); ++e) {
      const double fd = (eval(i, e, eps) - eval(i, e, -eps)) / (2 * eps);
      EXPECT_NEAR(g[e], fd, row.fd_tol * std::max(1.0, std::fabs(fd)))
          << "input " << i << " element " << e;
    }
  }
}

class OpHarness : public difftest::DiffTest {};

TEST_F(OpHarness, EveryRowEveryDTypeAndCase) {
  for (const Row& row : op_rows()) {
    SCOPED_TRACE(row.label());
    std::set<std::string> ops;
    for (DType dt : row.dtypes) {
      SCOPED_TRACE(std::string(name(dt)));
      std::vector<At> cs = cases_at(row, dt);
      std::vector<std::vector<double>> ref, cpu;
      try {
        ref = run_cases(row, dt, "ref", &ops);
        cpu = run_cases(row, dt, "cpu", &ops);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "threw: " << e.what();
        sync();
        continue;
      }
      runtime::set_backend("ref");
      for (size_t k = 0; k < cs.size(); ++k) {
        SCOPED_TRACE(cs[k].c->label + (cs[k].wide ? " (wide)" : ""));
        Built b = build(*cs[k].c, dt, 100 + 31 * k);
        Expected want = row.closed(b.host);
        if (row.property) {
          EXPECT_EQ(row.property(b.host, want, ref[k]), "") << "property on ref";
        } else if (!cs[k].wide) {
          EXPECT_EQ(compare(row, want, ref[k], "closed form vs ref"), "");
        }
        // cpu against ref: the ref values stand in for the closed form's (same tolerance).
        Expected as_ref = want;
        as_ref.v = ref[k];
        EXPECT_EQ(compare(row, as_ref, cpu[k], "cpu vs ref", cs[k].c->mult), "");
      }
      sync();
    }
    EXPECT_EQ(str_of(ops), str_of(std::set<std::string>(row.ir_ops.begin(), row.ir_ops.end())))
        << "the IR ops the traced graphs hold (declared in the row's ir_ops)";
    if (row.differentiable) {
      int fd_cases = 0;
      for (const Case& c : row.cases) {
        if (!c.fd) continue;
        ++fd_cases;
        check_vjp(row, c);
      }
      EXPECT_GT(fd_cases, 0) << "a differentiable row needs a case marked fd";
    }
  }
}

// The names of the public ops, read from the header itself so that a new op without a row
// fails here: every `Tensor name(` and `Tensor operator<op>(` declaration of ops.h, and the
// factories of tensor.h that build from a shape.
std::set<std::string> public_ops() {
  const std::string dir = LOOM_SOURCE_DIR;
  std::set<std::string> names;
  const std::regex decl(R"(^Tensor (\w+|operator\S+?)\()");
  for (const char* header : {"/include/loom/trace/ops.h", "/include/loom/trace/tensor.h",
                             "/include/loom/trace/attention.h"}) {
    std::ifstream f(dir + header);
    EXPECT_TRUE(f.good()) << dir + header;
    std::string line;
    std::smatch m;
    while (std::getline(f, line)) {
      if (std::regex_search(line, m, decl) && m[1] != "tensor") names.insert(m[1]);
    }
  }
  return names;
}

// The ops.def ops that the public ops of ops.h cannot reach: control flow, reached through
// loom/trace/control_flow.h and tested in tests/trace/control_flow_test.cpp and
// tests/backend/control_flow_backend_test.cpp. Parameter is every graph's input. `and` and
// `or`: no forward op emits them today (pow's VJP uses `and`; bool + bool is issue 13's).
// The collectives need a communicator: reached through loom/trace/collective.h and tested
// against closed forms and finite differences in tests/dist/. attention_grad is the VJP of
// attention: the attention rows' VJP checks run it. pure_callback runs host code:
// loom/trace/callback.h, tested in tests/trace/pure_callback_test.cpp. shard and the mesh
// collectives are mark_sharding's and the partitioner's: tests/dist/sharding_test.cpp.
const std::set<std::string> kNotReachedFromOpsH = {"call",
                                                   "scan",
                                                   "while",
                                                   "parameter",
                                                   "and",
                                                   "or",
                                                   "all_reduce_sum",
                                                   "all_reduce_max",
                                                   "all_reduce_min",
                                                   "all_gather",
                                                   "reduce_scatter_sum",
                                                   "dist_broadcast",
                                                   "grad_all_reduce",
                                                   "attention_grad",
                                                   "pure_callback",
                                                   "shard",
                                                   "mesh_all_reduce",
                                                   "mesh_all_gather",
                                                   "mesh_slice",
                                                   "mesh_reduce_scatter",
                                                   "mesh_all_to_all"};

TEST_F(OpHarness, RegistryEveryPublicOpHasARowAndEveryIrOpIsReached) {
  std::set<std::string> rows;
  std::map<std::string, std::set<std::string>> reached;  // ops.def op -> rows
  for (const Row& r : op_rows()) {
    rows.insert(r.name);
    for (const std::string& op : r.ir_ops) reached[op].insert(r.label());
  }
  const std::set<std::string> pub = public_ops();
  EXPECT_GT(pub.size(), 50u) << "the declarations of ops.h were not found";
  for (const std::string& op : pub) EXPECT_TRUE(rows.count(op)) << "no harness row for " << op;
  for (const std::string& r : rows) {
    EXPECT_TRUE(pub.count(r) || r == "Tensor::operator[]") << "a row of no public op: " << r;
  }
  for (const ir::OpInfo& info : ir::kOpInfo) {
    const std::string op(info.name);
    if (kNotReachedFromOpsH.count(op)) continue;
    EXPECT_TRUE(reached.count(op)) << "ops.def op '" << op << "' is reached by no harness row";
  }
  for (const auto& [op, by] : reached) {
    ir::OpKind kind;
    EXPECT_TRUE(ir::parse_op(op, &kind)) << "a row names an op that ops.def lacks: " << op;
  }
  if (std::getenv("LOOM_HARNESS_REPORT")) {  // the map of the report: op -> rows
    for (const auto& [op, by] : reached) std::printf("%s: %s\n", op.c_str(), str_of(by).c_str());
  }
}

// The fingerprint the harness compares can fail: the parsed graph of another op, or of the
// same op with another attribute, has another fingerprint than the traced one.
TEST_F(OpHarness, FingerprintOfTheTracedGraphTracksOpsAndAttributes) {
  Tensor x = difftest::input(DType::Float32, {2, 3}, 1);
  Tensor i = difftest::input(DType::Int64, {2, 3}, 2, 0, 1);
  sync();
  auto fp = [](const Tensor& t) { return ir::fingerprint(traced_graph({t})); };
  auto fp_text = [](const std::string& text) { return ir::fingerprint(ir::parse(text)); };
  const std::vector<std::pair<Tensor, Tensor>> pairs = {
      {exp(x), log(x)},
      {sum(x, {0}), sum(x, {1})},
      {sum(x, {1}, false), sum(x, {1}, true)},
      {slice(x, 1, 0, 3, 1), slice(x, 1, 0, 3, 2)},
      {to(x, DType::Float64), to(x, DType::BFloat16)},
      {permute(x, {1, 0}), reshape(x, {3, 2})},
      {argmax(x, 0), argmax(x, 1)},
      {gather(x, 0, i), gather(x, 1, i)},
      {x + x, x * x},
  };
  for (const auto& [a, b] : pairs) {
    const std::string ta = pending_ir({a}), tb = pending_ir({b});
    SCOPED_TRACE(ta + "\nvs\n" + tb);
    EXPECT_NE(fp(a), fp(b));
    EXPECT_NE(fp_text(tb), fp(a)) << "another graph's text matches the traced graph";
    EXPECT_EQ(fp_text(ta), fp(a));
  }
  // An edit of one token of the text: the op, then an attribute (a square input keeps the
  // edited text well typed).
  Tensor sq = difftest::input(DType::Float32, {3, 3}, 3);
  sync();
  const std::string text = pending_ir({sum(exp(sq), {1})});
  const auto traced = fp(sum(exp(sq), {1}));
  std::string op_edit = std::regex_replace(text, std::regex("exp\\("), "log(");
  std::string attr_edit = std::regex_replace(text, std::regex("axes=\\[1\\]"), "axes=[0]");
  ASSERT_NE(op_edit, text);
  ASSERT_NE(attr_edit, text);
  EXPECT_EQ(fp_text(text), traced);
  EXPECT_NE(fp_text(op_edit), traced);
  EXPECT_NE(fp_text(attr_edit), traced);
  sync();
}

}  // namespace
}  // namespace loom::optest
