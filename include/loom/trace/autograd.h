// Autograd: gradients of lazy tensors, recorded into the same pending graph as the forward.
//
//   Tensor w = loom::randn({4, 3}).requires_grad_();   // a leaf
//   Tensor loss = loom::mean(loom::tanh(loom::matmul(x, w)));
//   loss.backward();                    // records the backward; w.grad() is pending
//   { loom::NoGradGuard g; w.copy_(w - w.grad() * 0.1); }
//   loom::sync();                       // forward, backward and update: one graph
//
// backward() accumulates into the grad() of every leaf that requires grad (a tensor on which
// requires_grad_() was called) and that the tensor depends on. Call it before sync(): a sync
// runs and drops the graph it would differentiate. Under NoGradGuard nothing records
// gradients (optimizer updates). Functional forms: grad(fn) and value_and_grad(fn)
// differentiate fn with respect to its first argument, a tree of tensors, without touching
// any grad(); fn returns a tensor with one element.
#pragma once

#include <utility>
#include <vector>

#include "loom/trace/ops.h"
#include "loom/trace/tree.h"

namespace loom {

class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// False inside a NoGradGuard.
bool grad_enabled();

namespace detail {
std::vector<Tensor> functional_gradients(const Tensor& out, const std::vector<Tensor>& wrt);
Tensor fresh_leaf(const Tensor& x);
}  // namespace detail

template <class Fn>
auto value_and_grad(Fn fn) {
  return [fn](const auto& first, const auto&... rest) {
    using First = std::decay_t<decltype(first)>;
    std::vector<Tensor> leaves;
    tree::flatten(first, &leaves);
    std::vector<Tensor> fresh;
    for (const Tensor& l : leaves) fresh.push_back(detail::fresh_leaf(l));
    Tensor value = fn(tree::unflatten(first, fresh), rest...);
    std::vector<Tensor> g = detail::functional_gradients(value, fresh);
    for (size_t k = 0; k < g.size(); ++k)
      if (!g[k].defined()) g[k] = zeros(leaves[k].shape(), leaves[k].dtype());
    return std::pair<Tensor, First>{value, tree::unflatten(first, g)};
  };
}

template <class Fn>
auto grad(Fn fn) {
  auto vg = value_and_grad(std::move(fn));
  return [vg](const auto&... args) { return vg(args...).second; };
}

}  // namespace loom
