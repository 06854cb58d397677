// compile(step): the cuts around a step, full_graph, max_different_graphs, and trace_once's
// record and replay.
#include "loom/trace/compile.h"

#include <mutex>
#include <unordered_map>

#include "loom/runtime/diagnostics.h"
#include "loom/runtime/sync.h"
#include "trace/context.h"
#include "trace/ops_impl.h"

namespace loom::detail {

namespace {

// The closest earlier graph: the one whose IR text shares the longest prefix with g's.
std::string closest_difference(const std::vector<std::shared_ptr<const ir::Graph>>& earlier,
                               const ir::Graph& g) {
  const std::string text = ir::to_text(g);
  size_t best = 0, best_len = 0;
  for (size_t k = 0; k < earlier.size(); ++k) {
    std::string t = ir::to_text(*earlier[k]);
    size_t n = 0;
    while (n < t.size() && n < text.size() && t[n] == text[n]) ++n;
    if (n >= best_len) best = k, best_len = n;
  }
  return ir::first_difference(*earlier[best], g).str();
}

}  // namespace

class StepCache {
 public:
  struct Input {
    enum Kind { Arg, Owner, Baked, Rng, LeafGrad };
    Kind kind = Baked;
    size_t arg = 0;  // Arg: the argument; LeafGrad: the entry's grads[arg]
    std::shared_ptr<TensorImpl> owner;
    std::shared_ptr<const ir::Sharding> layout;  // Owner: its data's layout when traced
    Buffer baked;
  };
  struct Result {
    bool passthrough = false;  // a tensor the step did not compute: an argument or a capture
    size_t arg = SIZE_MAX;
    Tensor source;
    TensorType type;
    size_t output = 0;  // else: its output of the executable
  };
  // A leaf's grad the step resets or writes: a replay reads the leaf's grad of the call (not
  // the tensor it was when traced) and gives the leaf its new grad.
  struct Grad {
    std::shared_ptr<TensorImpl> leaf;
    enum Need { Any, Defined, Undefined } need = Any;  // its grad before the call, as traced
    TensorType before, after;
    size_t output = SIZE_MAX;  // its new grad; SIZE_MAX: none (reset by the step)
  };
  struct Entry {
    CallSignature sig;
    std::vector<Grad> grads;
    std::shared_ptr<const backend::Executable> exe;
    std::vector<Input> inputs;
    std::vector<Result> results;
    std::vector<std::shared_ptr<TensorImpl>> updated;
    std::vector<size_t> updated_output;  // each updated tensor's output of the executable
    std::shared_ptr<const void> like;
    std::shared_ptr<const runtime::PartitionInfo> partition;  // its outputs' layouts, if any
  };
  CompileOptions opts;
  std::string name;
  std::string before_name;  // names the pending work the cut before a call runs
  std::mutex mu;
  std::vector<Hash128> fingerprints;
  std::vector<std::shared_ptr<const ir::Graph>> graphs;
  // Shared: a replay holds its entry while another thread's record may grow the list.
  std::vector<std::shared_ptr<const Entry>> entries;
  std::vector<CallSignature> seen;  // without trace_once: the signatures traced so far
};

std::shared_ptr<StepCache> make_step_cache(CompileOptions opts, CallSite loc) {
  auto c = std::make_shared<StepCache>();
  c->name = opts.name.empty() ? "step at " + file_line(loc) : opts.name;
  c->before_name = c->name + " (work pending before the step)";
  LOOM_CHECK(opts.max_different_graphs >= 0, "[compile] max_different_graphs must be >= 0, got ",
             opts.max_different_graphs);
  c->opts = std::move(opts);
  return c;
}

namespace {

bool same_layout(const ir::Sharding* a, const ir::Sharding* b) {
  return a == b || (a && b && *a == *b);
}

// An entry binds the blocks of the tensors it reads: state whose layout the first step decided
// (an optimizer's moments take their gradients' layout) is a new entry, traced once more.
bool layouts_match(const StepCache::Entry& e) {
  for (const StepCache::Input& in : e.inputs)
    if (in.kind == StepCache::Input::Owner &&
        !same_layout(in.layout.get(), in.owner->sharding.get()))
      return false;
  return true;
}

// Whether each leaf's grad is there (or not) as when the entry was traced: accumulating into
// a grad and starting one are different graphs.
bool grads_match(const StepCache::Entry& e) {
  for (const StepCache::Grad& g : e.grads) {
    const Tensor& now = g.leaf->grad;
    if (g.need == StepCache::Grad::Undefined && now.defined()) return false;
    if (g.need == StepCache::Grad::Defined &&
        (!now.defined() || now.impl()->type != g.before || now.impl()->pending()))
      return false;
  }
  return true;
}

std::shared_ptr<const StepCache::Entry> find_entry(StepCache& c, const CallSignature& sig) {
  for (const auto& e : c.entries)
    if (e->sig == sig && layouts_match(*e) && grads_match(*e)) return e;
  return nullptr;
}

std::vector<Tensor> replay(TraceContext& ctx, const StepCache::Entry& e,
                           const std::vector<Tensor>& leaves) {
  std::vector<Buffer> inputs;
  std::vector<uint8_t> donated;
  inputs.reserve(e.inputs.size());
  for (const StepCache::Input& in : e.inputs) {
    switch (in.kind) {
      case StepCache::Input::Arg: inputs.push_back(leaves[in.arg].impl()->buffer); break;
      case StepCache::Input::Owner: inputs.push_back(in.owner->buffer); break;
      case StepCache::Input::Baked: inputs.push_back(in.baked); break;
      case StepCache::Input::Rng: inputs.push_back(ctx.next_rng_buffer()); break;
      case StepCache::Input::LeafGrad:
        inputs.push_back(e.grads[in.arg].leaf->grad.impl()->buffer);
        break;
    }
    bool updated = false;
    if (in.kind == StepCache::Input::Owner)
      for (auto& u : e.updated) updated = updated || u == in.owner;
    // The old value of a tensor the step overwrites, held only by it and by this call.
    donated.push_back(updated && inputs.back().use_count() == 2);
  }
  std::vector<Buffer> out = runtime::run_executable(*e.exe, inputs, donated);
  if (e.partition) ctx.note_partition(e.partition);  // sharding_report tells this step
  std::vector<Tensor> results;
  for (const StepCache::Result& r : e.results) {
    if (r.passthrough)
      results.push_back(r.arg != SIZE_MAX ? leaves[r.arg] : r.source);
    else
      results.push_back(from_buffer(out[r.output], r.type));
    if (!r.passthrough && e.partition && e.partition->outputs[r.output])
      results.back().impl()->sharding =
          std::make_shared<ir::Sharding>(*e.partition->outputs[r.output]);
  }
  for (size_t i = 0; i < e.updated.size(); ++i) {
    e.updated[i]->buffer = out[e.updated_output[i]];
    e.updated[i]->data_epoch = 0;
    const auto& layout = e.partition ? e.partition->outputs[e.updated_output[i]] : std::nullopt;
    e.updated[i]->sharding = layout ? std::make_shared<ir::Sharding>(*layout) : nullptr;
  }
  for (const StepCache::Grad& g : e.grads)
    g.leaf->grad = g.output == SIZE_MAX ? Tensor() : from_buffer(out[g.output], g.after);
  return results;
}

// Records the step just traced: the graph of its results and in-place updates, and where each
// input comes from on a replay.
void record(TraceContext& ctx, StepCache& c, CallSignature sig, const std::vector<Tensor>& leaves,
            const std::vector<Tensor>& out, const TraceContext::StepState& st,
            std::shared_ptr<const void> like) {
  StepCache::Entry e;
  std::vector<TensorImpl*> impls;
  std::vector<TensorImpl*> grad_impls;                  // each grad's new value, or null
  std::vector<std::shared_ptr<TensorImpl>> grad_start;  // and the grad it read, or null
  for (const TraceContext::StepState::GradTouch& t : st.grads) {
    StepCache::Grad g;
    g.leaf = t.leaf;
    g.need = t.reset   ? StepCache::Grad::Any
             : t.start ? StepCache::Grad::Defined
                       : StepCache::Grad::Undefined;
    if (t.start) g.before = t.start->type;
    const Tensor& now = t.leaf->grad;
    TensorImpl* after = nullptr;
    if (now.defined()) {
      // A grad the step left as it was (touched, then not written): nothing to replay.
      if (!now.impl()->pending()) continue;
      after = now.impl();
      g.after = after->type;
      impls.push_back(after);
    }
    grad_impls.push_back(after);
    grad_start.push_back(t.start);
    e.grads.push_back(std::move(g));
  }
  auto is_grad = [&](const TensorImpl* p) {
    for (const TraceContext::StepState::GradTouch& t : st.grads)
      if (t.start.get() == p || t.leaf->grad.impl() == p) return true;
    return false;
  };
  std::vector<TensorImpl*> result_impls(out.size(), nullptr);
  for (size_t i = 0; i < out.size(); ++i) {
    const Tensor& t = out[i];
    StepCache::Result r;
    r.type = TensorType{t.dtype(), t.shape()};
    if (t.is_pending() && t.impl()->scope == 0) {
      impls.push_back(t.impl());
      result_impls[i] = t.impl();
    } else {
      r.passthrough = true;
      for (size_t a = 0; a < leaves.size(); ++a)
        if (leaves[a].impl() == t.impl()) r.arg = a;
      if (r.arg == SIZE_MAX) r.source = t;
    }
    e.results.push_back(r);
  }
  for (auto& u : st.updated) {
    bool seen = false;
    for (auto& v : e.updated) seen = seen || v == u;
    if (!seen && u->pending() && !is_grad(u.get())) {
      e.updated.push_back(u);
      impls.push_back(u.get());
    }
  }
  // The graph's outputs in the order of the context's pending list: the sync that ends this
  // first call then cuts the same graph when nothing else is pending, and hits its compile.
  std::unordered_map<const TensorImpl*, size_t> output_of;
  for (TensorImpl* p : impls) output_of.emplace(p, 0);
  impls.clear();
  for (TensorImpl* p : ctx.pending_impls())
    if (auto it = output_of.find(p); it != output_of.end()) {
      it->second = impls.size();
      impls.push_back(p);
    }
  LOOM_ASSERT(impls.size() == output_of.size());  // every pending tensor is on the list
  for (size_t i = 0; i < out.size(); ++i)
    if (result_impls[i]) e.results[i].output = output_of.at(result_impls[i]);
  for (const auto& u : e.updated) e.updated_output.push_back(output_of.at(u.get()));
  for (size_t k = 0; k < e.grads.size(); ++k)
    if (grad_impls[k]) e.grads[k].output = output_of.at(grad_impls[k]);
  std::vector<uint32_t> slot_ids;
  ir::Graph g = ctx.cut(impls, &slot_ids);
  std::vector<Buffer> bound = ctx.bind_slots(slot_ids);
  for (size_t k = 0; k < slot_ids.size(); ++k) {
    const DataSlot& s = ctx.slots()[slot_ids[k]];
    StepCache::Input in;
    if (s.is_rng) {
      in.kind = StepCache::Input::Rng;
    } else if (auto owner = s.owner.lock()) {
      in.kind = StepCache::Input::Owner;
      in.owner = owner;
      in.layout = s.sharding;
      for (size_t a = 0; a < leaves.size(); ++a)
        if (leaves[a].impl() == owner.get()) in.kind = StepCache::Input::Arg, in.arg = a;
      for (size_t j = 0; j < e.grads.size(); ++j)
        if (grad_start[j] == owner) {  // read from the leaf at a replay, so it must be there
          in.kind = StepCache::Input::LeafGrad;
          in.arg = j;
          in.owner = nullptr;
          e.grads[j].need = StepCache::Grad::Defined;
        }
    } else {
      in.kind = StepCache::Input::Baked;  // host numbers and data read once
      in.baked = bound[k];
    }
    e.inputs.push_back(std::move(in));
  }
  e.exe = runtime::compile_partitioned(g, &e.partition);
  e.sig = std::move(sig);
  e.like = std::move(like);
  std::lock_guard<std::mutex> lock(c.mu);
  c.entries.push_back(std::make_shared<const StepCache::Entry>(std::move(e)));
}

}  // namespace

std::vector<Tensor> run_step(StepCache& c, CallKey key, const FlatFn& fn,
                             std::shared_ptr<const void>* like) {
  const std::vector<Tensor>& leaves = key.leaves;
  TraceContext& ctx = TraceContext::get();
  LOOM_CHECK_T(TraceError, !ctx.in_scope(), "[compile] step '", c.name,
               "' cannot run while a loop body or assume_pure function is being traced");
  LOOM_CHECK_T(TraceError, ctx.step() == nullptr, "[compile] step '", c.name,
               "' was called inside another compiled step");
  for (const Tensor& t : leaves)  // a replay reads their buffers
    if (t.defined()) ctx.check_owner(*t.impl(), "compile");
  {
    GraphName before(c.before_name);
    ctx.sync_all();  // the cut before
  }
  GraphName graph_name(c.name);  // labels the step's compile, replays and metrics
  CallSignature sig = call_signature(key, "compile");
  {
    std::unique_lock<std::mutex> lock(c.mu);
    if (c.opts.trace_once) {
      if (std::shared_ptr<const StepCache::Entry> e = find_entry(c, sig)) {
        *like = e->like;
        lock.unlock();
        return replay(ctx, *e, leaves);
      }
    }
    bool known = false;
    for (const CallSignature& s : c.seen) known = known || s == sig;
    if (!known) {
      std::vector<const CallSignature*> earlier;
      for (const auto& e : c.entries) earlier.push_back(&e->sig);
      for (const CallSignature& s : c.seen) earlier.push_back(&s);
      sig.paths = key.leaf_paths();
      note_call_miss(str_cat("step '", c.name, "'"), earlier, sig);
      if (!c.opts.trace_once && c.seen.size() < 64) c.seen.push_back(sig);
    }
  }
  TraceContext::StepState st;
  st.name = &c.name;
  st.full_graph = c.opts.full_graph;
  st.recording = c.opts.trace_once;
  ctx.set_step(&st);
  std::vector<Tensor> out;
  try {
    out = fn(leaves);
  } catch (...) {
    ctx.set_step(nullptr);
    throw;
  }
  ctx.set_step(nullptr);
  if (c.opts.max_different_graphs > 0) {
    std::vector<uint32_t> slots;
    auto g = std::make_shared<const ir::Graph>(ctx.cut(ctx.pending_impls(), &slots));
    Hash128 fp = ir::fingerprint(*g);
    std::lock_guard<std::mutex> lock(c.mu);
    bool known = false;
    for (const Hash128& f : c.fingerprints) known = known || f == fp;
    if (!known) {
      LOOM_CHECK_T(TraceError, static_cast<int>(c.graphs.size()) < c.opts.max_different_graphs,
                   "[compile] step '", c.name, "' produced a graph different from its ",
                   c.graphs.size(),
                   " earlier one(s) (max_different_graphs = ", c.opts.max_different_graphs,
                   "). First difference from the closest: ", closest_difference(c.graphs, *g));
      c.fingerprints.push_back(fp);
      c.graphs.push_back(g);
    }
  }
  if (c.opts.trace_once) record(ctx, c, std::move(sig), leaves, out, st, *like);
  ctx.sync_all();  // the cut after
  return out;
}

}  // namespace loom::detail
