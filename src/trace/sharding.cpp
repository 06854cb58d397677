// mark_sharding and its companions (loom/trace/sharding.h): specs checked and encoded into
// shard nodes; the partitioner (src/passes/partition.cpp) does the rest when a graph runs.
#include "loom/trace/sharding.h"

#include <algorithm>

#include "loom/core/communicator.h"
#include "loom/ir/sharding.h"
#include "loom/trace/autograd.h"
#include "trace/ops_impl.h"

namespace loom::dist {

namespace {

using loom::detail::str_cat;
using loom::detail::TraceContext;

std::string axes_text(const Mesh& m) {
  std::string s = "(";
  for (size_t a = 0; a < m.shape().size(); ++a) {
    if (a) s += ", ";
    s += m.axis_names()[a].empty() ? std::to_string(a) : "'" + m.axis_names()[a] + "'";
    s += ": " + std::to_string(m.shape()[a]);
  }
  return s + ")";
}

Tensor record_shard(const Tensor& t, const ir::Sharding& s, bool stored) {
  loom::detail::OpRecord rec;
  ir::Value v = rec.ctx.value_of(t);
  return rec.ctx.wrap(rec.b().make(ir::OpKind::Shard, std::span<const ir::Value>(&v, 1),
                                   ir::encode_sharding(s, stored)));
}

ir::Sharding resolve(const Tensor& t, const Mesh& mesh, const ShardSpec& spec) {
  const char* op = "mark_sharding";
  const TensorType& type = loom::detail::type_of(t, op);
  LOOM_CHECK_T(ShapeError, static_cast<int64_t>(spec.size()) == type.shape.rank(), "[", op,
               "] the spec has ", spec.size(), " entries but the tensor ", type, " has ",
               type.shape.rank(), " dims: give one per dim (None/empty: replicated)");
  Communicator* c = current();
  const int64_t world = c ? c->size() : 1;
  if (mesh.size() != world)
    throw DistError(str_cat("[", op, "] the mesh ", axes_text(mesh), " holds ", mesh.size(),
                            mesh.size() == 1 ? " rank" : " ranks", " but the world has ", world,
                            c ? ""
                              : " (no communicator: call loom::dist::init(), in Python "
                                "loom.distributed.init(), in each rank loom-launch started)"));
  ir::Sharding s;
  s.mesh = mesh.shape();
  uint32_t used = 0;
  for (size_t d = 0; d < spec.size(); ++d) {
    uint32_t mask = 0;
    int last = -1;
    for (const MeshAxis& ax : spec[d]) {
      int a = -1;
      if (const int* i = std::get_if<int>(&ax)) {
        a = *i;
        LOOM_CHECK_T(ShapeError, a >= 0 && a < static_cast<int>(mesh.shape().size()), "[", op,
                     "] dim ", d, " names mesh axis ", a, ", but the mesh has axes ",
                     axes_text(mesh));
      } else {
        a = mesh.axis(std::get<std::string>(ax));
      }
      LOOM_CHECK_T(ShapeError, !(used >> a & 1u), "[", op, "] mesh axis ", a,
                   " is used twice in the spec (a mesh axis splits at most one dim)");
      LOOM_CHECK_T(ShapeError, a > last, "[", op, "] dim ", d,
                   "'s axes must be given in mesh order (", axes_text(mesh), ")");
      last = a;
      used |= 1u << a;
      mask |= 1u << a;
    }
    const int64_t n = ir::group_size(s.mesh, mask);
    LOOM_CHECK_T(ShapeError, type.shape[d] % n == 0 && (type.shape[d] > 0 || n == 1), "[", op,
                 "] dim ", d, " of ", type, " (", type.shape[d], ") does not split evenly into ", n,
                 " blocks over mesh ", axes_text(mesh), " (loom does not pad: make the dim a ",
                 "multiple of ", n, ")");
    s.dims.push_back(mask);
  }
  return s;
}

}  // namespace

Mesh::Mesh(std::vector<int64_t> shape, std::vector<std::string> names)
    : shape_(std::move(shape)), names_(std::move(names)) {
  LOOM_CHECK_T(ShapeError, !shape_.empty() && shape_.size() <= 16,
               "[Mesh] expected 1 to 16 axes, got ", shape_.size());
  int64_t n = 1;
  for (int64_t m : shape_)
    LOOM_CHECK_T(ShapeError, m >= 1 && !__builtin_mul_overflow(n, m, &n) && n <= (int64_t{1} << 24),
                 "[Mesh] axis extents must be at least 1 and hold at most 2^24 ranks, got ", m);
  if (names_.empty()) names_.assign(shape_.size(), "");
  LOOM_CHECK_T(ShapeError, names_.size() == shape_.size(), "[Mesh] ", shape_.size(), " axes but ",
               names_.size(), " names");
  for (size_t a = 0; a < names_.size(); ++a)
    for (size_t b = 0; b < a; ++b)
      LOOM_CHECK_T(ShapeError, names_[a].empty() || names_[a] != names_[b], "[Mesh] axis name '",
                   names_[a], "' given twice");
}

int64_t Mesh::size() const {
  int64_t n = 1;
  for (int64_t m : shape_) n *= m;
  return n;
}

int Mesh::axis(const std::string& name) const {
  for (size_t a = 0; a < names_.size(); ++a)
    if (names_[a] == name) return static_cast<int>(a);
  throw ShapeError(str_cat("[mark_sharding] the mesh has no axis '", name, "'; its axes are ",
                           axes_text(*this)));
}

void mark_sharding(const Tensor& t, const Mesh& mesh, const ShardSpec& spec) {
  const ir::Sharding s = resolve(t, mesh, spec);
  TraceContext& ctx = TraceContext::get();
  loom::detail::TensorImpl& impl = *t.impl();
  if (ctx.current_scope() != 0 || (impl.pending() && !impl.requires_grad)) {
    Tensor a = record_shard(t, s, false);
    ctx.rebind(impl, ctx.value_of(a));  // an annotation of the value, in place
    return;
  }
  if (impl.pending()) loom::materialize({t});  // a leaf (a parameter): its data is resharded
  if (impl.sharding ? *impl.sharding == s : s.replicated()) return;
  // Materialized data: resharded now, each rank keeping its block (a graph of its own, which
  // sharding_report does not tell: it tells the program's).
  NoGradGuard g;
  const auto report = ctx.last_partition();
  Tensor r = record_shard(t, s, false);
  loom::materialize({r});
  ctx.note_partition(report);
  impl.buffer = r.impl()->buffer;
  impl.sharding = r.impl()->sharding;
  impl.data_epoch = 0;  // its data node is the old buffer's
}

std::optional<std::string> sharding_of(const Tensor& t) {
  const loom::detail::TensorImpl& impl = *t.impl();
  if (!impl.pending()) {
    if (!impl.sharding) return std::nullopt;
    return ir::to_string(*impl.sharding);
  }
  TraceContext& ctx = TraceContext::get();
  if (impl.scope != 0 || impl.value.node >= ctx.graph().size()) return std::nullopt;
  const ir::Node& n = ctx.graph().node(impl.value.node);
  if (n.op != ir::OpKind::Shard) return std::nullopt;
  const ir::Sharding s = ir::decode_sharding(n.attrs, impl.type.shape.rank());
  if (s.replicated()) return std::nullopt;
  return ir::to_string(s);
}

Tensor full(const Tensor& t) {
  loom::detail::type_of(t, "full");
  if (t.impl()->pending()) loom::materialize({t});
  const auto& s = t.impl()->sharding;
  if (!s) return t;
  ir::Sharding whole;
  whole.mesh = s->mesh;
  whole.dims.assign(s->dims.size(), 0);
  NoGradGuard g;
  TraceContext& ctx = TraceContext::get();
  const auto report = ctx.last_partition();
  Tensor r = record_shard(t, whole, false);
  loom::materialize({r});
  ctx.note_partition(report);
  return r;
}

Tensor from_local(const Tensor& piece, const Mesh& mesh, const ShardSpec& spec) {
  const TensorType& pt = loom::detail::type_of(piece, "from_local");
  LOOM_CHECK_T(ShapeError, static_cast<int64_t>(spec.size()) == pt.shape.rank(),
               "[from_local] the spec has ", spec.size(), " entries but the piece ", pt, " has ",
               pt.shape.rank(), " dims");
  // The global shape first (resolve checks the spec against it), then the block.
  Shape global = pt.shape;
  for (size_t d = 0; d < spec.size(); ++d) {
    uint32_t mask = 0;
    for (const MeshAxis& ax : spec[d]) {
      const int* i = std::get_if<int>(&ax);
      const int a = i ? *i : mesh.axis(std::get<std::string>(ax));
      LOOM_CHECK_T(ShapeError, a >= 0 && a < static_cast<int>(mesh.shape().size()),
                   "[from_local] dim ", d, " names mesh axis ", a, ", but the mesh has axes ",
                   axes_text(mesh));
      mask |= 1u << a;
    }
    global[d] *= ir::group_size(mesh.shape(), mask);
  }
  Tensor g = zeros(global, pt.dtype);
  const ir::Sharding s = resolve(g, mesh, spec);
  // Every rank's piece of one type, or the global tensor is no tensor: one exchange says which.
  if (dist::Communicator* c = dist::current(); c && c->size() > 1) {
    const std::string mine = loom::detail::str_cat(pt);
    const std::vector<std::string> all = c->exchange(mine);
    for (size_t r = 0; r < all.size(); ++r)
      LOOM_CHECK_T(DistError, all[r] == all[0], "[from_local] the ranks' pieces differ: rank 0 ",
                   "passed ", all[0], ", rank ", r, " ", all[r],
                   "; every rank passes a piece of one shape and dtype");
  }
  loom::materialize({piece});
  auto impl = loom::detail::new_tensor_impl();
  impl->type = {pt.dtype, global};
  impl->buffer = piece.impl()->buffer;
  if (!s.replicated()) impl->sharding = std::make_shared<ir::Sharding>(s);
  return Tensor(std::move(impl));
}

std::string sharding_report() {
  const auto& p = TraceContext::get().last_partition();
  return p ? p->report : "";
}

}  // namespace loom::dist
