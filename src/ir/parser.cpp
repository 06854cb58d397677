// IR text parser (docs/ir.md). Nodes are created through Builder::make without hash-consing,
// so that the text round-trips node for node and every node is type-checked by the same rules
// as traced code. The parser takes arbitrary text: nesting, list lengths, ranks and element
// counts are bounded, numbers are range-checked, and all work is linear in the input.
#include <charconv>
#include <cmath>
#include <limits>
#include <memory>
#include <unordered_map>

#include "loom/core/error.h"
#include "loom/ir/builder.h"
#include "loom/ir/graph.h"

namespace loom::ir {

namespace {

constexpr int kMaxDepth = 64;       // graphs nested through regions
constexpr size_t kMaxListLen = 64;  // entries of an attribute list
constexpr size_t kMaxRank = 16;
constexpr int64_t kMaxResults = 64;
constexpr int64_t kMaxElements = int64_t{1} << 40;

bool is_ident_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_ident_char(char c) { return is_ident_start(c) || is_digit(c); }
bool is_name_char(char c) { return is_ident_char(c) || c == '.' || c == '$'; }

// What the names of one graph (the top level or a region) refer to.
using Scope = std::unordered_map<std::string_view, NodeId>;

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  Graph parse_top() {
    Graph g = graph(0);
    skip_ws();
    if (pos_ < text_.size()) fail(pos_, "unexpected text after the graph");
    return g;
  }

 private:
  [[noreturn]] void fail(size_t at, const std::string& msg) const {
    int line = 1;
    size_t line_start = 0;
    for (size_t k = 0; k < at && k < text_.size(); ++k) {
      if (text_[k] == '\n') ++line, line_start = k + 1;
    }
    throw ParseError(line, static_cast<int>(at - line_start) + 1, msg);
  }

  std::string found() const {
    if (pos_ >= text_.size()) return "the end of the text";
    char c = text_[pos_];
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f)
      return detail::str_cat("byte ", static_cast<int>(static_cast<unsigned char>(c)));
    return detail::str_cat("'", c, "'");
  }

  void skip_ws() {
    while (pos_ < text_.size()) {
      char c = text_[pos_];
      if (c == '#') {
        while (pos_ < text_.size() && text_[pos_] != '\n') ++pos_;
      } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++pos_;
      } else {
        return;
      }
    }
  }

  bool peek(char c) {
    skip_ws();
    return pos_ < text_.size() && text_[pos_] == c;
  }

  bool accept(char c) {
    skip_ws();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  void expect(char c, const char* context) {
    if (!accept(c))
      fail(pos_, detail::str_cat("expected '", c, "' ", context, ", found ", found()));
  }

  std::string_view ident(const char* what) {
    skip_ws();
    size_t start = pos_;
    if (pos_ >= text_.size() || !is_ident_start(text_[pos_]))
      fail(pos_, detail::str_cat("expected ", what, ", found ", found()));
    while (pos_ < text_.size() && is_ident_char(text_[pos_])) ++pos_;
    return text_.substr(start, pos_ - start);
  }

  void keyword(std::string_view kw) {
    size_t at = (skip_ws(), pos_);
    if (ident(detail::str_cat("'", kw, "'").c_str()) != kw)
      fail(at, detail::str_cat("expected '", kw, "'"));
  }

  bool at_keyword(std::string_view kw) {
    skip_ws();
    return text_.substr(pos_, kw.size()) == kw &&
           (pos_ + kw.size() == text_.size() || !is_ident_char(text_[pos_ + kw.size()]));
  }

  // "%name" (the '%' included); returns the name without it.
  std::string_view name() {
    expect('%', "before a value name");
    size_t start = pos_;
    while (pos_ < text_.size() && is_name_char(text_[pos_])) ++pos_;
    if (pos_ == start)
      fail(pos_, detail::str_cat("expected a value name after '%', found ", found()));
    return text_.substr(start, pos_ - start);
  }

  // A number token: sign, then letters, digits, '.', and a signed exponent.
  std::string_view number_token() {
    skip_ws();
    size_t start = pos_;
    if (pos_ < text_.size() && (text_[pos_] == '-' || text_[pos_] == '+')) ++pos_;
    while (pos_ < text_.size()) {
      char c = text_[pos_];
      // pos_ > start here whenever c is a sign, since a leading sign was consumed above.
      bool exp_sign = (c == '-' || c == '+') && (text_[pos_ - 1] == 'e' || text_[pos_ - 1] == 'E');
      if (!is_ident_char(c) && c != '.' && !exp_sign) break;
      ++pos_;
    }
    if (pos_ == start) fail(pos_, detail::str_cat("expected a number, found ", found()));
    return text_.substr(start, pos_ - start);
  }

  int64_t integer(const char* what) {
    std::string_view tok = number_token();
    size_t at = pos_ - tok.size();
    if (!tok.empty() && tok[0] == '+') tok.remove_prefix(1);
    int64_t v = 0;
    auto [end, ec] = std::from_chars(tok.data(), tok.data() + tok.size(), v);
    if (ec == std::errc::result_out_of_range)
      fail(at, detail::str_cat(what, " '", tok, "' is out of range for a 64-bit integer"));
    if (ec != std::errc() || end != tok.data() + tok.size())
      fail(at, detail::str_cat("expected an integer for ", what, ", found '", tok, "'"));
    return v;
  }

  double real(const char* what) {
    std::string_view tok = number_token();
    size_t at = pos_ - tok.size();
    bool neg = !tok.empty() && tok[0] == '-';
    if (!tok.empty() && (tok[0] == '-' || tok[0] == '+')) tok.remove_prefix(1);
    double v = 0;
    if (tok == "inf") {
      v = std::numeric_limits<double>::infinity();
    } else if (tok == "nan") {
      v = std::numeric_limits<double>::quiet_NaN();
    } else {
      auto [end, ec] = std::from_chars(tok.data(), tok.data() + tok.size(), v);
      bool digits = !tok.empty() && (is_digit(tok[0]) || tok[0] == '.');
      if (!digits || ec == std::errc::invalid_argument || end != tok.data() + tok.size())
        fail(at, detail::str_cat("expected a number for ", what, ", found '", tok, "'"));
      if (ec == std::errc::result_out_of_range)  // overflows, or underflows below subnormals
        fail(at, detail::str_cat(what, " '", tok, "' is out of range for a double"));
    }
    return neg ? -v : v;
  }

  TensorType type() {
    size_t at = (skip_ws(), pos_);
    std::string_view dt = ident("a type");
    TensorType t;
    if (!parse_dtype(dt, &t.dtype))
      fail(at, detail::str_cat("unknown dtype '", dt,
                               "'; expected bool, i32, i64, bf16, f16, f32 or f64"));
    expect('[', "after the dtype");
    if (accept(']')) return t;
    int64_t elements = 1;
    do {
      size_t dim_at = (skip_ws(), pos_);
      int64_t d = integer("an extent");
      if (d < 0) fail(dim_at, detail::str_cat("negative extent ", d, " in a type"));
      if (t.shape.size() == kMaxRank) fail(dim_at, "rank exceeds the maximum of 16");
      elements = (d != 0 && elements > kMaxElements / d) ? kMaxElements + 1 : elements * d;
      if (elements > kMaxElements) fail(dim_at, "type has more than 2^40 elements");
      t.shape.push_back(d);
    } while (accept(','));
    expect(']', "after the extents");
    return t;
  }

  Value value(const Graph& g, const Scope& scope) {
    size_t at = (skip_ws(), pos_);
    std::string_view nm = name();
    auto it = scope.find(nm);
    if (it == scope.end())
      fail(at, detail::str_cat("undefined value '%", nm, "' (values must be defined before use)"));
    const Node& n = g.node(it->second);
    Value v{it->second, 0};
    // '#' right after a name and before a digit selects a result; elsewhere it opens a comment.
    if (pos_ + 1 < text_.size() && text_[pos_] == '#' && is_digit(text_[pos_ + 1])) {
      ++pos_;
      size_t idx_at = pos_;
      int64_t k = integer("a result index");
      if (k < 0 || static_cast<size_t>(k) >= n.num_results())
        fail(idx_at, detail::str_cat("'%", nm, "' has ", n.num_results(), " result(s); #", k,
                                     " does not exist"));
      v.index = static_cast<uint32_t>(k);
    } else if (n.num_results() > 1) {
      fail(at, detail::str_cat("'%", nm, "' has ", n.num_results(), " results; name one as '%", nm,
                               "#<k>'"));
    }
    return v;
  }

  void define(Scope& scope, std::string_view nm, NodeId id, size_t at) {
    if (!scope.emplace(nm, id).second) fail(at, detail::str_cat("redefinition of '%", nm, "'"));
  }

  void attr_value(int field, Attrs& a) {
    switch (field) {
      case 0: {
        expect('[', "to open an attribute list");
        if (accept(']')) return;
        do {
          size_t at = (skip_ws(), pos_);
          if (a.ints.size() == kMaxListLen) fail(at, "attribute list longer than 64 entries");
          a.ints.push_back(integer("an attribute"));
        } while (accept(','));
        expect(']', "to close an attribute list");
        return;
      }
      case 1: a.i = integer("an attribute"); return;
      case 2: {
        size_t at = (skip_ws(), pos_);
        std::string_view b = ident("true or false");
        if (b != "true" && b != "false")
          fail(at, detail::str_cat("expected true or false, found '", b, "'"));
        a.flag = b == "true";
        return;
      }
      default: a.f = real("an attribute"); return;
    }
  }

  Attrs attrs(OpKind op) {
    const OpInfo& in = info(op);
    const std::string_view names[4] = {in.ints_name, in.i_name, in.flag_name, in.f_name};
    Attrs a;
    expect('{', "to open the attributes");
    if (accept('}')) return a;
    bool seen[4] = {false, false, false, false};
    do {
      size_t at = (skip_ws(), pos_);
      std::string_view key = ident("an attribute name");
      int field = -1;
      for (int k = 0; k < 4; ++k) {
        if (!names[k].empty() && names[k] == key) field = k;
      }
      if (field < 0) fail(at, detail::str_cat("[", in.name, "] has no attribute '", key, "'"));
      if (seen[field]) fail(at, detail::str_cat("attribute '", key, "' given twice"));
      seen[field] = true;
      expect('=', "after the attribute name");
      attr_value(field, a);
    } while (accept(','));
    expect('}', "to close the attributes");
    return a;
  }

  void statement(Graph& g, Builder& b, Scope& scope, int depth);
  void region_node(Builder& b, Scope& scope, std::string_view nm, size_t at, OpKind op,
                   std::span<const Value> operands, Attrs a, const std::vector<TensorType>& types,
                   std::vector<std::shared_ptr<const Graph>> regions);
  Graph graph(int depth);

  std::string_view text_;
  size_t pos_ = 0;
};

// %name[:k] = op(operands) {attrs} : type[, type...] [graph(...) {...}]...
void Parser::statement(Graph& g, Builder& b, Scope& scope, int depth) {
  size_t at = (skip_ws(), pos_);
  std::string_view nm = name();
  int64_t results = 1;
  if (accept(':')) {
    size_t k_at = (skip_ws(), pos_);
    results = integer("a result count");
    if (results < 1 || results > kMaxResults)
      fail(k_at, detail::str_cat("result count ", results, " out of range [1, 64]"));
  }
  expect('=', "after the value name");
  size_t op_at = (skip_ws(), pos_);
  std::string_view op_text = ident("an op");
  OpKind op;
  if (!parse_op(op_text, &op)) fail(op_at, detail::str_cat("unknown op '", op_text, "'"));
  if (op == OpKind::Parameter) fail(op_at, "parameters are declared in the graph header");
  expect('(', "after the op");
  SmallVector<Value, 3> operands;
  if (!accept(')')) {
    do operands.push_back(value(g, scope));
    while (accept(','));
    expect(')', "after the operands");
  }
  Attrs a = peek('{') ? attrs(op) : Attrs{};
  expect(':', "before the result type");
  std::vector<TensorType> types{type()};
  for (int64_t k = 1; k < results; ++k) {
    expect(',', "between result types");
    types.push_back(type());
  }
  std::vector<std::shared_ptr<const Graph>> regions;
  while (at_keyword("graph")) regions.push_back(std::make_shared<const Graph>(graph(depth + 1)));

  if (several_results(op)) {
    region_node(b, scope, nm, at, op, operands, std::move(a), types, std::move(regions));
    return;
  }
  if (results != 1) fail(at, detail::str_cat("[", op_text, "] has one result, not ", results));
  if (!regions.empty()) fail(at, detail::str_cat("[", op_text, "] takes no regions"));
  Value v;
  try {
    v = b.make(op, operands, std::move(a), &types[0]);
  } catch (const Error& e) {
    fail(at, e.what());
  }
  if (!(g.type(v) == types[0]))
    fail(at, detail::str_cat("[", op_text, "] result type is written ", types[0],
                             " but the operands give ", g.type(v)));
  define(scope, nm, v.node, at);
}

// A control-flow node, built and checked by the same entry point as traced code.
void Parser::region_node(Builder& b, Scope& scope, std::string_view nm, size_t at, OpKind op,
                         std::span<const Value> operands, Attrs a,
                         const std::vector<TensorType>& types,
                         std::vector<std::shared_ptr<const Graph>> regions) {
  std::vector<Value> vs;
  try {
    vs = b.make_region(op, operands, std::move(a), std::move(regions));
  } catch (const Error& e) {
    fail(at, e.what());
  }
  bool same = vs.size() == types.size();
  for (size_t k = 0; same && k < vs.size(); ++k) same = b.type(vs[k]) == types[k];
  if (!same) {
    std::string written, inferred;
    for (size_t k = 0; k < types.size(); ++k) written += (k ? ", " : "") + types[k].str();
    for (size_t k = 0; k < vs.size(); ++k) inferred += (k ? ", " : "") + b.type(vs[k]).str();
    fail(at, detail::str_cat("[", op_name(op), "] result types are written ", written,
                             " but the operands and regions give ", inferred));
  }
  define(scope, nm, vs[0].node, at);
}

// graph(%p: type, ...) { statements; return values }
Graph Parser::graph(int depth) {
  size_t at = (skip_ws(), pos_);
  if (depth >= kMaxDepth) fail(at, "regions nest deeper than 64 levels");
  keyword("graph");
  expect('(', "after 'graph'");
  Graph g;
  Builder b(g, /*hash_cons=*/false);
  Scope scope;
  if (!accept(')')) {
    int64_t index = 0;
    do {
      size_t p_at = (skip_ws(), pos_);
      std::string_view nm = name();
      expect(':', "after a parameter name");
      TensorType t = type();
      define(scope, nm, b.parameter(t, index++).node, p_at);
    } while (accept(','));
    expect(')', "after the parameters");
  }
  expect('{', "to open the graph body");
  while (true) {
    skip_ws();
    if (pos_ < text_.size() && text_[pos_] == '%') {
      statement(g, b, scope, depth);
      continue;
    }
    size_t kw_at = pos_;
    if (!at_keyword("return"))
      fail(kw_at, detail::str_cat("expected a statement or 'return', found ", found()));
    keyword("return");
    if (!accept('}')) {
      do g.outputs().push_back(value(g, scope));
      while (accept(','));
      expect('}', "to close the graph");
    }
    return g;
  }
}

}  // namespace

Graph parse(std::string_view text) { return Parser(text).parse_top(); }

}  // namespace loom::ir
