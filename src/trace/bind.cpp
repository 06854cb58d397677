// TensorBinding: a target impl reads as its source's value while the binding lives.
#include "loom/trace/bind.h"

#include "trace/context.h"

namespace loom::detail {

struct TensorBinding::Saved {
  std::shared_ptr<TensorImpl> impl;
  TensorType type;
  Buffer buffer;
  std::shared_ptr<const ir::Sharding> sharding;
  ir::Value value, data_value;
  uint64_t data_epoch = 0;
  bool requires_grad = false, linked = false;
  uint32_t scope = 0, owner = 0;
  // A pending value of the pending graph is held by a linked stand-in meanwhile, so that a
  // compaction during the binding renumbers it too.
  std::shared_ptr<TensorImpl> shadow;
};

TensorBinding::TensorBinding(const std::vector<Tensor>& targets, const std::vector<Tensor>& sources,
                             const std::vector<std::string>& names, const char* what) {
  LOOM_ASSERT(targets.size() == sources.size());
  TraceContext& ctx = TraceContext::get();
  // Values first (a source may be a target too), then the rebinding.
  std::vector<ir::Value> values;
  for (size_t k = 0; k < targets.size(); ++k) {
    const std::string& name = k < names.size() ? names[k] : std::to_string(k);
    LOOM_CHECK(targets[k].defined() && sources[k].defined(), "[", what, "] ", name,
               " is an undefined Tensor");
    TensorType want{targets[k].dtype(), targets[k].shape()};
    TensorType got{sources[k].dtype(), sources[k].shape()};
    LOOM_CHECK_T(ShapeError, want == got, "[", what, "] ", name, " is ", want,
                 " in the module but ", got, " was given");
    values.push_back(ctx.value_of(sources[k]));
  }
  const uint32_t scope = ctx.current_scope();
  for (size_t k = 0; k < targets.size(); ++k) {
    auto s = std::make_shared<Saved>();
    TensorImpl& t = *targets[k].impl();
    s->impl = targets[k].impl_ptr();
    s->type = t.type;
    s->buffer = t.buffer;
    s->sharding = t.sharding;
    s->value = t.value;
    s->data_value = t.data_value;
    s->data_epoch = t.data_epoch;
    s->requires_grad = t.requires_grad;
    s->linked = t.linked.load(std::memory_order_relaxed);
    s->scope = t.scope;
    s->owner = t.owner.load(std::memory_order_relaxed);
    if (t.pending() && t.scope == 0) {
      s->shadow = new_tensor_impl();
      s->shadow->type = t.type;
      s->shadow->value = t.value;
      ctx.link_pending(s->shadow.get());
    }
    saved_.push_back(s);
    t.buffer = Buffer();
    t.sharding = nullptr;
    t.value = values[k];
    t.data_epoch = 0;
    t.requires_grad = false;
    t.scope = scope;
    t.owner.store(ctx.id(), std::memory_order_relaxed);
    if (scope == 0 && !t.linked.load(std::memory_order_relaxed))
      ctx.link_pending(&t);  // compaction keeps its value current
  }
}

TensorBinding::~TensorBinding() {
  TraceContext& ctx = TraceContext::get();
  for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
    Saved& s = **it;
    TensorImpl& t = *s.impl;
    if (t.linked.load(std::memory_order_relaxed) && !s.linked) ctx.unlink(&t);
    t.type = s.type;
    t.buffer = s.buffer;
    t.sharding = s.sharding;
    t.value = s.shadow ? s.shadow->value : s.value;
    t.data_value = s.data_value;
    t.data_epoch = s.data_epoch;
    t.requires_grad = s.requires_grad;
    t.scope = s.scope;
    t.owner.store(s.owner, std::memory_order_relaxed);
  }
}

}  // namespace loom::detail
