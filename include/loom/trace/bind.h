// Temporarily binding tensors to other values: the mechanism behind nn::functional_call and
// scan_layers. While a TensorBinding lives, each target tensor (every handle sharing its
// impl: a module's member, its registry entry) reads as its source's current value, in the
// graph being traced (the pending graph or a loop body); destruction restores the targets
// exactly (their data, pending value and requires_grad). Gradients flow to the sources.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "loom/trace/tensor.h"

namespace loom::detail {

class TensorBinding {
 public:
  // names[k] labels pair k in error messages (a parameter's dotted name).
  TensorBinding(const std::vector<Tensor>& targets, const std::vector<Tensor>& sources,
                const std::vector<std::string>& names, const char* what);
  ~TensorBinding();
  TensorBinding(const TensorBinding&) = delete;
  TensorBinding& operator=(const TensorBinding&) = delete;

 private:
  struct Saved;
  std::vector<std::shared_ptr<Saved>> saved_;
};

}  // namespace loom::detail
