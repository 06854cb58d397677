// scan, while_loop, fori_loop and assume_pure: bodies traced in their own scope, closed into
// a region (its parameters: the explicit ones, then what the body captured), and run by one
// scan, while or call node whose operands supply them.
#include "loom/trace/control_flow.h"

#include <cstring>
#include <mutex>
#include <unordered_map>

#include "loom/core/communicator.h"
#include "loom/core/config.h"
#include "loom/core/hash.h"
#include "loom/runtime/sync.h"
#include "loom/trace/autograd.h"
#include "trace/context.h"

namespace loom::detail {

namespace {

std::string where_text(const Site& site) { return site_text(site.api, site.role, site.loc); }

// A closed scope: its graph, explicit parameters, captures and outputs.
struct Traced {
  std::shared_ptr<ir::Graph> graph;
  std::vector<ir::Value> params;
  std::vector<Capture> captures;
  ir::Value index{kNoNode, 0};
  bool lazy_index = false;
  std::vector<ir::Value> outs;
  std::vector<TensorType> out_types;
  std::vector<TraceSite> sites;  // of the body's ops that can fail at run time
};

// Pops the scope if the traced function throws.
struct ScopeGuard {
  TraceContext& ctx;
  bool armed = true;
  ~ScopeGuard() {
    if (armed) ctx.pop_scope();
  }
};

Traced trace(ScopeKind kind, const Site& site, bool with_index,
             const std::vector<TensorType>& types, const FlatFn& fn) {
  TraceContext& ctx = TraceContext::get();
  Scope& scope = ctx.push_scope(kind, site.api, site.role, site.loc, with_index);
  ScopeGuard guard{ctx};
  std::vector<Tensor> params;
  params.reserve(types.size() + 1);
  if (with_index) params.push_back(ctx.wrap(scope.index));
  for (const TensorType& t : types) {
    ir::Value p = scope.builder->parameter(t);
    scope.params.push_back(p);
    params.push_back(ctx.wrap(p));
  }
  std::vector<Tensor> outs = fn(params);
  Traced r;
  for (size_t k = 0; k < outs.size(); ++k) {
    LOOM_CHECK_T(TraceError, outs[k].defined(), "[", site.api, "] output ", k, " of ",
                 where_text(site), " is an undefined (default-constructed) Tensor");
    r.outs.push_back(ctx.value_of(outs[k]));  // captures outside tensors it returns
  }
  guard.armed = false;
  Scope s = ctx.pop_scope();
  r.graph = s.graph;
  r.params = std::move(s.params);
  r.captures = std::move(s.captures);
  r.index = s.index;
  r.lazy_index = s.lazy_index;
  r.sites = std::move(s.sites);
  for (ir::Value v : r.outs) r.out_types.push_back(r.graph->type(v));
  runtime::count_body_traced();
  return r;
}

// One parameter of a finished region: a parameter of the traced graph, or (node kNoNode) a
// fresh one the body does not use (while: the other region's captures).
struct Slot {
  ir::Value src{kNoNode, 0};
  TensorType type;
};

// The region of a traced body: parameters exactly `plan`, then the nodes the outputs need,
// in their traced order. `count_output`: also return plan[counter] + 1 (while's hidden
// iteration counter).
std::shared_ptr<const ir::Graph> finalize(const Traced& t, const std::vector<Slot>& plan,
                                          int counter = -1) {
  const ir::Graph& src = *t.graph;
  std::vector<uint8_t> live(src.size(), 0);
  for (ir::Value v : t.outs) live[v.node] = 1;
  for (size_t id = src.size(); id-- > 0;)
    if (live[id])
      for (ir::Value v : src.node(static_cast<ir::NodeId>(id)).operands) live[v.node] = 1;
  auto g = std::make_shared<ir::Graph>();
  std::vector<ir::NodeId> remap(src.size(), kNoNode);
  std::vector<ir::NodeId> slot_node;
  for (size_t k = 0; k < plan.size(); ++k) {
    ir::Node p;
    p.op = ir::OpKind::Parameter;
    p.type = plan[k].type;
    p.attrs.i = static_cast<int64_t>(k);
    slot_node.push_back(g->add(std::move(p)));
    if (plan[k].src.node != kNoNode) remap[plan[k].src.node] = slot_node.back();
  }
  for (size_t id = 0; id < src.size(); ++id) {
    const ir::Node& n = src.node(static_cast<ir::NodeId>(id));
    if (!live[id] || n.op == ir::OpKind::Parameter) continue;
    ir::Node copy = n;
    for (ir::Value& v : copy.operands) {
      LOOM_ASSERT(remap[v.node] != kNoNode);
      v.node = remap[v.node];
    }
    remap[id] = g->add(std::move(copy));
  }
  for (ir::Value v : t.outs) {
    LOOM_ASSERT(remap[v.node] != kNoNode);
    g->outputs().push_back({remap[v.node], v.index});
  }
  if (counter >= 0) {
    ir::Builder b(*g, false);
    ir::Value c{slot_node[counter], 0};
    g->outputs().push_back(b.binary(ir::OpKind::Add, c, b.constant(1, DType::Int64)));
  }
  return g;
}

TensorType capture_type(const Traced& t, const Capture& c) { return t.graph->type(c.param); }

// The operand that supplies a capture, in the (now innermost) enclosing scope.
ir::Value capture_operand(TraceContext& ctx, const Capture& c) {
  switch (c.kind) {
    case Capture::Impl: return ctx.value_of(Tensor(c.impl));
    case Capture::Scalar: return ctx.scalar(c.scalar, c.dtype);
    case Capture::Rng: return ctx.next_rng_key();
  }
  return {};
}

std::vector<Tensor> wrap_all(TraceContext& ctx, const std::vector<ir::Value>& vs, size_t n) {
  std::vector<Tensor> out;
  out.reserve(n);
  TraceContext::CompactionHold hold(ctx);
  for (size_t k = 0; k < n; ++k) out.push_back(ctx.wrap(vs[k]));
  return out;
}

void check_leaves(const Site& site, const std::vector<Tensor>& leaves,
                  const std::vector<std::string>& paths) {
  for (size_t k = 0; k < leaves.size(); ++k)
    LOOM_CHECK_T(TraceError, leaves[k].defined(), "[", site.api, "] ", paths[k],
                 " is an undefined (default-constructed) Tensor");
}

// The body must give back each carried leaf with its type.
void check_carried(const Site& site, const std::vector<Tensor>& init,
                   const std::vector<std::string>& paths, const Traced& t) {
  for (size_t k = 0; k < init.size(); ++k) {
    const TensorType before{init[k].dtype(), init[k].shape()};
    const TensorType& after = t.out_types[k];
    LOOM_CHECK_T(DTypeError, before.dtype == after.dtype, "[", site.api, "] ", where_text(site),
                 " changed the dtype of ", paths[k], ": it enters as ", before,
                 " and the body returned ", after, " (convert it inside the body)");
    LOOM_CHECK_T(ShapeError, before.shape == after.shape, "[", site.api, "] ", where_text(site),
                 " changed the shape of ", paths[k], ": it enters as ", before,
                 " and the body returned ", after);
  }
}

}  // namespace

struct Body {
  std::shared_ptr<const ir::Graph> region;  // parameters: the argument leaves, then captures
  std::vector<Capture> captures;
  size_t num_outputs = 0;
};

void structure_changed(const Site& site, const std::string& what, const std::string& before,
                       const std::string& after) {
  throw TraceError(str_cat("[", site.api, "] ", where_text(site), " changed the structure of the ",
                           what, ": it enters as ", before, " and the body returned ", after));
}

// ---- scan ------------------------------------------------------------------------------

std::vector<Tensor> scan_flat(const Site& site, const ScanOptions& opts, const FlatFn& fn,
                              const std::vector<Tensor>& init,
                              const std::vector<std::string>& init_paths,
                              const std::vector<Tensor>& xs,
                              const std::vector<std::string>& xs_paths) {
  check_leaves(site, init, init_paths);
  check_leaves(site, xs, xs_paths);
  int64_t length = opts.length;
  for (size_t k = 0; k < xs.size(); ++k) {
    LOOM_CHECK_T(ShapeError, xs[k].dim() >= 1, "[", site.api, "] ", xs_paths[k], " is ",
                 TensorType{xs[k].dtype(), xs[k].shape()},
                 ": every xs leaf needs a leading dim to scan over");
    LOOM_CHECK_T(ShapeError, xs[k].size(0) == xs[0].size(0), "[", site.api,
                 "] the xs leaves differ in their leading dim: ", xs_paths[0], " has ",
                 xs[0].size(0), " (", TensorType{xs[0].dtype(), xs[0].shape()}, ") but ",
                 xs_paths[k], " has ", xs[k].size(0), " (",
                 TensorType{xs[k].dtype(), xs[k].shape()}, ")");
  }
  if (!xs.empty()) {
    LOOM_CHECK_T(ShapeError, opts.length < 0 || opts.length == xs[0].size(0), "[", site.api,
                 "] length = ", opts.length, " but the xs leaves have leading dim ", xs[0].size(0));
    length = xs[0].size(0);
  }
  LOOM_CHECK_T(ShapeError, length >= 0, "[", site.api,
               "] xs has no tensors: pass the trip count as ScanOptions::length");
  std::vector<TensorType> types;
  types.reserve(init.size() + xs.size());
  for (const Tensor& t : init) types.push_back({t.dtype(), t.shape()});
  for (const Tensor& x : xs) {
    Shape s(x.shape().begin() + 1, x.shape().end());
    types.push_back({x.dtype(), std::move(s)});
  }
  Traced t = trace(ScopeKind::Loop, site, true, types, fn);
  LOOM_ASSERT(t.outs.size() >= init.size());
  check_carried(site, init, init_paths, t);
  std::vector<Slot> plan;
  plan.reserve(t.params.size() + t.captures.size());
  for (ir::Value p : t.params) plan.push_back({p, t.graph->type(p)});
  for (const Capture& c : t.captures) plan.push_back({c.param, capture_type(t, c)});
  std::shared_ptr<const ir::Graph> region = finalize(t, plan);

  TraceContext& ctx = TraceContext::get();
  std::vector<ir::Value> operands;
  operands.reserve(init.size() + xs.size() + t.captures.size());
  for (const Tensor& x : init) operands.push_back(ctx.value_of(x));
  for (const Tensor& x : xs) operands.push_back(ctx.value_of(x));
  for (const Capture& c : t.captures) operands.push_back(capture_operand(ctx, c));
  ir::Attrs a;
  a.ints = {static_cast<int64_t>(init.size()), static_cast<int64_t>(xs.size())};
  a.i = length;
  a.flag = opts.reverse;
  a.f = opts.remat ? 1 : 0;
  std::vector<ir::Value> r = ctx.builder().make_region(ir::OpKind::Scan, operands, a, {region});
  if (!r.empty()) ctx.note_body_sites(r[0], t.sites);
  return wrap_all(ctx, r, r.size());
}

// ---- while_loop ------------------------------------------------------------------------

void note_while_site(const std::shared_ptr<const ir::Graph>& body, const Site& site);

std::vector<Tensor> while_flat(const Site& site, const FlatFn& cond, const FlatFn& body,
                               const std::vector<Tensor>& carried,
                               const std::vector<std::string>& paths) {
  check_leaves(site, carried, paths);
  LOOM_CHECK_T(TraceError, !carried.empty(), "[", site.api, "] carry at least one tensor");
  std::vector<TensorType> types;
  for (const Tensor& t : carried) types.push_back({t.dtype(), t.shape()});
  const Site cond_site{site.api, "cond", site.loc};
  Traced tc = trace(ScopeKind::Loop, cond_site, false, types, cond);
  const TensorType bool_scalar{DType::Bool, Shape{}};
  LOOM_CHECK_T(DTypeError, tc.out_types.size() == 1 && tc.out_types[0] == bool_scalar, "[",
               site.api, "] ", where_text(cond_site), " must return a bool scalar (bool[]), got ",
               tc.out_types.empty() ? std::string("nothing") : tc.out_types[0].str(),
               " (compare with <, >, ==, ... and reduce to one element)");
  Traced tb = trace(ScopeKind::Loop, site, false, types, body);
  LOOM_ASSERT(tb.outs.size() == carried.size());
  check_carried(site, carried, paths, tb);

  // Both regions take all operands: the carried values, the hidden counter (when a random
  // op needs the iteration), then the captures of either region.
  const bool counter = tc.lazy_index || tb.lazy_index;
  std::vector<Capture> caps;
  std::vector<TensorType> cap_types;
  std::vector<size_t> body_pos;
  for (const Capture& c : tc.captures) {
    caps.push_back(c);
    cap_types.push_back(capture_type(tc, c));
  }
  for (const Capture& c : tb.captures) {
    size_t j = caps.size();
    if (c.kind == Capture::Impl)
      for (size_t i = 0; i < tc.captures.size(); ++i)
        if (caps[i].kind == Capture::Impl && caps[i].impl == c.impl) j = i;
    if (j == caps.size()) {
      caps.push_back(c);
      cap_types.push_back(capture_type(tb, c));
    }
    body_pos.push_back(j);
  }
  const TensorType i64{DType::Int64, {}};
  auto plan_of = [&](const Traced& t, bool is_body) {
    std::vector<Slot> plan;
    for (ir::Value p : t.params) plan.push_back({p, t.graph->type(p)});
    if (counter) plan.push_back({t.lazy_index ? t.index : ir::Value{kNoNode, 0}, i64});
    size_t base = plan.size();
    for (const TensorType& ty : cap_types) plan.push_back({ir::Value{kNoNode, 0}, ty});
    for (size_t i = 0; i < t.captures.size(); ++i)
      plan[base + (is_body ? body_pos[i] : i)].src = t.captures[i].param;
    return plan;
  };
  const int n = static_cast<int>(carried.size());
  std::shared_ptr<const ir::Graph> cond_region = finalize(tc, plan_of(tc, false));
  std::shared_ptr<const ir::Graph> body_region = finalize(tb, plan_of(tb, true), counter ? n : -1);

  TraceContext& ctx = TraceContext::get();
  std::vector<ir::Value> operands;
  for (const Tensor& x : carried) operands.push_back(ctx.value_of(x));
  if (counter) operands.push_back(ctx.constant(0, DType::Int64));
  for (const Capture& c : caps) operands.push_back(capture_operand(ctx, c));
  ir::Attrs a;
  a.ints = {n + (counter ? 1 : 0)};
  std::vector<ir::Value> r =
      ctx.builder().make_region(ir::OpKind::While, operands, a, {cond_region, body_region});
  note_while_site(body_region, site);
  ctx.note_body_sites(r[0], tc.sites);
  ctx.note_body_sites(r[0], tb.sites);
  return wrap_all(ctx, r, carried.size());
}

namespace {
struct WhileSite {
  std::weak_ptr<const ir::Graph> body;
  std::string where;
};
// Per thread (the pending graph is): the call site of each while loop's body region, for the
// gradient error. Regions are immutable and outlive compaction, so they key it.
thread_local std::unordered_map<const ir::Graph*, WhileSite> while_sites;
}  // namespace

void note_while_site(const std::shared_ptr<const ir::Graph>& body, const Site& site) {
  if (while_sites.size() > 1024)
    std::erase_if(while_sites, [](const auto& e) { return e.second.body.expired(); });
  while_sites[body.get()] = {
      body, str_cat(site.api, " called at ", file_line(site.loc), " (in ", site.loc.function, ")")};
}

std::string while_site(const ir::Graph* body) {
  auto it = while_sites.find(body);
  return it == while_sites.end() || it->second.body.expired() ? std::string("a while_loop")
                                                              : it->second.where;
}

// ---- fori_loop -------------------------------------------------------------------------

bool fori_static(const LoopBound& lower, const LoopBound& upper) {
  const std::pair<const LoopBound*, const char*> bounds[] = {{&lower, "lower"}, {&upper, "upper"}};
  for (auto [b, name] : bounds) {
    LOOM_CHECK_T(DTypeError, !b->is_float, "[fori_loop] the ", name,
                 " bound must be an integer, got the floating-point number ", b->fvalue);
    if (b->tensor.defined()) {
      TensorType t{b->tensor.dtype(), b->tensor.shape()};
      LOOM_CHECK_T(
          DTypeError, t.shape.empty() && (t.dtype == DType::Int32 || t.dtype == DType::Int64),
          "[fori_loop] the ", name, " bound must be an integer scalar (i32[] or i64[]), got ", t);
    }
  }
  return !lower.tensor.defined() && !upper.tensor.defined();
}

Tensor fori_index(const Tensor& index, const LoopBound& lower) {
  return lower.value == 0 ? index : index + lower.value;
}

// ---- assume_pure -----------------------------------------------------------------------

class PureCache {
 public:
  struct Entry {
    CallSignature sig;
    std::shared_ptr<const Body> body;
    std::shared_ptr<const void> like;
  };
  PureOptions opts;
  CallSite loc{"", "", 0};
  std::mutex mu;
  std::unordered_multimap<uint64_t, Entry> entries;
};

std::shared_ptr<PureCache> make_pure_cache(const PureOptions& opts, CallSite loc) {
  auto c = std::make_shared<PureCache>();
  c->opts = opts;
  c->loc = loc;
  return c;
}

namespace {

std::shared_ptr<const Body> pure_body(const Traced& t) {
  auto b = std::make_shared<Body>();
  std::vector<Slot> plan;
  for (ir::Value p : t.params) plan.push_back({p, t.graph->type(p)});
  for (const Capture& c : t.captures) plan.push_back({c.param, capture_type(t, c)});
  b->region = finalize(t, plan);
  b->captures = t.captures;
  b->num_outputs = t.outs.size();
  return b;
}

bool same_bytes(const TensorImpl& a, const TensorImpl& b) {
  if (a.pending() || b.pending() || !(a.type == b.type)) return false;
  const size_t n = static_cast<size_t>(a.type.nbytes());
  return n == 0 || std::memcmp(a.buffer.data(), b.buffer.data(), n) == 0;
}

// LOOM_CHECK_PURITY: the fresh trace must equal the cached one, captures included.
void check_pure(const Site& site, const Body& cached, const Body& fresh) {
  if (!ir::structurally_equal(*cached.region, *fresh.region)) {
    std::string diff = ir::first_difference(*cached.region, *fresh.region).str();
    throw TraceError(str_cat("[assume_pure] ", where_text(site),
                             " traced differently on a cache hit, so the cached trace would give "
                             "wrong results: it is not pure (it reads host state that is not a "
                             "static argument). First difference: ",
                             diff.empty() ? std::string("the graphs differ in structure") : diff));
  }
  for (size_t k = 0; k < cached.captures.size(); ++k) {
    const Capture &a = cached.captures[k], &b = fresh.captures[k];
    bool same = a.kind == b.kind &&
                (a.kind != Capture::Impl || a.impl == b.impl || same_bytes(*a.impl, *b.impl));
    LOOM_CHECK_T(TraceError, same, "[assume_pure] ", where_text(site),
                 " read a different outside tensor (", a.impl ? a.impl->type.str() : "a key",
                 ") on a cache hit than when it was traced: pass it as an argument");
  }
}

}  // namespace

// Recompile explanations (loom/runtime/diagnostics.h): a miss on a cache that holds an entry
// with the same argument structure says which static argument, leaf type or requires_grad
// differs from the closest entry, naming leaves by tree path.
void note_call_miss(const std::string& where, const std::vector<const CallSignature*>& earlier,
                    const CallSignature& sig) {
  std::vector<std::string> diffs;
  std::string before, after, path;
  bool static_diff = false;
  size_t best_n = SIZE_MAX;
  std::vector<std::string> paths;
  for (const CallSignature* e : earlier) {
    if (e->signature != sig.signature || e->statics.size() != sig.statics.size() ||
        e->types.size() != sig.types.size())
      continue;
    if (paths.empty()) {
      paths = sig.paths;  // recorded by call_key
      if (paths.size() != sig.types.size()) {
        paths.clear();
        for (size_t k = 0; k < sig.types.size(); ++k) paths.push_back(str_cat("tensor leaf ", k));
      }
    }
    std::vector<std::string> d;
    std::string b, a, p;
    bool sd = false;
    for (size_t k = 0; k < sig.statics.size(); ++k) {
      const StaticArg &x = e->statics[k], &y = sig.statics[k];
      if (*x.type == *y.type && x.equal(x.value.get(), y.value.get())) continue;
      std::string old_v = x.print ? x.print(x.value.get()) : "(unprintable)";
      std::string new_v = y.print ? y.print(y.value.get()) : "(unprintable)";
      if (!sd) b = old_v, a = new_v;
      sd = true;
      d.push_back(str_cat("static argument ", y.arg, " changed: ", old_v, " -> ", new_v));
    }
    for (size_t k = 0; k < sig.types.size(); ++k) {
      const TensorType &x = e->types[k], &y = sig.types[k];
      if (x == y) continue;
      if (!sd && b.empty()) b = x.str(), a = y.str(), p = paths[k];
      d.push_back(paths[k] + " " + type_change(x, y));
    }
    for (size_t k = 0; k < sig.grads.size(); ++k) {
      if (e->grads[k] == sig.grads[k]) continue;
      d.push_back(str_cat(paths[k], " changed requires_grad: ", e->grads[k] ? "true" : "false",
                          " -> ", sig.grads[k] ? "true" : "false"));
    }
    if (!d.empty() && d.size() < best_n) {
      best_n = d.size();
      diffs = std::move(d);
      before = std::move(b);
      after = std::move(a);
      path = std::move(p);
      static_diff = sd;
    }
  }
  if (diffs.empty()) return;
  std::string msg = where + " re-traced: ";
  for (size_t k = 0; k < diffs.size() && k < 4; ++k) msg += (k ? "; " : "") + diffs[k];
  runtime::note_recompile_cause(
      static_diff ? RecompileReason::Kind::StaticArgument : RecompileReason::Kind::InputType,
      std::move(msg), std::move(before), std::move(after), std::move(path));
}

namespace {

void note_pure_miss(PureCache& cache, const CallSignature& sig) {
  std::vector<const CallSignature*> earlier;
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    for (const auto& [_, entry] : cache.entries) earlier.push_back(&entry.sig);
  }
  note_call_miss("assume_pure function at " + file_line(cache.loc), earlier, sig);
}

}  // namespace

namespace {

// The hash of call_signature(key) without building it (a cache hit builds no signature):
// the signature text (with the world size appended under a communicator: a body traced for
// one world size holds collectives of that size, and tests run groups of several sizes in one
// process), the statics' hashes, and each leaf's dtype, requires_grad and shape.
uint64_t call_hash(CallKey& key, const char* what) {
  if (const dist::Communicator* c = dist::current())
    key.signature += "|world=" + std::to_string(c->size());
  Hasher128 h;
  h.add_string(key.signature);
  for (const StaticArg& s : key.statics) h.add(s.hash);
  for (size_t k = 0; k < key.leaves.size(); ++k) {
    const Tensor& t = key.leaves[k];
    LOOM_CHECK_T(TraceError, t.defined(), "[", what, "] tensor argument ", k,
                 " is an undefined (default-constructed) Tensor");
    h.add(static_cast<uint64_t>(t.dtype()) | (uint64_t{t.requires_grad()} << 8));
    for (int64_t d : t.shape()) h.add(static_cast<uint64_t>(d));
  }
  return h.finish().lo;
}

bool same_statics(const std::vector<StaticArg>& a, const std::vector<StaticArg>& b) {
  if (a.size() != b.size()) return false;
  for (size_t k = 0; k < a.size(); ++k)
    if (!(*a[k].type == *b[k].type) || !a[k].equal(a[k].value.get(), b[k].value.get()))
      return false;
  return true;
}

// sig == call_signature(key), given their hashes are equal.
bool same_call(const CallSignature& sig, const CallKey& key) {
  if (sig.signature != key.signature || sig.types.size() != key.leaves.size()) return false;
  for (size_t k = 0; k < key.leaves.size(); ++k) {
    const Tensor& t = key.leaves[k];
    if (sig.types[k].dtype != t.dtype() || sig.grads[k] != t.requires_grad() ||
        !(sig.types[k].shape == t.shape()))
      return false;
  }
  return same_statics(sig.statics, key.statics);
}

CallSignature signature_of(CallKey& key, uint64_t hash) {
  CallSignature sig;
  sig.types.reserve(key.leaves.size());
  sig.grads.reserve(key.leaves.size());
  for (const Tensor& t : key.leaves) {
    sig.types.push_back({t.dtype(), t.shape()});
    sig.grads.push_back(t.requires_grad());
  }
  sig.signature = key.signature;
  sig.statics = std::move(key.statics);
  sig.hash = hash;
  return sig;
}

}  // namespace

bool CallSignature::operator==(const CallSignature& o) const {
  return hash == o.hash && signature == o.signature && types == o.types && grads == o.grads &&
         layouts == o.layouts && same_statics(statics, o.statics);
}

CallSignature call_signature(CallKey& key, const char* what) {
  const uint64_t hash = call_hash(key, what);
  std::vector<std::string> layouts;  // a compiled step binds the leaves' blocks: keyed by them
  bool any = false;
  for (const Tensor& t : key.leaves) any = any || (t.defined() && t.impl()->sharding);
  if (any)
    for (const Tensor& t : key.leaves)
      layouts.push_back(t.defined() && t.impl()->sharding ? ir::to_string(*t.impl()->sharding)
                                                          : "");
  CallSignature sig = signature_of(key, hash);
  sig.layouts = std::move(layouts);
  return sig;
}

std::vector<Tensor> pure_call(PureCache& cache, CallKey key, const FlatFn& fn,
                              std::shared_ptr<const void>* like) {
  const Site site{"assume_pure", "function", cache.loc};
  const uint64_t hash = call_hash(key, "assume_pure");
  std::shared_ptr<const Body> body;
  const std::vector<TensorType>* types = nullptr;
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    auto [lo, hi] = cache.entries.equal_range(hash);
    for (auto it = lo; it != hi && !body; ++it) {
      if (same_call(it->second.sig, key)) {
        body = it->second.body;
        *like = it->second.like;
        types = &it->second.sig.types;  // entries are never erased
      }
    }
  }
  if (body) {
    runtime::count_pure_hit();
    if (cache.opts.check_purity || config().check_purity) {
      std::shared_ptr<const Body> fresh =
          pure_body(trace(ScopeKind::Pure, site, false, *types, fn));
      check_pure(site, *body, *fresh);
    }
  } else {
    CallSignature sig = signature_of(key, hash);
    sig.paths = key.leaf_paths();
    note_pure_miss(cache, sig);
    body = pure_body(trace(ScopeKind::Pure, site, false, sig.types, fn));
    std::lock_guard<std::mutex> lock(cache.mu);
    cache.entries.emplace(hash, PureCache::Entry{std::move(sig), body, *like});
  }
  if (body->num_outputs == 0) return {};
  TraceContext& ctx = TraceContext::get();
  std::vector<ir::Value> operands;
  operands.reserve(key.leaves.size() + body->captures.size());
  for (const Tensor& t : key.leaves) operands.push_back(ctx.value_of(t));
  for (const Capture& c : body->captures) operands.push_back(capture_operand(ctx, c));
  std::vector<ir::Value> r =
      ctx.builder().make_region(ir::OpKind::Call, operands, ir::Attrs{}, {body->region});
  return wrap_all(ctx, r, r.size());
}

}  // namespace loom::detail

namespace loom {

using detail::Capture;
using detail::ScopeKind;
using detail::Site;
using detail::Slot;
using detail::Traced;

// One call node with two regions: fwd's trace (the arguments, fwd's captures, then bwd's
// captures as parameters it does not read) returning outputs and residuals, and bwd's trace
// (residuals, output adjoints, bwd's captures) returning one adjoint per argument.
std::vector<Tensor> CustomVjp::operator()(const std::vector<Tensor>& args) const {
  bool differentiated = false;
  for (size_t k = 0; k < args.size(); ++k) {
    LOOM_CHECK_T(TraceError, args[k].defined(), "[custom_vjp] argument ", k,
                 " is an undefined (default-constructed) Tensor");
    differentiated = differentiated || args[k].requires_grad();
  }
  // A traced body's parameters carry no requires_grad: its VJP is built later, from the IR.
  differentiated = differentiated || detail::TraceContext::get().in_scope();
  if (!differentiated || !grad_enabled()) return fn_(args);
  const Site fsite{"custom_vjp", "fwd", loc_}, bsite{"custom_vjp", "bwd", loc_};
  std::vector<TensorType> types;
  for (const Tensor& t : args) types.push_back({t.dtype(), t.shape()});
  size_t n_out = 0;
  Traced f = detail::trace(ScopeKind::Pure, fsite, false, types, [&](const std::vector<Tensor>& p) {
    auto [outs, res] = fwd_(p);
    LOOM_CHECK_T(TraceError, !outs.empty(), "[custom_vjp] fwd returned no outputs");
    n_out = outs.size();
    outs.insert(outs.end(), res.begin(), res.end());
    return outs;
  });
  auto check_captures = [&](const Traced& t, const char* role) {
    for (const Capture& c : t.captures)
      LOOM_CHECK_T(TraceError, c.kind != Capture::Impl || !c.impl->requires_grad, "[custom_vjp] ",
                   role, " reads a tensor ", t.graph->type(c.param),
                   " that requires grad from outside its arguments; pass it as an argument, ",
                   "so that bwd gives its gradient");
  };
  check_captures(f, "fwd");
  std::vector<TensorType> btypes(f.out_types.begin() + static_cast<std::ptrdiff_t>(n_out),
                                 f.out_types.end());
  btypes.insert(btypes.end(), f.out_types.begin(),
                f.out_types.begin() + static_cast<std::ptrdiff_t>(n_out));
  const size_t n_res = f.out_types.size() - n_out;
  Traced b =
      detail::trace(ScopeKind::Pure, bsite, false, btypes, [&](const std::vector<Tensor>& p) {
        std::vector<Tensor> res(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(n_res));
        std::vector<Tensor> gs(p.begin() + static_cast<std::ptrdiff_t>(n_res), p.end());
        std::vector<Tensor> grads = bwd_(res, gs);
        LOOM_CHECK_T(TraceError, grads.size() == args.size(), "[custom_vjp] bwd returned ",
                     grads.size(), " gradient(s) for ", args.size(), " argument(s)");
        for (size_t k = 0; k < grads.size(); ++k) {
          if (!grads[k].defined()) {
            grads[k] = zeros(types[k].shape, types[k].dtype);
            continue;
          }
          const TensorType got{grads[k].dtype(), grads[k].shape()};
          LOOM_CHECK_T(ShapeError, got.shape == types[k].shape, "[custom_vjp] bwd's gradient ", k,
                       " is ", got, " but argument ", k, " is ", types[k]);
          LOOM_CHECK_T(DTypeError, got.dtype == types[k].dtype, "[custom_vjp] bwd's gradient ", k,
                       " is ", got, " but argument ", k, " is ", types[k]);
        }
        return grads;
      });
  check_captures(b, "bwd");
  // fwd's region: its parameters, its captures, then bwd's captures (unread).
  std::vector<Slot> fplan, bplan;
  for (ir::Value p : f.params) fplan.push_back({p, f.graph->type(p)});
  for (const Capture& c : f.captures) fplan.push_back({c.param, detail::capture_type(f, c)});
  for (const Capture& c : b.captures)
    fplan.push_back({ir::Value{detail::kNoNode, 0}, b.graph->type(c.param)});
  for (ir::Value p : b.params) bplan.push_back({p, b.graph->type(p)});
  for (const Capture& c : b.captures) bplan.push_back({c.param, detail::capture_type(b, c)});
  detail::TraceContext& ctx = detail::TraceContext::get();
  std::vector<ir::Value> operands;
  for (const Tensor& t : args) operands.push_back(ctx.value_of(t));
  for (const Capture& c : f.captures) operands.push_back(detail::capture_operand(ctx, c));
  for (const Capture& c : b.captures) operands.push_back(detail::capture_operand(ctx, c));
  ir::Attrs a;
  a.ints = {static_cast<int64_t>(n_out), static_cast<int64_t>(args.size()),
            static_cast<int64_t>(b.captures.size())};
  std::vector<ir::Value> r = ctx.builder().make_region(
      ir::OpKind::Call, operands, a, {detail::finalize(f, fplan), detail::finalize(b, bplan)});
  return detail::wrap_all(ctx, r, n_out);
}

}  // namespace loom
