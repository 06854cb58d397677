// Type rules of the control-flow ops (call, scan, while): a node's regions must take exactly
// the types its operands supply, and loop bodies must give back the types they carry, so that
// backends can run a region any number of times without re-checking anything.
#include "ir/ops/infer_impl.h"

namespace loom::ir {

namespace {

using Regions = std::span<const std::shared_ptr<const Graph>>;
using loom::detail::str_cat;

std::vector<TensorType> param_types(const Graph& r) {
  std::vector<TensorType> ts;
  for (NodeId p : r.params()) ts.push_back(r.node(p).type);
  return ts;
}

std::vector<TensorType> output_types(const char* op, const char* region, const Graph& r) {
  std::vector<TensorType> ts;
  ts.reserve(r.outputs().size());
  for (Value v : r.outputs()) {
    LOOM_CHECK(v.node < r.size() && v.index < r.node(v.node).num_results(), "[", op, "] ", region,
               " output %", v.node, "#", v.index, " does not exist");
    ts.push_back(r.type(v));
  }
  return ts;
}

std::string type_list(std::span<const TensorType> ts) {
  std::string s = "(";
  for (size_t k = 0; k < ts.size(); ++k) s += (k ? ", " : "") + ts[k].str();
  return s + ")";
}

const Graph& region(const char* op, Regions regions, size_t k, size_t count) {
  LOOM_CHECK(regions.size() == count, "[", op, "] expected ", count, " region(s), got ",
             regions.size());
  LOOM_CHECK(regions[k] != nullptr, "[", op, "] region ", k, " is null");
  return *regions[k];
}

// The region's parameters must be exactly `want`; `what(k)` names parameter k for messages.
template <class What>
void check_params(const char* op, const char* name, const Graph& r,
                  const std::vector<TensorType>& want, What&& what) {
  // The common case compares in place; the lists are built only for the message.
  bool same = r.params().size() == want.size();
  for (size_t k = 0; same && k < want.size(); ++k) same = r.node(r.params()[k]).type == want[k];
  if (same) return;
  std::vector<TensorType> got = param_types(r);
  LOOM_CHECK(got.size() == want.size(), "[", op, "] ", name, " takes ", got.size(),
             " parameter(s) ", type_list(got), " but is given ", want.size(), " ", type_list(want));
  for (size_t k = 0; k < want.size(); ++k) {
    LOOM_CHECK(got[k] == want[k], "[", op, "] ", name, " parameter ", k, " (", what(k),
               ") has type ", got[k], " but is given ", want[k]);
  }
}

std::vector<TensorType> operand_type_list(const Graph& g, std::span<const Value> xs) {
  std::vector<TensorType> ts;
  ts.reserve(xs.size());
  for (Value v : xs) ts.push_back(g.type(v));
  return ts;
}

std::vector<TensorType> infer_call(const Graph& g, std::span<const Value> xs, const Attrs& a,
                                   Regions regions) {
  const bool custom = regions.size() == 2;
  const Graph& body = region("call", regions, 0, custom ? 2 : 1);
  // The common case (every call of a cached assume_pure function) compares in place; the
  // lists are built only for the message.
  bool same = body.params().size() == xs.size();
  for (size_t k = 0; same && k < xs.size(); ++k)
    same = body.node(body.params()[k]).type == g.type(xs[k]);
  if (!same)
    check_params("call", "body", body, operand_type_list(g, xs),
                 [](size_t k) { return str_cat("operand ", k); });
  std::vector<TensorType> outs = output_types("call", "body", body);
  LOOM_CHECK(!outs.empty(), "[call] body has no outputs; a call returns at least one value");
  if (!custom) {
    LOOM_CHECK(a.ints.empty(), "[call] counts are given only with a vjp region");
    return outs;
  }
  // The custom VJP: (residuals, output adjoints) -> one adjoint per argument.
  LOOM_CHECK(a.ints.size() == 3,
             "[call] with a vjp region needs counts = [#outputs, #args, #extra]");
  const int64_t n_out = a.ints[0], n_args = a.ints[1], n_extra = a.ints[2];
  const int64_t num = static_cast<int64_t>(xs.size());
  LOOM_CHECK(n_out >= 1 && n_out <= static_cast<int64_t>(outs.size()) && n_args >= 0 &&
                 n_extra >= 0 && n_args <= num && n_extra <= num - n_args,
             "[call] counts [", n_out, ",", n_args, ",", n_extra, "] do not fit ", outs.size(),
             " results and ", xs.size(), " operands");
  const Graph& vjp = region("call", regions, 1, 2);
  std::vector<TensorType> want(outs.begin() + n_out, outs.end());
  want.insert(want.end(), outs.begin(), outs.begin() + n_out);
  const std::vector<TensorType> ops = operand_type_list(g, xs);
  want.insert(want.end(), ops.end() - n_extra, ops.end());
  const size_t res = outs.size() - static_cast<size_t>(n_out);
  check_params("call", "vjp", vjp, want, [res, n_out](size_t k) {
    return k < res                                ? str_cat("residual ", k)
           : k < res + static_cast<size_t>(n_out) ? str_cat("adjoint of output ", k - res)
                                                  : str_cat("extra operand ", k - res - n_out);
  });
  std::vector<TensorType> grads = output_types("call", "vjp", vjp);
  std::vector<TensorType> args = operand_type_list(g, xs.first(static_cast<size_t>(n_args)));
  LOOM_CHECK(grads == args, "[call] the vjp region returns ", grads.size(),
             " value(s) that must be one adjoint per argument, of the arguments' types");
  return outs;
}

std::vector<TensorType> infer_scan(const Graph& g, std::span<const Value> xs, const Attrs& a,
                                   Regions regions) {
  const Graph& body = region("scan", regions, 0, 1);
  LOOM_CHECK(a.ints.size() == 2, "[scan] counts must be [#carries, #xs], got ", a.ints.size(),
             " entries");
  const int64_t c = a.ints[0], x = a.ints[1], length = a.i;
  const int64_t num = static_cast<int64_t>(xs.size());
  LOOM_CHECK(c >= 0 && x >= 0 && c <= num && x <= num - c, "[scan] counts [", c, ",", x,
             "] do not fit ", xs.size(), " operands");
  LOOM_CHECK_T(ShapeError, length >= 0, "[scan] length must be >= 0, got ", length);
  std::vector<TensorType> ops = operand_type_list(g, xs);
  std::vector<TensorType> want;
  want.reserve(ops.size() + 1);
  want.push_back(TensorType{DType::Int64, Shape{}});
  for (int64_t k = 0; k < c; ++k) want.push_back(ops[k]);
  for (int64_t k = c; k < c + x; ++k) {
    const TensorType& t = ops[k];
    LOOM_CHECK_T(ShapeError, t.shape.rank() >= 1 && t.shape[0] == length, "[scan] xs ", k - c,
                 " must have leading dim length = ", length, ", got ", t);
    want.push_back({t.dtype, Shape(t.shape.begin() + 1, t.shape.end())});
  }
  for (size_t k = c + x; k < ops.size(); ++k) want.push_back(ops[k]);
  check_params("scan", "body", body, want, [&](size_t k) -> std::string {
    if (k == 0) return "the iteration index";
    if (static_cast<int64_t>(k) <= c) return str_cat("carry ", k - 1);
    if (static_cast<int64_t>(k) <= c + x) return str_cat("a slice of xs ", k - 1 - c);
    return str_cat("captured operand ", k - 1 - c - x);
  });
  std::vector<TensorType> outs = output_types("scan", "body", body);
  LOOM_CHECK(static_cast<int64_t>(outs.size()) >= c, "[scan] body returns ", outs.size(),
             " value(s) but there are ", c, " carries");
  std::vector<TensorType> results;
  results.reserve(outs.size());
  for (int64_t k = 0; k < c; ++k) {
    LOOM_CHECK(outs[k] == ops[k], "[scan] carry ", k, " changed type in the body: expected ",
               ops[k], ", got ", outs[k]);
    results.push_back(ops[k]);
  }
  for (size_t k = c; k < outs.size(); ++k) {
    Shape s = outs[k].shape;
    s.insert(0, length);
    check_shape("scan", s);
    results.push_back({outs[k].dtype, s});
  }
  LOOM_CHECK(!results.empty(), "[scan] has no results: no carries and the body returns no ys");
  return results;
}

std::vector<TensorType> infer_while(const Graph& g, std::span<const Value> xs, const Attrs& a,
                                    Regions regions) {
  const Graph& cond = region("while", regions, 0, 2);
  const Graph& body = region("while", regions, 1, 2);
  LOOM_CHECK(a.ints.size() == 1, "[while] counts must be [#carried], got ", a.ints.size(),
             " entries");
  const int64_t n = a.ints[0];
  LOOM_CHECK(n >= 1 && n <= static_cast<int64_t>(xs.size()), "[while] #carried = ", n,
             " must be in [1, ", xs.size(), "] (the operand count)");
  std::vector<TensorType> ops = operand_type_list(g, xs);
  auto what = [&](size_t k) {
    return static_cast<int64_t>(k) < n ? str_cat("carried ", k) : str_cat("captured ", k - n);
  };
  check_params("while", "cond", cond, ops, what);
  check_params("while", "body", body, ops, what);
  std::vector<TensorType> c = output_types("while", "cond", cond);
  const TensorType scalar_bool{DType::Bool, Shape{}};
  LOOM_CHECK(c.size() == 1 && c[0] == scalar_bool, "[while] cond must return one bool[], got ",
             type_list(c));
  std::vector<TensorType> outs = output_types("while", "body", body);
  LOOM_CHECK(static_cast<int64_t>(outs.size()) == n, "[while] body returns ", outs.size(),
             " value(s) but ", n, " are carried");
  for (int64_t k = 0; k < n; ++k) {
    LOOM_CHECK(outs[k] == ops[k], "[while] carried ", k, " changed type in the body: expected ",
               ops[k], ", got ", outs[k]);
  }
  return std::vector<TensorType>(ops.begin(), ops.begin() + n);
}

}  // namespace

std::vector<TensorType> infer_region_types(const Graph& g, OpKind op,
                                           std::span<const Value> operands, const Attrs& attrs,
                                           Regions regions) {
  const char* name = op_name(op).data();
  LOOM_CHECK(several_results(op), "[", name, "] has one result; use infer_type");
  for (Value v : operands) {
    LOOM_CHECK(v.node < g.size() && v.index < g.node(v.node).num_results(), "[", name,
               "] operand %", v.node, "#", v.index, " does not exist");
  }
  if (has_trait(op, kMultiResult)) {
    LOOM_CHECK(regions.empty(), "[", name, "] takes no regions");
    if (op == OpKind::PureCallback) return detail::infer_pure_callback(g, operands, attrs);
    return detail::infer_attention(g, op, operands, attrs);
  }
  switch (op) {
    case OpKind::Call: return infer_call(g, operands, attrs, regions);
    case OpKind::Scan: return infer_scan(g, operands, attrs, regions);
    case OpKind::While: return infer_while(g, operands, attrs, regions);
    default: break;
  }
  throw Error(str_cat("[", name, "] has no type rule"));
}

}  // namespace loom::ir
