// The partitioner (loom/passes/partition.h): backward hints, then forward propagation of
// shardings op by op into a graph of local shapes with the resharding collectives inserted.
#include "loom/passes/partition.h"

#include <algorithm>
#include <initializer_list>

#include "loom/core/error.h"
#include "loom/ir/builder.h"
#include "loom/ir/op_kind.h"

namespace loom::passes {

namespace {

using ir::Node;
using ir::NodeId;
using ir::OpKind;
using ir::Sharding;
using ir::Value;

// Every axis of `a` comes after every axis of `b` (a split by a refines a split by b).
bool minor_to(uint32_t a, uint32_t b) {
  if (!a || !b) return true;
  return (31 - __builtin_clz(b)) < __builtin_ctz(a);
}

class Partitioner {
 public:
  explicit Partitioner(const ir::Graph& g) : g_(g), b_(out_.graph) {}
  // A region's body: its parameters laid out as `params`; outputs k with forced[k] leave the
  // body in that layout (loop carries keep one layout across iterations).
  Partitioner(const ir::Graph& body, std::vector<int64_t> mesh, std::vector<Sharding> params,
              std::vector<std::optional<Sharding>> forced)
      : g_(body),
        b_(out_.graph),
        mesh_(std::move(mesh)),
        params_(std::move(params)),
        forced_(std::move(forced)),
        region_(true) {}

  Partitioned run() {
    if (!region_) find_mesh();
    stored_.assign(g_.size(), std::nullopt);
    for (NodeId id = 0; id < g_.size(); ++id) {
      const Node& n = g_.node(id);
      if (n.op == OpKind::Shard && n.attrs.flag) {
        const Node& p = g_.node(n.operands[0].node);
        LOOM_CHECK(p.op == OpKind::Parameter, "[partition] shard{stored} of a ", ir::op_name(p.op),
                   ": a stored layout belongs to a parameter");
        stored_[n.operands[0].node] = ir::decode_sharding(n.attrs, p.type.shape.rank());
      }
    }
    find_hints();
    local_.resize(g_.size());
    state_.resize(g_.size());
    out_.values.resize(g_.size());
    for (NodeId id = 0; id < g_.size(); ++id) {
      node_ = id;
      lower(g_.node(id));
      if (!state_[id].empty() && !state_[id][0].replicated()) out_.values[id] = state_[id][0];
    }
    for (size_t k = 0; k < g_.outputs().size(); ++k) {
      const Value v = g_.outputs()[k];
      node_ = v.node;
      Sharding s = state(v);
      Value lv = local(v);
      // A body's results may stay partial sums (a scan's ys: the stacked per-layer gradients
      // are reduced once after the loop, not once per iteration); a graph's may not.
      Sharding want = s;
      if (!region_) want.partial = 0;
      if (k < forced_.size() && forced_[k]) want = *forced_[k];
      if (!(want == s)) {
        lv = reshard(lv, s, want);
        s = want;
      }
      out_.graph.outputs().push_back(lv);
      out_.outputs.push_back(s.replicated() ? std::nullopt : std::optional<Sharding>(s));
    }
    return std::move(out_);
  }

 private:
  void find_mesh() { find_mesh(g_); }
  void find_mesh(const ir::Graph& g) {
    for (NodeId id = 0; id < g.size(); ++id) {
      const Node& n = g.node(id);
      for (const auto& r : n.regions) find_mesh(*r);
      if (n.op != OpKind::Shard) continue;
      const Sharding s = ir::decode_sharding(n.attrs, g.type(n.operands[0]).shape.rank());
      if (mesh_.empty()) mesh_ = s.mesh;
      LOOM_CHECK(mesh_ == s.mesh, "[mark_sharding] one graph uses two meshes (", to_string(s),
                 " and one of ", mesh_.size(), " axes): annotate with one mesh per program");
    }
  }

  // Backward hints: an annotation's layout flows back through single-use elementwise ops and
  // permutes, so the work before an annotation runs on blocks (docs/architecture.md).
  void find_hints() {
    hint_.assign(g_.size(), {});
    std::vector<int> uses(g_.size(), 0);
    for (NodeId id = 0; id < g_.size(); ++id)
      for (Value v : g_.node(id).operands) ++uses[v.node];
    for (Value v : g_.outputs()) ++uses[v.node];
    for (NodeId id = static_cast<NodeId>(g_.size()); id-- > 0;) {
      const Node& n = g_.node(id);
      std::vector<uint32_t> h;
      if (n.op == OpKind::Shard && !n.attrs.flag)
        h = ir::decode_sharding(n.attrs, n.type.shape.rank()).dims;
      else
        h = hint_[id];
      if (h.empty() || n.num_results() != 1) continue;
      const bool elementwise = ir::has_trait(n.op, ir::kElementwise) && n.regions.empty();
      if (!elementwise && n.op != OpKind::Permute && n.op != OpKind::Shard) continue;
      for (Value v : n.operands) {
        if (uses[v.node] != 1 || g_.node(v.node).num_results() != 1 || !hint_[v.node].empty())
          continue;
        const Shape& s = g_.type(v).shape;
        std::vector<uint32_t> oh(s.size(), 0);
        if (n.op == OpKind::Permute) {
          for (size_t d = 0; d < n.attrs.ints.size(); ++d)
            oh[static_cast<size_t>(n.attrs.ints[d])] = h[d];
        } else {
          const size_t off = n.type.shape.size() - s.size();
          for (size_t d = 0; d < s.size(); ++d)
            oh[d] = s[d] == n.type.shape[off + d] ? h[off + d] : 0;
        }
        hint_[v.node] = std::move(oh);
      }
    }
  }
  // The hinted layout for a node whose computed layout is whole, when it fits.
  bool hinted(const Shape& shape, Sharding* s) const {
    const std::vector<uint32_t>& h = hint_[node_];
    if (h.empty() || !s->replicated() || h.size() != shape.size()) return false;
    for (size_t d = 0; d < h.size(); ++d)
      if (!fits(shape[d], h[d])) return false;
    s->dims = h;
    return true;
  }

  Sharding replicated(int64_t rank) const {
    Sharding s;
    s.mesh = mesh_;
    s.dims.assign(static_cast<size_t>(rank), 0);
    return s;
  }
  const Sharding& state(Value v) const { return state_[v.node][v.index]; }
  Value local(Value v) const { return local_[v.node][v.index]; }
  void set(NodeId id, std::vector<Value> lv, std::vector<Sharding> s) {
    local_[id] = std::move(lv);
    state_[id] = std::move(s);
  }

  // A collective over `group`; dims: [dim], or [split, concat] for mesh_all_to_all.
  Value mesh_op(OpKind op, Value x, std::initializer_list<int64_t> dims, uint32_t group) {
    ir::Attrs a;
    a.ints.assign(dims.begin(), dims.end());
    for (int64_t m : mesh_) a.ints.push_back(m);
    a.i = group;
    Value y = b_.make(op, std::span<const Value>(&x, 1), std::move(a));
    const TensorType& t = b_.type(op == OpKind::MeshAllGather ? y : x);
    out_.collectives.push_back({op, group, t.nbytes(), node_});
    return y;
  }

  // x (local, laid out as `from`) laid out as `to`: partial sums reduced, then the axes a dim
  // loses gathered, then the axes a dim gains sliced locally; axes that leave one dim for
  // another move in one all_to_all.
  Value reshard(Value x, const Sharding& from, const Sharding& to) {
    uint32_t partial = from.partial & ~to.partial;
    const size_t rank = from.dims.size();
    std::vector<uint32_t> slice(rank, 0);
    std::vector<bool> moved(rank, false);
    for (size_t d = 0; d < rank; ++d) {
      const uint32_t lost = from.dims[d] & ~to.dims[d];
      if (!lost || (to.dims[d] & ~from.dims[d]) || !minor_to(lost, to.dims[d])) continue;
      for (size_t e = 0; e < rank; ++e) {
        const uint32_t gained = to.dims[e] & ~from.dims[e];
        if (e == d || moved[e] || gained != lost || (from.dims[e] & ~to.dims[e]) ||
            !minor_to(gained, from.dims[e]))
          continue;
        x = mesh_op(OpKind::MeshAllToAll, x, {static_cast<int64_t>(e), static_cast<int64_t>(d)},
                    lost);
        moved[d] = moved[e] = true;
        break;
      }
    }
    for (size_t d = 0; d < rank; ++d) {
      const uint32_t f = from.dims[d], t = to.dims[d];
      if (f == t || moved[d]) continue;
      const uint32_t gained = t & ~f, lost = f & ~t;
      if (!lost && minor_to(gained, f)) {
        slice[d] = gained;
      } else if (!gained && minor_to(lost, t)) {
        x = mesh_op(OpKind::MeshAllGather, x, {static_cast<int64_t>(d)}, lost);
      } else {
        x = mesh_op(OpKind::MeshAllGather, x, {static_cast<int64_t>(d)}, f);
        slice[d] = t;
      }
    }
    // Partial sums resolved into a dim that gains exactly their axes: one reduce_scatter
    // (each rank receives only its block of the sum) instead of an all_reduce and a slice.
    for (size_t d = 0; d < slice.size() && partial; ++d)
      if (slice[d] == partial) {
        x = mesh_op(OpKind::MeshReduceScatter, x, {static_cast<int64_t>(d)}, partial);
        slice[d] = 0;
        partial = 0;
      }
    if (partial) x = mesh_op(OpKind::MeshAllReduce, x, {0}, partial);
    for (size_t d = 0; d < slice.size(); ++d)
      if (slice[d]) x = mesh_op(OpKind::MeshSlice, x, {static_cast<int64_t>(d)}, slice[d]);
    return x;
  }
  Value to_layout(Value v, const Sharding& to) { return reshard(local(v), state(v), to); }

  // A dim mask usable on a dim of extent n: the axes split it evenly.
  bool fits(int64_t n, uint32_t axes) const {
    return n > 1 || !axes ? n % ir::group_size(mesh_, axes) == 0 : false;
  }

  void lower(const Node& n) {
    const TensorType* given = ir::has_trait(n.op, ir::kTypeGiven) ? &n.type : nullptr;
    switch (n.op) {
      case OpKind::Parameter: {
        TensorType t = n.type;
        Sharding s = replicated(t.shape.rank());
        if (stored_[node_]) s = *stored_[node_];
        if (region_) s = params_[static_cast<size_t>(n.attrs.i)];
        t.shape = ir::local_shape(t.shape, s);
        set(node_, {b_.parameter(t, n.attrs.i)}, {s});
        return;
      }
      case OpKind::Constant:
      case OpKind::Iota:
      case OpKind::RandUniform:
      case OpKind::RandNormal: copy(n); return;
      case OpKind::Shard: {
        Sharding s = ir::decode_sharding(n.attrs, n.type.shape.rank());
        for (size_t d = 0; d < s.dims.size(); ++d)
          LOOM_CHECK_T(ShapeError, fits(n.type.shape[d], s.dims[d]), "[mark_sharding] dim ", d,
                       " of ", n.type, " does not split evenly into ", s.shards(d), " blocks");
        if (n.attrs.flag) {
          set(node_, {local(n.operands[0])}, {state(n.operands[0])});
          return;
        }
        set(node_, {to_layout(n.operands[0], s)}, {s});
        return;
      }
      case OpKind::MatMul: matmul(n); return;
      case OpKind::ReduceSum:
      case OpKind::ReduceMax:
      case OpKind::ReduceMin:
      case OpKind::ArgMax: reduce(n); return;
      case OpKind::Permute: {
        const Sharding& in = state(n.operands[0]);
        Sharding s = in;
        for (size_t d = 0; d < n.attrs.ints.size(); ++d)
          s.dims[d] = in.dims[static_cast<size_t>(n.attrs.ints[d])];
        Sharding operand = in;
        if (hinted(n.type.shape, &s))
          for (size_t d = 0; d < n.attrs.ints.size(); ++d)
            operand.dims[static_cast<size_t>(n.attrs.ints[d])] = s.dims[d];
        emit(n, {to_layout(n.operands[0], operand)}, s, n.attrs);
        return;
      }
      case OpKind::Expand: expand(n); return;
      case OpKind::Reshape: reshape(n); return;
      case OpKind::Slice:
      case OpKind::Concat:
      case OpKind::IndexSelect: along_whole_axis(n); return;
      case OpKind::Attention:
      case OpKind::AttentionGrad: attention(n); return;
      case OpKind::Scan: scan(n); return;
      case OpKind::Call:
        if (n.regions.size() == 1) {
          call(n);
          return;
        }
        break;
      default: break;
    }
    if (ir::has_trait(n.op, ir::kElementwise) && n.regions.empty()) {
      elementwise(n, given);
      return;
    }
    replicate_all(n);
  }

  // A local node of op n.op over `operands`, laid out as s.
  void emit(const Node& n, std::vector<Value> operands, const Sharding& s, ir::Attrs attrs) {
    const TensorType* given = nullptr;
    TensorType t;
    if (ir::has_trait(n.op, ir::kTypeGiven)) {
      t = {n.type.dtype, ir::local_shape(n.type.shape, s)};
      given = &t;
    }
    set(node_, {b_.make(n.op, operands, std::move(attrs), given)}, {s});
  }

  void copy(const Node& n) {
    std::vector<Value> xs;
    for (Value v : n.operands) xs.push_back(local(v));
    set(node_, {b_.make(n.op, xs, n.attrs, &n.type)}, {replicated(n.type.shape.rank())});
  }

  // Any op without a rule: replicated operands, the node as it is (its types are global).
  void replicate_all(const Node& n) {
    Node m = n;
    for (Value& v : m.operands) v = to_layout(v, replicated(g_.type(v).shape.rank()));
    const NodeId id = b_.add(std::move(m));
    std::vector<Value> lv;
    std::vector<Sharding> s;
    for (uint32_t k = 0; k < n.num_results(); ++k) {
      lv.push_back({id, k});
      s.push_back(replicated(n.result_type(k).shape.rank()));
    }
    set(node_, std::move(lv), std::move(s));
  }

  // The out dims' masks taken from operands aligned to the right (numpy broadcasting): the
  // first operand that splits a dim of full extent wins it; an axis is used once.
  std::vector<uint32_t> broadcast_dims(const Shape& out, std::span<const Value> xs,
                                       uint32_t used) const {
    std::vector<uint32_t> dims(out.size(), 0);
    for (Value v : xs) {
      const Shape& s = g_.type(v).shape;
      const size_t off = out.size() - s.size();
      for (size_t d = 0; d < s.size(); ++d) {
        const uint32_t m = state(v).dims[d];
        if (!m || dims[off + d] || s[d] != out[off + d] || (m & used)) continue;
        dims[off + d] = m;
        used |= m;
      }
    }
    return dims;
  }
  // The layout of operand v under an out layout of `dims` (broadcast dims replicated).
  Sharding operand_layout(Value v, const Shape& out, const std::vector<uint32_t>& dims,
                          uint32_t partial) const {
    const Shape& s = g_.type(v).shape;
    Sharding l = replicated(s.rank());
    const size_t off = out.size() - s.size();
    for (size_t d = 0; d < s.size(); ++d) l.dims[d] = s[d] == out[off + d] ? dims[off + d] : 0;
    l.partial = partial;
    return l;
  }

  void elementwise(const Node& n, const TensorType* given) {
    // Linear ops keep partial sums: a sum of partials, a partial scaled by a whole value.
    uint32_t keep = 0;
    const auto p = [&](size_t k) { return state(n.operands[k]).partial; };
    switch (n.op) {
      case OpKind::Neg: keep = p(0); break;
      case OpKind::Convert: keep = is_floating(n.type.dtype) ? p(0) : 0; break;
      case OpKind::Add:
      case OpKind::Sub: keep = p(0) == p(1) ? p(0) : 0; break;
      case OpKind::Mul: keep = !p(0) ? p(1) : !p(1) ? p(0) : 0; break;
      case OpKind::Div: keep = !p(1) ? p(0) : 0; break;
      default: break;
    }
    // An operand split over a partial sum's axes: resolve the sum into its layout (a
    // reduce_scatter) rather than gather the operand and keep the sum partial.
    for (Value v : n.operands)
      for (uint32_t m : state(v).dims) keep = (m & keep) ? 0 : keep;
    std::vector<uint32_t> dims = broadcast_dims(n.type.shape, n.operands, keep);
    if (!keep) {
      Sharding h = replicated(n.type.shape.rank());
      h.dims = dims;
      if (hinted(n.type.shape, &h)) dims = h.dims;
    }
    std::vector<Value> xs;
    for (size_t k = 0; k < n.operands.size(); ++k) {
      const Value v = n.operands[k];
      xs.push_back(to_layout(v, operand_layout(v, n.type.shape, dims, p(k) & keep)));
    }
    Sharding s = replicated(n.type.shape.rank());
    s.dims = dims;
    s.partial = keep;
    TensorType t;
    if (given) {
      t = {n.type.dtype, ir::local_shape(n.type.shape, s)};
      given = &t;
    }
    set(node_, {b_.make(n.op, xs, n.attrs, given)}, {s});
  }

  void reduce(const Node& n) {
    const Value x = n.operands[0];
    const Sharding& in = state(x);
    std::vector<int64_t> axes;
    if (n.op == OpKind::ArgMax)
      axes.push_back(n.attrs.i);
    else
      axes.assign(n.attrs.ints.begin(), n.attrs.ints.end());
    Sharding operand = in;
    uint32_t partial = in.partial;
    for (int64_t a : axes) {
      const size_t d = static_cast<size_t>(a);
      if (n.op == OpKind::ReduceSum) {
        partial |= in.dims[d];
      } else {
        operand.dims[d] = 0;
      }
    }
    if (n.op != OpKind::ReduceSum) {
      operand.partial = 0;
      partial = 0;
    }
    Sharding s = replicated(n.type.shape.rank());
    s.partial = partial;
    const bool keepdim = n.attrs.flag;
    for (size_t d = 0, o = 0; d < in.dims.size(); ++d) {
      const bool reduced =
          std::find(axes.begin(), axes.end(), static_cast<int64_t>(d)) != axes.end();
      if (reduced && !keepdim) continue;
      s.dims[o++] = reduced ? 0 : operand.dims[d];
    }
    emit(n, {to_layout(x, operand)}, s, n.attrs);
  }

  void matmul(const Node& n) {
    const Value a = n.operands[0], b = n.operands[1];
    const Shape &sa = g_.type(a).shape, &sb = g_.type(b).shape, &so = n.type.shape;
    if (sa.size() < 2 || sb.size() < 2) {
      replicate_all(n);
      return;
    }
    const size_t ra = sa.size(), rb = sb.size(), ro = so.size();
    const uint32_t ka = state(a).dims[ra - 1], kb = state(b).dims[rb - 2];
    uint32_t k = ka == kb ? ka : !kb ? ka : !ka ? kb : 0;
    if (!fits(sa[ra - 1], k)) k = 0;
    uint32_t m = state(a).dims[ra - 2] & ~k;
    uint32_t nn = state(b).dims[rb - 1] & ~k & ~m;
    if (!fits(so[ro - 2], m)) m = 0;
    if (!fits(so[ro - 1], nn)) nn = 0;
    // Batch dims: broadcast over the out's leading dims, each axis used once.
    const Shape batch(so.begin(), so.end() - 2);
    std::vector<uint32_t> bd(batch.size(), 0);
    uint32_t used = k | m | nn;
    for (Value v : {a, b}) {
      const Shape& s = g_.type(v).shape;
      const size_t off = batch.size() - (s.size() - 2);
      for (size_t d = 0; d + 2 < s.size(); ++d) {
        const uint32_t mask = state(v).dims[d];
        if (!mask || bd[off + d] || s[d] != batch[off + d] || (mask & used)) continue;
        bd[off + d] = mask;
        used |= mask;
      }
    }
    auto operand = [&](Value v, uint32_t row, uint32_t col) {
      const Shape& s = g_.type(v).shape;
      Sharding l = replicated(s.rank());
      const size_t off = batch.size() - (s.size() - 2);
      for (size_t d = 0; d + 2 < s.size(); ++d)
        l.dims[d] = s[d] == batch[off + d] ? bd[off + d] : 0;
      l.dims[s.size() - 2] = row;
      l.dims[s.size() - 1] = col;
      return l;
    };
    Sharding s = replicated(n.type.shape.rank());
    for (size_t d = 0; d < bd.size(); ++d) s.dims[d] = bd[d];
    s.dims[ro - 2] = m;
    s.dims[ro - 1] = nn;
    s.partial = k;
    emit(n, {to_layout(a, operand(a, m, k)), to_layout(b, operand(b, k, nn))}, s, n.attrs);
  }

  void expand(const Node& n) {
    const Value x = n.operands[0];
    const Shape& in = g_.type(x).shape;
    const Shape& out = n.type.shape;
    Sharding s = replicated(out.rank());
    s.partial = state(x).partial;
    const size_t off = out.size() - in.size();
    for (size_t d = 0; d < in.size(); ++d)
      if (in[d] == out[off + d]) s.dims[off + d] = state(x).dims[d];
    Sharding operand = operand_layout(x, out, s.dims, s.partial);
    ir::Attrs at = n.attrs;
    const Shape local = ir::local_shape(out, s);
    at.ints.assign(local.begin(), local.end());
    emit(n, {to_layout(x, operand)}, s, std::move(at));
  }

  // A split input dim carries to the output dim that starts at the same offset when it is the
  // major part of it (a merge) or it is the major part of the input dim (a split).
  void reshape(const Node& n) {
    const Value x = n.operands[0];
    const Shape& in = g_.type(x).shape;
    const Shape& out = n.type.shape;
    Sharding operand = state(x);
    Sharding s = replicated(out.rank());
    s.partial = operand.partial;
    std::vector<int64_t> pout(out.size() + 1, 1);
    for (size_t e = 0; e < out.size(); ++e) pout[e + 1] = pout[e] * out[e];
    int64_t pin = 1;
    for (size_t d = 0; d < in.size(); pin *= in[d], ++d) {
      const uint32_t mask = operand.dims[d];
      if (!mask) continue;
      bool carried = false;
      for (size_t e = 0; e < out.size() && !carried; ++e) {
        if (pout[e] != pin || out[e] <= 1 || s.dims[e]) continue;
        if ((out[e] % in[d] == 0 || in[d] % out[e] == 0) && fits(out[e], mask)) {
          s.dims[e] = mask;
          carried = true;
        }
      }
      if (!carried) operand.dims[d] = 0;
    }
    ir::Attrs at = n.attrs;
    const Shape local = ir::local_shape(out, s);
    at.ints.assign(local.begin(), local.end());
    emit(n, {to_layout(x, operand)}, s, std::move(at));
  }

  // slice, concat, index_select: the axis they work along is whole; other dims carry.
  void along_whole_axis(const Node& n) {
    const size_t axis = static_cast<size_t>(n.attrs.i);
    const size_t data = n.op == OpKind::IndexSelect ? 1 : n.operands.size();
    Sharding s = state(n.operands[0]);
    s.dims[axis] = 0;
    s.partial = 0;  // resolved whole, before a slice: one reduction of all the slices
    for (size_t k = 1; k < data; ++k)  // concat: a layout every operand takes
      for (size_t d = 0; d < s.dims.size(); ++d)
        if (!fits(g_.type(n.operands[k]).shape[d], s.dims[d])) s.dims[d] = 0;
    std::vector<Value> xs;
    for (size_t k = 0; k < n.operands.size(); ++k) {
      const Value v = n.operands[k];
      xs.push_back(to_layout(v, k < data ? s : replicated(g_.type(v).shape.rank())));
    }
    emit(n, std::move(xs), s, n.attrs);
  }

  // attention / attention_grad: the leading (batch, head) dims of q carry to every operand
  // and result; the sequence and feature dims are whole.
  void attention(const Node& n) {
    const Value q = n.operands[0];
    const Shape& sq = g_.type(q).shape;
    const size_t batch = sq.size() - 2;
    const size_t mask_at = n.op == OpKind::Attention ? 3 : 6;
    std::vector<uint32_t> bd(batch, 0);
    for (size_t d = 0; d < batch; ++d) bd[d] = state(q).dims[d];
    for (size_t k = 0; k < n.operands.size() && k != mask_at; ++k) {
      const Shape& s = g_.type(n.operands[k]).shape;
      for (size_t d = 0; d < batch; ++d)
        if (!fits(s[d], bd[d])) bd[d] = 0;
    }
    std::vector<Value> xs;
    for (size_t k = 0; k < n.operands.size(); ++k) {
      const Value v = n.operands[k];
      const Shape& s = g_.type(v).shape;
      Sharding l = replicated(s.rank());
      if (k == mask_at) {  // broadcast to [..., H, L, S] from the right
        const size_t off = sq.size() - s.size();
        for (size_t d = 0; d < s.size(); ++d)
          if (off + d < batch && s[d] == sq[off + d]) l.dims[d] = bd[off + d];
      } else {
        for (size_t d = 0; d < batch; ++d) l.dims[d] = bd[d];
      }
      xs.push_back(to_layout(v, l));
    }
    std::vector<Value> r = b_.make_region(n.op, xs, n.attrs, {});
    std::vector<Sharding> s;
    for (uint32_t k = 0; k < n.num_results(); ++k) {
      Sharding l = replicated(n.result_type(k).shape.rank());
      for (size_t d = 0; d < batch; ++d) l.dims[d] = bd[d];
      s.push_back(l);
    }
    set(node_, std::move(r), std::move(s));
  }

  // A body partitioned for its operands' layouts; its outputs' layouts as full shardings.
  std::pair<std::shared_ptr<const ir::Graph>, std::vector<Sharding>> body(
      const ir::Graph& g, std::vector<Sharding> params,
      std::vector<std::optional<Sharding>> forced) {
    Partitioned p = Partitioner(g, mesh_, std::move(params), std::move(forced)).run();
    std::vector<Sharding> outs;
    for (size_t k = 0; k < p.outputs.size(); ++k)
      outs.push_back(p.outputs[k] ? *p.outputs[k]
                                  : replicated(g.type(g.outputs()[k]).shape.rank()));
    for (InsertedCollective c : p.collectives) {
      c.node = node_;  // counted at the loop's node
      out_.collectives.push_back(c);
    }
    return {std::make_shared<const ir::Graph>(std::move(p.graph)), std::move(outs)};
  }

  // scan: each carry keeps one layout, its entry's or the body's, whichever moves fewer bytes
  // per iteration (docs/architecture.md); xs are sliced along a whole dim 0.
  void scan(const Node& n) {
    const size_t c = static_cast<size_t>(n.attrs.ints[0]), x = static_cast<size_t>(n.attrs.ints[1]);
    std::vector<Sharding> layouts;
    for (size_t k = 0; k < n.operands.size(); ++k) {
      Sharding l = state(n.operands[k]);
      l.partial = 0;
      if (k >= c && k < c + x) l.dims[0] = 0;
      layouts.push_back(l);
    }
    auto params_of = [&] {
      std::vector<Sharding> params{replicated(0)};  // the iteration index
      for (size_t k = 0; k < layouts.size(); ++k) {
        Sharding l = layouts[k];
        if (k >= c && k < c + x) l.dims.erase(l.dims.begin());
        params.push_back(l);
      }
      return params;
    };
    // The bytes a body partitioned for the carries' layouts moves per iteration, and the
    // layouts its carries leave with.
    auto probe = [&](std::vector<Sharding>* leave) {
      const size_t mark = out_.collectives.size();
      std::vector<std::optional<Sharding>> forced(layouts.begin(), layouts.begin() + c);
      auto [g, outs] = body(*n.regions[0], params_of(),
                            leave ? std::vector<std::optional<Sharding>>{} : std::move(forced));
      int64_t bytes = 0;
      for (size_t k = mark; k < out_.collectives.size(); ++k)
        if (out_.collectives[k].op != OpKind::MeshSlice) bytes += out_.collectives[k].bytes;
      out_.collectives.resize(mark);  // a probe: its collectives are not the body's
      if (leave)
        for (size_t k = 0; k < c; ++k) {
          (*leave)[k] = outs[k];
          (*leave)[k].partial = 0;
        }
      return bytes;
    };
    if (c > 0) {
      std::vector<Sharding> leave(c);
      probe(&leave);
      if (!std::equal(leave.begin(), leave.end(), layouts.begin())) {
        const int64_t entry_cost = probe(nullptr);
        const std::vector<Sharding> entry = layouts;
        std::copy(leave.begin(), leave.end(), layouts.begin());
        if (probe(nullptr) >= entry_cost) layouts = entry;
      }
    }
    std::vector<Value> xs;
    std::vector<std::optional<Sharding>> forced;
    for (size_t k = 0; k < n.operands.size(); ++k) {
      xs.push_back(to_layout(n.operands[k], layouts[k]));
      if (k < c) forced.push_back(layouts[k]);
    }
    auto [g, outs] = body(*n.regions[0], params_of(), std::move(forced));
    std::vector<Value> r = b_.make_region(n.op, xs, n.attrs, {g});
    std::vector<Sharding> s;
    for (size_t k = 0; k < outs.size(); ++k) {
      Sharding l = outs[k];
      if (k >= c) l.dims.insert(l.dims.begin(), 0u);
      s.push_back(l);
    }
    set(node_, std::move(r), std::move(s));
  }

  // call (assume_pure, compile's regions): the body partitioned for its operands' layouts.
  void call(const Node& n) {
    std::vector<Value> xs;
    std::vector<Sharding> params;
    for (Value v : n.operands) {
      Sharding l = state(v);
      l.partial = 0;
      xs.push_back(to_layout(v, l));
      params.push_back(l);
    }
    auto [g, outs] = body(*n.regions[0], std::move(params), {});
    set(node_, b_.make_region(n.op, xs, n.attrs, {g}), std::move(outs));
  }

  const ir::Graph& g_;
  Partitioned out_;
  ir::Builder b_;
  std::vector<int64_t> mesh_;
  std::vector<Sharding> params_;                 // a region's parameter layouts
  std::vector<std::optional<Sharding>> forced_;  // a region's output layouts, where fixed
  bool region_ = false;
  std::vector<std::optional<Sharding>> stored_;
  std::vector<std::vector<uint32_t>> hint_;  // find_hints: a layout wanted downstream
  std::vector<std::vector<Value>> local_;
  std::vector<std::vector<Sharding>> state_;
  NodeId node_ = 0;
};

}  // namespace

bool has_shardings(const ir::Graph& g) {
  for (NodeId id = 0; id < g.size(); ++id) {
    const Node& n = g.node(id);
    if (n.op == OpKind::Shard) return true;
    for (const auto& r : n.regions)
      if (has_shardings(*r)) return true;
  }
  return false;
}

Partitioned partition(const ir::Graph& g) { return Partitioner(g).run(); }

std::string describe(const Partitioned& p) {
  std::string out;
  for (NodeId id = 0; id < p.values.size(); ++id)
    if (p.values[id]) out += detail::str_cat("%", id, ": ", ir::to_string(*p.values[id]), "\n");
  for (const InsertedCollective& c : p.collectives)
    out += detail::str_cat(ir::op_name(c.op), " over mesh axes mask ", c.group, ": ", c.bytes,
                           " bytes per rank (for %", c.node, ")\n");
  return out;
}

}  // namespace loom::passes
