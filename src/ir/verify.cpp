// The graph verifier: the invariants every pass must keep, checked before and after passes.
// Types are re-inferred with the builder's rules, so a pass cannot silently change a type.
#include <cmath>

#include "loom/core/error.h"
#include "loom/ir/builder.h"
#include "loom/ir/graph.h"

namespace loom::ir {

namespace {

[[noreturn]] void bad(NodeId id, const Node& n, const std::string& what) {
  throw Error(detail::str_cat("[verify] node %", id, " (", op_name(n.op), "): ", what));
}

void verify_operands(const Graph& g, NodeId id, const Node& n) {
  const OpInfo& in = info(n.op);
  if (in.arity >= 0 && n.operands.size() != static_cast<size_t>(in.arity))
    bad(id, n, detail::str_cat("expected ", in.arity, " operands, got ", n.operands.size()));
  // Calls and host callbacks may take none.
  if (in.arity < 0 && n.operands.empty() && !has_trait(n.op, kRegion) &&
      n.op != OpKind::PureCallback)
    bad(id, n, "expected at least one operand, got none");
  for (Value v : n.operands) {
    if (v.node >= id) bad(id, n, detail::str_cat("operand %", v.node, " is not an earlier node"));
    if (v.index >= g.node(v.node).num_results())
      bad(id, n,
          detail::str_cat("operand %", v.node, "#", v.index, " does not exist; %", v.node, " has ",
                          g.node(v.node).num_results(), " result(s)"));
  }
}

// Attribute fields that ops.def does not name for the op cannot be printed, so they must
// keep their defaults.
void verify_attrs(NodeId id, const Node& n) {
  const OpInfo& in = info(n.op);
  const Attrs& a = n.attrs;
  const char* field = nullptr;
  if (in.ints_name.empty() && !a.ints.empty()) field = "ints";
  if (in.i_name.empty() && a.i != 0) field = "i";
  if (in.flag_name.empty() && a.flag) field = "flag";
  if (in.f_name.empty() && (a.f != 0 || std::signbit(a.f))) field = "f";
  if (field)
    bad(id, n,
        detail::str_cat("sets the attribute field '", field, "', which the op does not use"));
}

std::string types_of(const std::vector<TensorType>& ts) {
  std::string s;
  for (size_t k = 0; k < ts.size(); ++k) s += (k ? ", " : "") + ts[k].str();
  return s;
}

// Nodes of several results (control flow, attention): every region verifies on its own, and the
// node's operands, regions and recorded result types agree with the op's type rule.
void verify_region_node(const Graph& g, NodeId id, const Node& n) {
  for (size_t k = 0; k < n.regions.size(); ++k) {
    if (!n.regions[k]) bad(id, n, detail::str_cat("region ", k, " is null"));
    try {
      verify(*n.regions[k]);
    } catch (const Error& e) {
      bad(id, n, detail::str_cat("in region ", k, ": ", e.what()));
    }
  }
  std::vector<TensorType> want;
  try {
    want = infer_region_types(g, n.op, n.operands, n.attrs, n.regions);
  } catch (const Error& e) {
    bad(id, n, e.what());
  }
  std::vector<TensorType> got{n.type};
  got.insert(got.end(), n.more_types.begin(), n.more_types.end());
  if (got != want)
    bad(id, n,
        detail::str_cat("recorded types ", types_of(got), " differ from the inferred ",
                        types_of(want)));
}

void verify_type(const Graph& g, NodeId id, const Node& n) {
  if (several_results(n.op)) return verify_region_node(g, id, n);
  if (!n.more_types.empty()) bad(id, n, "has several results but its op has one");
  if (!n.regions.empty()) bad(id, n, "owns regions but is not a control-flow op");
  TensorType t;
  try {
    t = infer_type(g, n.op, n.operands, n.attrs, &n.type);
  } catch (const Error& e) {
    bad(id, n, e.what());
  }
  if (!(t == n.type))
    bad(id, n, detail::str_cat("recorded type ", n.type, " differs from the inferred ", t));
}

}  // namespace

void verify(const Graph& g) {
  const auto& params = g.params();
  for (size_t k = 0; k < params.size(); ++k) {
    NodeId p = params[k];
    LOOM_CHECK(p < g.size() && g.node(p).op == OpKind::Parameter, "[verify] params()[", k, "] = %",
               p, " is not a parameter node");
    LOOM_CHECK(g.node(p).attrs.i == static_cast<int64_t>(k), "[verify] node %", p,
               " (parameter): index ", g.node(p).attrs.i, " differs from its position ", k,
               " in params()");
  }
  size_t seen_params = 0;
  for (NodeId id = 0; id < g.size(); ++id) {
    const Node& n = g.node(id);
    if (n.op == OpKind::Parameter) ++seen_params;
    verify_operands(g, id, n);
    verify_attrs(id, n);
    verify_type(g, id, n);
  }
  LOOM_CHECK(seen_params == params.size(), "[verify] the graph has ", seen_params,
             " parameter nodes but params() lists ", params.size());
  for (size_t k = 0; k < g.outputs().size(); ++k) {
    Value v = g.outputs()[k];
    LOOM_CHECK(v.node < g.size() && v.index < g.node(v.node).num_results(), "[verify] output ", k,
               " refers to %", v.node, "#", v.index, ", which does not exist");
  }
}

}  // namespace loom::ir
