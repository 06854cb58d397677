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

void check_shape(const char* op, const Shape& s) {
  constexpr int64_t kMaxElems = int64_t{1} << 48;
  LOOM_CHECK_T(ShapeError, s.size() <= 16, "[", op, "] rank ", s.size(),
               " exceeds the supported maximum of 16");
  int64_t n = 1;
  for (int64_t d : s) {
    LOOM_CHECK_T(ShapeError, d >= 0, "[", op, "] shape ", s, " has a negative extent");
    if (d != 0 && n > kMaxElems / d) n = kMaxElems + 1;
    else n *= d;
  }
  LOOM_CHECK_T(ShapeError, n <= kMaxElems, "[", op, "] shape ", s,
               " has too many elements (limit 2^48)");
}


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
  throw Error(loom::detail::str_cat("[", in.name, "] has no type rule"));
}

namespace {
constexpr NodeId kEmpty = UINT32_MAX;
}

Builder::Builder(Graph& g, bool hash_cons) : g_(&g), hash_cons_(hash_cons) { reindex(); }

void Builder::reindex() {
  merkle_.clear();
  table_.assign(64, kEmpty);
  used_ = 0;
  if (!hash_cons_) return;
  merkle_.reserve(g_->size());
  for (NodeId id = 0; id < g_->size(); ++id) {
    uint64_t h = node_hash(g_->node(id));
    merkle_.push_back(h);
    if (g_->node(id).regions.empty()) insert(h, id);
  }
}

uint64_t Builder::node_hash(const Node& n) const {
  uint64_t h = hash_combine(static_cast<uint64_t>(n.op), static_cast<uint64_t>(n.type.dtype));
  for (int64_t d : n.type.shape) h = hash_combine(h, static_cast<uint64_t>(d));
  for (Value v : n.operands) h = hash_combine(h, merkle(v));
  for (int64_t x : n.attrs.ints) h = hash_combine(h, static_cast<uint64_t>(x));
  uint64_t fbits;
  std::memcpy(&fbits, &n.attrs.f, sizeof fbits);
  h = hash_combine(h, static_cast<uint64_t>(n.attrs.i));
  h = hash_combine(h, fbits ^ (n.attrs.flag ? 0x5bd1e995u : 0u));
  for (const TensorType& t : n.more_types) {
    h = hash_combine(h, static_cast<uint64_t>(t.dtype));
    for (int64_t d : t.shape) h = hash_combine(h, static_cast<uint64_t>(d));
  }
  for (const auto& r : n.regions) {
    Hash128 rh = fingerprint(*r);
    h = hash_combine(hash_combine(h, rh.lo), rh.hi);
  }
  return h;
}

bool Builder::same_node(const Node& a, const Node& b) const {
  return a.op == b.op && a.type == b.type && a.operands == b.operands && a.attrs == b.attrs &&
         a.more_types.empty() && b.more_types.empty() && a.regions.empty() && b.regions.empty();
}

void Builder::insert(uint64_t h, NodeId id) {
  if ((used_ + 1) * 2 > table_.size()) grow();
  size_t mask = table_.size() - 1;
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    if (table_[i] == kEmpty) {
      table_[i] = id;
      ++used_;
      return;
    }
  }
}

void Builder::grow() {
  std::vector<NodeId> old = std::move(table_);
  table_.assign(old.size() * 2, kEmpty);
  size_t mask = table_.size() - 1;
  for (NodeId id : old) {
    if (id == kEmpty) continue;
    size_t i = merkle_[id] & mask;
    while (table_[i] != kEmpty) i = (i + 1) & mask;
    table_[i] = id;
  }
}

Value Builder::make(OpKind op, std::span<const Value> operands, Attrs attrs,
                    const TensorType* given) {
  Node n;
  n.op = op;
  n.operands.assign(operands.begin(), operands.end());
  n.type = infer_type(*g_, op, operands, attrs, given);
  n.attrs = std::move(attrs);
  if (!hash_cons_) return {g_->add(std::move(n)), 0};
  uint64_t h = node_hash(n);
  size_t mask = table_.size() - 1;
  for (size_t i = h & mask; table_[i] != kEmpty; i = (i + 1) & mask) {
    NodeId id = table_[i];
    if (merkle_[id] == h && same_node(g_->node(id), n)) return {id, 0};
  }
  NodeId id = g_->add(std::move(n));
  merkle_.push_back(h);
  insert(h, id);
  return {id, 0};
}

Value Builder::parameter(const TensorType& t) {
  return parameter(t, static_cast<int64_t>(g_->params().size()));
}
Value Builder::parameter(const TensorType& t, int64_t index) {
  Attrs a;
  a.i = index;
  return make(OpKind::Parameter, {}, std::move(a), &t);
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
Value Builder::random(OpKind op, Value key, const TensorType& t) {
  return make(op, std::span<const Value>(&key, 1), {}, &t);
}

}  // namespace loom::ir
