// IR text printer (docs/ir.md). Values are named by their position in the printed text,
// parameters first, not by node id, so that printing a parsed graph reproduces the text.
// Regions continue the numbering of the graph that holds them.
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ostream>

#include "loom/ir/graph.h"

namespace loom::ir {

namespace {

void append_double(std::string& out, double f) {
  if (std::isnan(f)) {
    out += std::signbit(f) ? "-nan" : "nan";
    return;
  }
  if (std::isinf(f)) {
    out += f < 0 ? "-inf" : "inf";
    return;
  }
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", f);
  out += buf;
}

void append_int(std::string& out, int64_t v) { out += std::to_string(v); }

void append_ints(std::string& out, const SmallVector<int64_t, 6>& ints) {
  out += '[';
  for (size_t k = 0; k < ints.size(); ++k) {
    if (k) out += ',';
    append_int(out, ints[k]);
  }
  out += ']';
}

void append_type(std::string& out, const TensorType& t) {
  out += short_name(t.dtype);
  out += '[';
  for (size_t k = 0; k < t.shape.size(); ++k) {
    if (k) out += ',';
    append_int(out, t.shape[k]);
  }
  out += ']';
}

// Integer-dtype constants hold their value in f but print it as an integer.
void append_value(std::string& out, const Node& n) {
  double f = n.attrs.f;
  if (n.op == OpKind::Constant && !is_floating(n.type.dtype) && std::isfinite(f) &&
      f == std::trunc(f) && std::fabs(f) < 9.2e18 && !(f == 0 && std::signbit(f))) {
    append_int(out, static_cast<int64_t>(f));
    return;
  }
  append_double(out, f);
}

void append_attrs(std::string& out, const Node& n) {
  const OpInfo& in = info(n.op);
  const Attrs& a = n.attrs;
  if (a.ints.empty() && a.i == 0 && !a.flag && a.f == 0 && !std::signbit(a.f)) return;
  out += " {";
  bool first = true;
  auto sep = [&](std::string_view name) {
    if (!first) out += ", ";
    first = false;
    out += name;
    out += '=';
  };
  if (!in.ints_name.empty()) sep(in.ints_name), append_ints(out, a.ints);
  if (!in.i_name.empty()) sep(in.i_name), append_int(out, a.i);
  if (!in.flag_name.empty()) sep(in.flag_name), out += a.flag ? "true" : "false";
  // Only constants print a zero f (scan's remat flag is printed when set).
  if (!in.f_name.empty() && (n.op == OpKind::Constant || a.f != 0 || std::signbit(a.f)))
    sep(in.f_name), append_value(out, n);
  out += '}';
}

class Printer {
 public:
  explicit Printer(std::string& out) : out_(out) {}

  void graph(const Graph& g, int indent) {
    // names[id]: the printed number of node id. Numbering runs on through nested regions, so
    // a region's values never shadow the enclosing graph's names.
    std::vector<uint32_t> names(g.size(), 0);
    uint32_t& next = next_;
    out_ += "graph(";
    for (size_t k = 0; k < g.params().size(); ++k) {
      NodeId p = g.params()[k];
      names[p] = next++;
      if (k) out_ += ", ";
      name(names[p]);
      out_ += ": ";
      append_type(out_, g.node(p).type);
    }
    out_ += ") {\n";
    for (NodeId id = 0; id < g.size(); ++id) {
      const Node& n = g.node(id);
      if (n.op == OpKind::Parameter) continue;
      names[id] = next++;
      node(g, id, n, names, indent + 2);
    }
    out_.append(indent + 2, ' ');
    out_ += "return";
    for (size_t k = 0; k < g.outputs().size(); ++k) {
      out_ += k ? ", " : " ";
      value(g, g.outputs()[k], names);
    }
    out_ += '\n';
    out_.append(indent, ' ');
    out_ += '}';
  }

 private:
  void name(uint32_t k) {
    out_ += '%';
    append_int(out_, k);
  }

  void value(const Graph& g, Value v, const std::vector<uint32_t>& names) {
    name(names[v.node]);
    if (g.node(v.node).num_results() > 1) {
      out_ += '#';
      append_int(out_, v.index);
    }
  }

  void node(const Graph& g, NodeId id, const Node& n, const std::vector<uint32_t>& names,
            int indent) {
    out_.append(indent, ' ');
    name(names[id]);
    if (n.num_results() > 1) {
      out_ += ':';
      append_int(out_, static_cast<int64_t>(n.num_results()));
    }
    out_ += " = ";
    out_ += op_name(n.op);
    out_ += '(';
    for (size_t k = 0; k < n.operands.size(); ++k) {
      if (k) out_ += ", ";
      value(g, n.operands[k], names);
    }
    out_ += ')';
    append_attrs(out_, n);
    out_ += " : ";
    append_type(out_, n.type);
    for (const TensorType& t : n.more_types) {
      out_ += ", ";
      append_type(out_, t);
    }
    for (const auto& r : n.regions) {
      out_ += ' ';
      graph(*r, indent);
    }
    out_ += '\n';
  }

  std::string& out_;
  uint32_t next_ = 0;
};

}  // namespace

std::string to_text(const Graph& g) {
  std::string out;
  out.reserve(64 + 48 * g.size());
  Printer(out).graph(g, 0);
  out += '\n';
  return out;
}

std::ostream& operator<<(std::ostream& os, const Graph& g) { return os << to_text(g); }

namespace {

std::string dot_escape(const std::string& s) {
  std::string r;
  for (char c : s) {
    if (c == '"' || c == '\\') r += '\\';
    r += c;
  }
  return r;
}

// One DOT node per IR node ("<prefix>n<id>"), edges from operands; regions as clusters.
void dot_graph(std::string& out, const Graph& g, const std::string& prefix, int indent,
               int* clusters) {
  const std::string pad(static_cast<size_t>(indent), ' ');
  std::vector<std::string> outs(g.size());
  for (size_t k = 0; k < g.outputs().size(); ++k)
    outs[g.outputs()[k].node] +=
        (outs[g.outputs()[k].node].empty() ? "out " : ", ") + std::to_string(k);
  for (NodeId id = 0; id < g.size(); ++id) {
    const Node& n = g.node(id);
    std::string head = "%" + std::to_string(id) + " " + std::string(op_name(n.op)), types;
    append_attrs(head, n);
    append_type(types, n.type);
    for (const TensorType& t : n.more_types) {
      types += ", ";
      append_type(types, t);
    }
    out += pad + prefix + "n" + std::to_string(id) + " [label=\"" + dot_escape(head) + "\\n" +
           dot_escape(types) + "\"";
    if (n.op == OpKind::Parameter) out += ", shape=ellipse";
    if (!outs[id].empty()) out += ", peripheries=2, xlabel=\"" + outs[id] + "\"";
    out += "];\n";
    for (size_t k = 0; k < n.regions.size(); ++k) {
      int c = (*clusters)++;
      std::string sub = "r" + std::to_string(c);
      out += pad + "subgraph cluster_" + std::to_string(c) + " {\n" + pad + "  label=\"" +
             std::string(op_name(n.op)) + " %" + std::to_string(id) + " region " +
             std::to_string(k) + "\";\n";
      dot_graph(out, *n.regions[k], sub, indent + 2, clusters);
      out += pad + "}\n";
      if (!n.regions[k]->outputs().empty())
        out += pad + sub + "n" + std::to_string(n.regions[k]->outputs()[0].node) + " -> " + prefix +
               "n" + std::to_string(id) + " [style=dashed];\n";
    }
  }
  for (NodeId id = 0; id < g.size(); ++id) {
    const Node& n = g.node(id);
    for (size_t k = 0; k < n.operands.size(); ++k) {
      out += pad + prefix + "n" + std::to_string(n.operands[k].node) + " -> " + prefix + "n" +
             std::to_string(id);
      if (n.operands.size() > 1) out += " [label=\"" + std::to_string(k) + "\"]";
      out += ";\n";
    }
  }
}

}  // namespace

std::string to_dot(const Graph& g) {
  std::string out = "digraph loom {\n  node [shape=box, fontname=\"monospace\"];\n";
  int clusters = 0;
  dot_graph(out, g, "", 2, &clusters);
  out += "}\n";
  return out;
}

std::string GraphDifference::str() const {
  return kind == Kind::None ? std::string() : "`" + before + "` became `" + after + "`";
}

GraphDifference first_difference(const Graph& before, const Graph& after) {
  GraphDifference d;
  const std::string a = to_text(before), b = to_text(after);
  if (a == b) return d;
  auto line_at = [](const std::string& s, size_t pos) {
    size_t lo = s.rfind('\n', pos == 0 ? 0 : pos - 1);
    lo = lo == std::string::npos ? 0 : lo + 1;
    size_t hi = s.find('\n', pos);
    std::string line = s.substr(lo, hi == std::string::npos ? std::string::npos : hi - lo);
    size_t first = line.find_first_not_of(' ');
    return first == std::string::npos ? std::string("(end)") : line.substr(first);
  };
  size_t k = 0;
  while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
  if (a.find('\n') >= k) {  // the header: name the first parameter that differs
    auto decl = [](const Graph& g, size_t p) {
      if (p >= g.params().size()) return std::string("(none)");
      std::string t = "%" + std::to_string(p) + ": ";
      append_type(t, g.node(g.params()[p]).type);
      return t;
    };
    size_t p = 0;
    while (p < before.params().size() && p < after.params().size() &&
           decl(before, p) == decl(after, p))
      ++p;
    d.kind = GraphDifference::Kind::Parameter;
    d.index = static_cast<int64_t>(p);
    d.before = decl(before, p);
    d.after = decl(after, p);
    return d;
  }
  d.before = line_at(a, k);
  d.after = line_at(b, k);
  const std::string& node = d.before[0] == '%' ? d.before : d.after;
  if (node.size() > 1 && node[0] == '%') {  // a node line on either side
    d.kind = GraphDifference::Kind::Node;
    d.index = std::strtoll(node.c_str() + 1, nullptr, 10);
  } else {
    d.kind = GraphDifference::Kind::Outputs;
  }
  return d;
}

}  // namespace loom::ir
