// Modules, layers and functional_call.
#include <cmath>

#include "loom/nn/nn.h"
#include "loom/trace/attention.h"
#include "loom/trace/autograd.h"
#include "loom/trace/bind.h"

namespace loom::nn {

namespace {
void check_name(const char* what, const std::string& name) {
  LOOM_CHECK(!name.empty() && name.find('.') == std::string::npos, "[", what, "] name '", name,
             "' must be non-empty and without dots");
}
// Uniform in [-bound, bound), like torch.nn.init.uniform_.
Tensor uniform(Shape shape, double bound) {
  return ((loom::rand(std::move(shape)) * 2.0 - 1.0) * bound).detach();
}
}  // namespace

Tensor Module::forward(const Tensor&) {
  throw Error("[nn.Module] forward is not implemented for this module");
}

Tensor Module::register_parameter(std::string name, Tensor t) {
  check_name("register_parameter", name);
  LOOM_CHECK(t.defined(), "[register_parameter] '", name, "' is an undefined Tensor");
  for (auto& [n, p] : params_)
    LOOM_CHECK(n != name, "[register_parameter] '", name, "' is registered twice");
  Tensor leaf = t.detach();
  leaf.requires_grad_();
  params_.emplace_back(std::move(name), leaf);
  return leaf;
}

Tensor Module::register_buffer(std::string name, Tensor t) {
  check_name("register_buffer", name);
  LOOM_CHECK(t.defined(), "[register_buffer] '", name, "' is an undefined Tensor");
  Tensor b = t.detach();
  buffers_.emplace_back(std::move(name), b);
  return b;
}

void Module::add_child(std::string name, std::shared_ptr<Module> m) {
  check_name("register_module", name);
  LOOM_CHECK(m != nullptr, "[register_module] '", name, "' is null");
  for (auto& [n, c] : children_)
    LOOM_CHECK(n != name, "[register_module] '", name, "' is registered twice");
  children_.emplace_back(std::move(name), std::move(m));
}

void Module::collect(const std::string& prefix, bool params,
                     std::vector<std::pair<std::string, Tensor>>* out) const {
  for (const auto& [n, t] : params ? params_ : buffers_) out->emplace_back(prefix + n, t);
  for (const auto& [n, c] : children_) c->collect(prefix + n + ".", params, out);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> r;
  collect("", true, &r);
  return r;
}
std::vector<std::pair<std::string, Tensor>> Module::named_buffers() const {
  std::vector<std::pair<std::string, Tensor>> r;
  collect("", false, &r);
  return r;
}
std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> r;
  for (auto& [n, t] : named_parameters()) r.push_back(t);
  return r;
}
ParamMap Module::parameters_map() const {
  ParamMap m;
  for (auto& [n, t] : named_parameters()) m.emplace(n, t);
  return m;
}
ParamMap Module::buffers_map() const {
  ParamMap m;
  for (auto& [n, t] : named_buffers()) m.emplace(n, t);
  return m;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->train(on);
}

Linear::Linear(int64_t in, int64_t out, bool with_bias) {
  LOOM_CHECK_T(ShapeError, in > 0 && out > 0, "[Linear] expected positive features, got in=", in,
               " out=", out);
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  weight = register_parameter("weight", uniform({out, in}, bound));
  if (with_bias) bias = register_parameter("bias", uniform({out}, bound));
}

Tensor Linear::forward(const Tensor& x) {
  Tensor y = loom::matmul(x, loom::transpose(weight, 0, 1));
  return bias.defined() ? y + bias : y;
}

LayerNorm::LayerNorm(int64_t dim, double eps) : eps(eps) {
  weight = register_parameter("weight", loom::ones({dim}));
  bias = register_parameter("bias", loom::zeros({dim}));
}
Tensor LayerNorm::forward(const Tensor& x) {
  return loom::layer_norm(x, {weight.size(0)}, weight, bias, eps);
}

RMSNorm::RMSNorm(int64_t dim, double eps) : eps(eps) {
  weight = register_parameter("weight", loom::ones({dim}));
}
Tensor RMSNorm::forward(const Tensor& x) {
  LOOM_CHECK_T(ShapeError, x.dim() >= 1 && x.size(-1) == weight.size(0),
               "[RMSNorm] expected a last dim of ", weight.size(0), ", got ",
               TensorType{x.dtype(), x.shape()});
  return x * loom::rsqrt(loom::mean(x * x, {-1}, true) + eps) * weight;
}

Embedding::Embedding(int64_t num, int64_t dim) {
  weight = register_parameter("weight", loom::randn({num, dim}));
}

CausalSelfAttention::CausalSelfAttention(int64_t dim, int64_t heads) : dim(dim), heads(heads) {
  LOOM_CHECK_T(ShapeError, heads > 0 && dim % heads == 0, "[CausalSelfAttention] dim ", dim,
               " is not a multiple of heads ", heads);
  qkv = register_module("qkv", std::make_shared<Linear>(dim, 3 * dim));
  proj = register_module("proj", std::make_shared<Linear>(dim, dim));
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  LOOM_CHECK_T(ShapeError, x.dim() == 3 && x.size(2) == dim,
               "[CausalSelfAttention] expected [batch, seq, ", dim, "], got ",
               TensorType{x.dtype(), x.shape()});
  return (*proj)(loom::packed_qkv_attention((*qkv)(x), heads));
}

void ModuleList::push_back(std::shared_ptr<Module> m) {
  add_child(std::to_string(named_children().size()), std::move(m));
}

std::shared_ptr<Module> ModuleList::operator[](size_t i) const {
  auto children = named_children();
  LOOM_CHECK_T(ShapeError, i < children.size(), "[ModuleList] index ", i, " out of range for ",
               children.size(), " modules");
  return children[i].second;
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  for (auto& [n, m] : named_children()) h = m->forward(h);
  return h;
}

Tensor functional_call(Module& module, const ParamMap& params, const ParamMap& buffers,
                       const Tensor& x) {
  std::vector<Tensor> targets, sources;
  std::vector<std::string> names;
  auto bind = [&](const std::vector<std::pair<std::string, Tensor>>& own, const ParamMap& given,
                  const char* kind) {
    ParamMap mine(own.begin(), own.end());
    for (const auto& [name, t] : given) {
      auto it = mine.find(name);
      LOOM_CHECK(it != mine.end(), "[functional_call] the module has no ", kind, " named '", name,
                 "'");
      targets.push_back(it->second);
      sources.push_back(t);
      names.push_back(name);
    }
  };
  bind(module.named_parameters(), params, "parameter");
  bind(module.named_buffers(), buffers, "buffer");
  detail::TensorBinding binding(targets, sources, names, "functional_call");
  return module.forward(x);
}

}  // namespace loom::nn
