// Builder: type inference dispatch, checks at creation, and hash-consing.
#include "loom/ir/builder.h"

#include <algorithm>
#include <cstring>

#include "ir/ops/infer_impl.h"

namespace loom::ir {

namespace detail {

std::string operand_types(const Graph& g, std::span<const Value> operands) {
  std::string s;
  for (size_t i = 0; i < operands.size(); ++i) {
    if (i) s += ", ";
    s += g.type(operands[i]).str();
  }
  return s;
}

}  // namespace detail

TensorType infer_type(const Graph& g, OpKind op, std::span<const Value> xs, const Attrs& attrs,
                      const TensorType* given) {
  const OpInfo& in = info(op);
  LOOM_CHECK(in.arity < 0 || static_cast<int>(xs.size()) == in.arity, "[", in.name, "] expected ",
             in.arity, " operands, got ", xs.size());
  for (Value v : xs) {
    LOOM_CHECK(v.node < g.size() && v.index < g.node(v.node).num_results(), "[", in.name,
               "] operand %", v.node, "#", v.index, " does not exist");
  }
  uint32_t t = in.traits;
  LOOM_CHECK(!several_results(op), "[", in.name,
             "] has several results: build it with Builder::make_region (infer_region_types)");
  if (t & kSource) {
    LOOM_CHECK(given, "[", in.name, "] needs a result type");
    check_shape(in.name.data(), given->shape);
    if (op == OpKind::Iota)
      LOOM_CHECK_T(ShapeError, attrs.i >= 0 && attrs.i < std::max<int64_t>(1, given->shape.rank()),
                   "[iota] axis ", attrs.i, " out of range for ", *given);
    return *given;
  }
  if (t & kRandom) {
    LOOM_CHECK(given, "[", in.name, "] needs a result type");
    const TensorType& key = g.type(xs[0]);
    LOOM_CHECK_T(DTypeError, key.dtype == DType::Int64 && key.shape == Shape{2}, "[", in.name,
                 "] key must be i64[2] = {seed, offset}, got ", key);
    LOOM_CHECK_T(DTypeError, is_floating(given->dtype), "[", in.name,
                 "] result must be floating point, got ", *given);
    check_shape(in.name.data(), given->shape);
    return *given;
  }
  if (t & kElementwise) return detail::infer_elementwise(g, op, xs, given);
  if (t & kReduce) return detail::infer_reduce(g, op, xs, attrs);
  if (t & kLinalg) return detail::infer_linalg(g, op, xs, attrs);
  if (t & kLayout) return detail::infer_layout(g, op, xs, attrs);
  if (t & kIndex) return detail::infer_index(g, op, xs, attrs);
  if (t & kDist) return detail::infer_collective(g, op, xs, attrs);
  throw Error(loom::detail::str_cat("[", in.name, "] has no type rule"));
}

namespace {
constexpr NodeId kEmpty = UINT32_MAX;
}

Builder::Builder(Graph& g, bool hash_cons) : g_(&g), hash_cons_(hash_cons) { reindex(); }

void Builder::reindex() {
  merkle_.clear();
  first_user_.clear();
  in_table_.clear();
  // Size the table for as many nodes as the graph had before (a traced step refills it to
  // about the same size): clearing costs less than growing it again from 64.
  size_t keep = 64;
  while (keep < 3 * used_ && keep < (size_t{1} << 16)) keep *= 2;
  table_.assign(keep, Slot{kEmpty, 0});
  used_ = 0;
  if (!hash_cons_) return;
  merkle_.reserve(g_->size());
  for (NodeId id = 0; id < g_->size(); ++id) {
    const Node& n = g_->node(id);
    merkle_.push_back(node_hash(n));
    record(id, !n.regions.empty()      ? Entry::None
               : has_unused_operand(n) ? Entry::Deferred
                                       : Entry::Table);
  }
}

bool Builder::has_unused_operand(const Node& n) const {
  for (Value v : n.operands)
    if (first_user_[v.node] == kNoUser) return true;
  return false;
}

void Builder::record(NodeId id, Entry e) {
  for (Value v : g_->node(id).operands)
    if (first_user_[v.node] == kNoUser) first_user_[v.node] = id;
  first_user_.push_back(kNoUser);
  in_table_.push_back(e != Entry::Deferred);
  if (e == Entry::Table) insert(merkle_[id], id);
}

namespace {
// A self-delimiting record (head word, counts, fields; XXH3-128 of its bytes; node_hash writes the
// common one itself). Dims only for sources, random draws and control flow: other results' types
// follow from operands (hashed with their types) and attributes, so records stay unique and short.
bool dims_in_record(const Node& n) {
  return (info(n.op).traits & (kSource | kRandom)) || !n.more_types.empty() || !n.regions.empty();
}

template <class Sink>
void node_record(Sink& h, const Node& n, const Builder& b) {
  const bool multi = !n.more_types.empty() || !n.regions.empty();
  h.add(static_cast<uint64_t>(n.op) | (static_cast<uint64_t>(n.type.dtype) << 16) |
        (static_cast<uint64_t>(n.type.shape.size()) << 24) | (uint64_t{n.attrs.flag} << 32) |
        (uint64_t{n.attrs.i != 0} << 33) | (uint64_t{n.attrs.f != 0} << 34) |
        (uint64_t{multi} << 35));
  h.add(n.operands.size() | (uint64_t{n.attrs.ints.size()} << 32));
  if (dims_in_record(n))
    for (int64_t d : n.type.shape) h.add(static_cast<uint64_t>(d));
  for (Value v : n.operands) h.add(b.merkle(v));
  for (int64_t x : n.attrs.ints) h.add(static_cast<uint64_t>(x));
  if (n.attrs.i) h.add(static_cast<uint64_t>(n.attrs.i));
  if (n.attrs.f != 0) h.add_double(n.attrs.f);
  if (!multi) return;
  h.add(n.more_types.size() | (uint64_t{n.regions.size()} << 32));
  for (const TensorType& t : n.more_types) {
    h.add(static_cast<uint64_t>(t.dtype) | (static_cast<uint64_t>(t.shape.size()) << 8));
    for (int64_t d : t.shape) h.add(static_cast<uint64_t>(d));
  }
  for (const auto& r : n.regions) h.add(region_fingerprint(r));
}

}  // namespace

Hash128 Builder::node_hash(const Node& n) const {
  const size_t rank = n.type.shape.size(), arity = n.operands.size(), ints = n.attrs.ints.size();
  if (rank + 2 * arity + ints <= 28 && n.more_types.empty() && n.regions.empty()) {
    // node_record's words for a node without results beyond the first or regions, written
    // straight into the buffer (this runs for every recorded op).
    uint64_t w[32];
    const bool has_i = n.attrs.i != 0, has_f = n.attrs.f != 0;
    w[0] = static_cast<uint64_t>(n.op) | (static_cast<uint64_t>(n.type.dtype) << 16) |
           (static_cast<uint64_t>(rank) << 24) | (uint64_t{n.attrs.flag} << 32) |
           (uint64_t{has_i} << 33) | (uint64_t{has_f} << 34);
    w[1] = arity | (uint64_t{ints} << 32);
    uint64_t* out = w + 2;
    if (info(n.op).traits & (kSource | kRandom))
      for (int64_t d : n.type.shape) *out++ = static_cast<uint64_t>(d);
    for (Value v : n.operands) {
      const Hash128 m = merkle(v);
      out[0] = m.lo;
      out[1] = m.hi;
      out += 2;
    }
    for (int64_t x : n.attrs.ints) *out++ = static_cast<uint64_t>(x);
    if (has_i) *out++ = static_cast<uint64_t>(n.attrs.i);
    if (has_f) std::memcpy(out++, &n.attrs.f, sizeof(double));
    return hash128(w, static_cast<size_t>(out - w) * sizeof(uint64_t));
  }
  Hasher128 h;
  node_record(h, n, *this);
  return h.finish();
}

bool Builder::same_node(const Node& a, const Node& b) const {
  return a.op == b.op && a.type == b.type && a.operands == b.operands && a.attrs == b.attrs &&
         a.more_types.empty() && b.more_types.empty() && a.regions.empty() && b.regions.empty();
}

void Builder::insert(const Hash128& h, NodeId id) {
  if ((used_ + 1) * 3 > table_.size()) grow();  // load <= 1/3 keeps miss probes short
  size_t mask = table_.size() - 1;
  const uint32_t tag = static_cast<uint32_t>(h.lo);
  size_t i = tag & mask;
  while (table_[i].id != kEmpty) i = (i + 1) & mask;
  table_[i] = Slot{id, tag};
  ++used_;
}

void Builder::grow() {
  std::vector<Slot> old = std::move(table_);
  table_.assign(old.size() * 2, Slot{kEmpty, 0});
  size_t mask = table_.size() - 1;
  for (Slot s : old) {
    if (s.id == kEmpty) continue;
    size_t i = s.tag & mask;  // the tag holds the index bits: no read of merkle_
    while (table_[i].id != kEmpty) i = (i + 1) & mask;
    table_[i] = s;
  }
}

Value Builder::make(OpKind op, std::span<const Value> operands, Attrs attrs,
                    const TensorType* given) {
  TensorType type = infer_type(*g_, op, operands, attrs, given);
  // Built in place at the end of the graph, and dropped again when hash-consing finds it.
  NodeId id = static_cast<NodeId>(g_->size());
  Node& n = g_->emplace_back(op);
  n.operands.assign(operands.begin(), operands.end());
  n.type = std::move(type);
  n.attrs = std::move(attrs);
  return intern(id);
}

Value Builder::intern(NodeId id) {
  if (!hash_cons_) return {id, 0};
  const Node& n = g_->node(id);
  const Hash128 h = node_hash(n);
  // A node equal to n uses every operand of n: with an operand no node uses yet, n is new and
  // is left out of the table (deferred) until a second node uses that operand. That node
  // puts it in first, so it finds it. An elementwise chain never touches the table.
  bool unused = false;
  for (Value v : n.operands) {
    const NodeId u = first_user_[v.node];
    if (u == kNoUser) {
      unused = true;
    } else if (!in_table_[u]) {
      in_table_[u] = 1;
      insert(merkle_[u], u);
    }
  }
  if (!unused) {
    size_t mask = table_.size() - 1;
    const uint32_t tag = static_cast<uint32_t>(h.lo);
    for (size_t i = tag & mask; table_[i].id != kEmpty; i = (i + 1) & mask) {
      const Slot& s = table_[i];
      if (s.tag == tag && merkle_[s.id] == h && same_node(g_->node(s.id), n)) {
        g_->pop_back();
        return {s.id, 0};
      }
    }
  }
  merkle_.push_back(h);
  record(id, unused ? Entry::Deferred : Entry::Table);
  return {id, 0};
}

std::vector<Value> Builder::make_region(OpKind op, std::span<const Value> operands, Attrs attrs,
                                        std::vector<std::shared_ptr<const Graph>> regions) {
  std::vector<TensorType> types = infer_region_types(*g_, op, operands, attrs, regions);
  Node n;
  n.op = op;
  n.operands.assign(operands.begin(), operands.end());
  n.type = std::move(types[0]);
  n.more_types.assign(std::make_move_iterator(types.begin() + 1),
                      std::make_move_iterator(types.end()));
  n.attrs = std::move(attrs);
  n.regions = std::move(regions);
  NodeId id = add(std::move(n));
  std::vector<Value> results;
  results.reserve(types.size());
  for (uint32_t k = 0; k < types.size(); ++k) results.push_back({id, k});
  return results;
}

NodeId Builder::add(Node n) {
  Hash128 h = hash_cons_ ? node_hash(n) : Hash128{};
  NodeId id = g_->add(std::move(n));
  if (hash_cons_) {
    merkle_.push_back(h);
    record(id, Entry::None);  // never merged, as before a reindex
  }
  return id;
}

Value Builder::parameter(const TensorType& t) {
  return parameter(t, static_cast<int64_t>(g_->params().size()));
}
namespace {
// Appends a parameter node after infer_type's checks for it (its shape), without the generic
// dispatch: every host number and data tensor of a trace comes through here.
NodeId append_parameter(Graph& g, const TensorType& t, int64_t index) {
  if (!t.shape.empty()) check_shape("parameter", t.shape);  // a 0-d type always passes
  NodeId id = static_cast<NodeId>(g.size());
  Node& n = g.emplace_back(OpKind::Parameter);
  n.type = t;
  n.attrs.i = index;
  return id;
}
}  // namespace

Value Builder::parameter(const TensorType& t, int64_t index) {
  return intern(append_parameter(*g_, t, index));
}
Value Builder::unique_parameter(const TensorType& t, int64_t index) {
  const NodeId id = append_parameter(*g_, t, index);
  if (hash_cons_) {
    merkle_.push_back(node_hash(g_->node(id)));
    record(id, Entry::None);
  }
  return {id, 0};
}
Value Builder::constant(double v, DType dt) {
  Attrs a;
  a.f = v;
  TensorType t{dt, {}};
  return make(OpKind::Constant, {}, std::move(a), &t);
}
Value Builder::iota(const TensorType& t, int64_t axis) {
  Attrs a;
  a.i = axis;
  return make(OpKind::Iota, {}, std::move(a), &t);
}
Value Builder::unary(OpKind op, Value x) { return make(op, std::span<const Value>(&x, 1)); }
Value Builder::binary(OpKind op, Value a, Value b) {
  Value xs[2] = {a, b};
  return make(op, xs);
}
Value Builder::where(Value cond, Value a, Value b) {
  Value xs[3] = {cond, a, b};
  return make(OpKind::Where, xs);
}
Value Builder::convert(Value x, DType dt) {
  if (type(x).dtype == dt) return x;
  TensorType t{dt, {}};
  return make(OpKind::Convert, std::span<const Value>(&x, 1), {}, &t);
}
Value Builder::reduce(OpKind op, Value x, std::vector<int64_t> axes, bool keepdim) {
  std::sort(axes.begin(), axes.end());
  Attrs a;
  a.ints.assign(axes.begin(), axes.end());
  a.flag = keepdim;
  return make(op, std::span<const Value>(&x, 1), std::move(a));
}
Value Builder::argmax(Value x, int64_t axis, bool keepdim) {
  Attrs a;
  a.i = axis;
  a.flag = keepdim;
  return make(OpKind::ArgMax, std::span<const Value>(&x, 1), std::move(a));
}
Value Builder::argsort(Value x, int64_t axis, bool descending) {
  Attrs a;
  a.i = axis;
  a.flag = descending;
  return make(OpKind::ArgSort, std::span<const Value>(&x, 1), std::move(a));
}
Value Builder::matmul(Value a, Value b) { return binary(OpKind::MatMul, a, b); }
Value Builder::reshape(Value x, const Shape& shape) {
  if (type(x).shape == shape) return x;
  Attrs a;
  a.ints.assign(shape.begin(), shape.end());
  return make(OpKind::Reshape, std::span<const Value>(&x, 1), std::move(a));
}
Value Builder::permute(Value x, std::vector<int64_t> perm) {
  Attrs a;
  a.ints.assign(perm.begin(), perm.end());
  return make(OpKind::Permute, std::span<const Value>(&x, 1), std::move(a));
}
Value Builder::expand(Value x, const Shape& shape) {
  if (type(x).shape == shape) return x;
  Attrs a;
  a.ints.assign(shape.begin(), shape.end());
  return make(OpKind::Expand, std::span<const Value>(&x, 1), std::move(a));
}
Value Builder::slice(Value x, int64_t axis, int64_t start, int64_t end, int64_t step) {
  Attrs a;
  a.ints = {start, end, step};
  a.i = axis;
  return make(OpKind::Slice, std::span<const Value>(&x, 1), std::move(a));
}
Value Builder::concat(std::span<const Value> xs, int64_t axis) {
  if (xs.size() == 1) return xs[0];
  Attrs a;
  a.i = axis;
  return make(OpKind::Concat, xs, std::move(a));
}
Value Builder::gather(Value x, int64_t axis, Value index) {
  Attrs a;
  a.i = axis;
  Value xs[2] = {x, index};
  return make(OpKind::Gather, xs, std::move(a));
}
Value Builder::index_select(Value x, int64_t axis, Value index) {
  Attrs a;
  a.i = axis;
  Value xs[2] = {x, index};
  return make(OpKind::IndexSelect, xs, std::move(a));
}
Value Builder::index_add(Value base, int64_t axis, Value index, Value src) {
  Attrs a;
  a.i = axis;
  Value xs[3] = {base, index, src};
  return make(OpKind::IndexAdd, xs, std::move(a));
}
Value Builder::random(OpKind op, Value key, const TensorType& t) {
  return make(op, std::span<const Value>(&key, 1), {}, &t);
}

}  // namespace loom::ir
