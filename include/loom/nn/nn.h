// nn: modules with named parameters, buffers and children, after torch.nn.
//
//   struct Block : loom::nn::Module {
//     std::shared_ptr<loom::nn::Linear> fc;
//     Block() { fc = register_module("fc", std::make_shared<loom::nn::Linear>(64, 64)); }
//     Tensor forward(const Tensor& x) override { return loom::gelu((*fc)(x)) + x; }
//   };
//
// Parameters are leaves that require grad; names are dotted ("layers.0.fc.weight") in
// registration order. Initialization follows PyTorch's defaults (Linear: uniform in
// +-1/sqrt(in_features) for weight and bias; Embedding: N(0, 1); norms: ones and zeros).
// functional_call runs a module with other tensors in place of its parameters and buffers
// (every handle of a parameter reads the given tensor meanwhile), so a module's forward can
// be a pure function of its parameters (assume_pure, scan_layers). Modules are not copyable;
// share them with std::shared_ptr.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loom/trace/ops.h"

namespace loom::nn {

using ParamMap = std::map<std::string, Tensor>;

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  virtual Tensor forward(const Tensor& x);
  // `loc` names the caller in the run-time errors of the ops forward traces.
  Tensor operator()(const Tensor& x, CallSite loc = std::source_location::current()) {
    detail::UserSite site(loc);
    return forward(x);
  }

  template <class M>
  std::shared_ptr<M> register_module(std::string name, std::shared_ptr<M> m) {
    add_child(std::move(name), m);
    return m;
  }
  // The tensor as a leaf that requires grad (floating point); returns the registered handle.
  Tensor register_parameter(std::string name, Tensor t);
  Tensor register_buffer(std::string name, Tensor t);

  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  std::vector<std::pair<std::string, Tensor>> named_buffers() const;
  std::vector<Tensor> parameters() const;
  ParamMap parameters_map() const;
  ParamMap buffers_map() const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const {
    return children_;
  }

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

 protected:
  void add_child(std::string name, std::shared_ptr<Module> m);

 private:
  void collect(const std::string& prefix, bool params,
               std::vector<std::pair<std::string, Tensor>>* out) const;
  std::vector<std::pair<std::string, Tensor>> params_, buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

// y = x W^T + b; weight [out, in], bias [out].
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;
};

class GELU : public Module {
 public:
  Tensor forward(const Tensor& x) override { return loom::gelu(x); }
};

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override { return loom::relu(x); }
};

// Normalizes the last dim; weight (ones) and bias (zeros) of [dim].
class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5);
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;
  double eps;
};

// x / sqrt(mean(x^2 over the last dim) + eps) * weight; weight (ones) of [dim].
class RMSNorm : public Module {
 public:
  explicit RMSNorm(int64_t dim, double eps = 1e-6);
  Tensor forward(const Tensor& x) override;
  Tensor weight;
  double eps;
};

// Rows of weight [num, dim] ~ N(0, 1); forward takes integer indices.
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t dim);
  Tensor forward(const Tensor& indices) override { return loom::embedding(indices, weight); }
  Tensor weight;
};

// Active in training mode only.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5) : p(p) {}
  Tensor forward(const Tensor& x) override { return loom::dropout(x, p, is_training()); }
  double p;
};

// Causal multi-head self-attention over x [batch, seq, dim]: qkv = Linear(dim, 3 dim), heads
// attend to positions <= their own, proj = Linear(dim, dim).
class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(int64_t dim, int64_t heads);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Linear> qkv, proj;
  int64_t dim, heads;
};

// Children "0", "1", ...; holds layers for scan_layers or a hand-written loop.
class ModuleList : public Module {
 public:
  void push_back(std::shared_ptr<Module> m);
  size_t size() const { return named_children().size(); }
  std::shared_ptr<Module> operator[](size_t i) const;
};

// Runs its children in order.
class Sequential : public ModuleList {
 public:
  Sequential() = default;
  Sequential(std::initializer_list<std::shared_ptr<Module>> ms) {
    for (auto& m : ms) push_back(m);
  }
  Tensor forward(const Tensor& x) override;
};

// module.forward(x) with `params` and `buffers` (by dotted name; names the module does not
// have are an error, names it has but the maps lack keep the module's own tensors).
Tensor functional_call(Module& module, const ParamMap& params, const ParamMap& buffers,
                       const Tensor& x);

// Losses (as loom::cross_entropy and loom::mse_loss: means).
inline Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index = -100,
                            std::source_location loc = std::source_location::current()) {
  return loom::cross_entropy(logits, target, ignore_index, loc);
}
inline Tensor mse_loss(const Tensor& input, const Tensor& target) {
  return loom::mse_loss(input, target);
}

// safetensors files (https://github.com/huggingface/safetensors): an 8-byte little-endian
// header size, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {string:
// string}}, then the raw data. Names and metadata are any UTF-8 strings (escaped in the
// header). A load maps the file and rejects, with a loom::Error naming the file, what the
// Python package rejects: malformed or non-UTF-8 JSON, nesting deeper than 128, duplicate
// names, extents or offsets that are not integers in [0, 2^63), overlapping or out-of-order
// data, data not covered exactly, non-string metadata; and dtypes loom lacks (U8, I16, F8...).
void save_safetensors(const std::map<std::string, Tensor>& tensors, const std::string& path,
                      const std::map<std::string, std::string>& metadata = {},
                      CallSite loc = std::source_location::current());
std::map<std::string, Tensor> load_safetensors(const std::string& path);
// The file's "__metadata__" (empty when it has none); checks the whole header as a load does.
std::map<std::string, std::string> load_safetensors_metadata(const std::string& path);
// A module's parameters and buffers by dotted name; load copies into the module's tensors and
// raises naming any missing, unexpected or differently shaped entry.
void save(const Module& module, const std::string& path);
void load(Module& module, const std::string& path);

}  // namespace loom::nn
