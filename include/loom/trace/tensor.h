// Tensor: loom's lazy tensor handle.
//
//   loom::Tensor a = loom::randn({4, 4}), b = loom::ones({4});
//   loom::Tensor c = loom::exp(a) + b * 2.0;   // records ops; nothing runs yet
//   loom::sync();                              // compiles (cached) and runs pending work
//   std::vector<float> v = c.to_vector<float>();
//
// Every op records a node into the calling thread's pending graph. sync() materializes every
// live pending tensor; reading a value (item, to_vector, printing) materializes it together
// with every live pending tensor connected to it through computed values (the parameters and
// optimizer state that a training step updated from the loss being read), so a loop that only
// reads its loss leaves nothing pending that the next step builds on. If that run fails, the
// tensors whose values depend on the op that failed take its error (reading them rethrows it;
// a new value assigned in place replaces it); the others stay pending. Host scalars in ops (`x *
// step`) are graph inputs, not constants, so a value that changes every step does not recompile.
// Copies of a Tensor share one tensor (in-place ops are seen through every copy). Thread-safety: a
// tensor belongs to the thread that traces it; materialized tensors may be read from any thread.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <source_location>
#include <vector>

#include "loom/core/dtype.h"
#include "loom/core/error.h"
#include "loom/core/shape.h"

namespace loom {

namespace detail {
struct TensorImpl;
}

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<detail::TensorImpl> impl) : impl_(std::move(impl)) {}

  const Shape& shape() const;
  DType dtype() const;
  int64_t dim() const { return shape().rank(); }
  int64_t size(int64_t d) const;
  int64_t numel() const { return shape().numel(); }
  bool defined() const { return impl_ != nullptr; }
  // True when the value is still a node of the pending graph (not yet computed).
  bool is_pending() const;

  // Materializes (runs what this tensor needs) and copies out, row-major, converting to T.
  // `loc` names the graph it runs, unless a GraphName is active (loom/runtime/diagnostics.h).
  template <class T>
  std::vector<T> to_vector(std::source_location loc = std::source_location::current()) const;
  // The single element of a tensor with numel() == 1, converted to T.
  template <class T>
  T item(std::source_location loc = std::source_location::current()) const;

  Tensor operator[](int64_t i) const;  // select along dim 0

  Tensor& copy_(const Tensor& src);  // src broadcast and converted to this tensor's type
  Tensor& add_(const Tensor& other);
  Tensor& zero_();  // refused on a leaf that requires grad while gradients are on, as torch

  // Autograd (loom/trace/autograd.h): requires_grad_ makes a leaf; requires_grad() is also
  // true for tensors computed from leaves; backward() differentiates a one-element tensor
  // (backward(gradient) any tensor) and accumulates into the leaves' grad().
  Tensor& requires_grad_(bool on = true);
  bool requires_grad() const;
  Tensor grad() const;
  void reset_grad();  // grad() becomes undefined (PyTorch's zero_grad(set_to_none=True))
  void backward() const;
  void backward(const Tensor& gradient) const;
  Tensor detach() const;

  detail::TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<detail::TensorImpl>& impl_ptr() const { return impl_; }

 private:
  std::shared_ptr<detail::TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// Factories. tensor(values, shape): T is float, double, int32_t, int64_t or bool, and the
// dtype follows T (float -> float32, double -> float64, int32_t -> int32, int64_t -> int64).
template <class T>
Tensor tensor(std::vector<T> values, Shape shape);
template <class T>
Tensor tensor(T scalar);  // 0-d
Tensor zeros(Shape shape, DType dtype = float32);
Tensor ones(Shape shape, DType dtype = float32);
Tensor full(Shape shape, double value, DType dtype = float32);
Tensor arange(double start, double end, DType dtype = float32);  // [start, end) step 1
Tensor randn(Shape shape, DType dtype = float32);
Tensor rand(Shape shape, DType dtype = float32);  // uniform in [0, 1)
// Seeds this thread's generator: later rand/randn/dropout draw the same numbers on every
// backend. Keys are graph inputs, so drawing every step does not recompile.
void manual_seed(uint64_t seed);

// Compiles (cached) and runs all pending work of this thread. The graph it runs is named by
// `loc` (the caller's line), unless a GraphName is active (loom/runtime/diagnostics.h).
void sync(CallSite loc = std::source_location::current());
// Computes `tensors` (and the live pending tensors connected to them) in one graph, named by
// `loc`: a checkpoint of a whole model costs one run, not one per tensor.
void materialize(const std::vector<Tensor>& tensors,
                 CallSite loc = std::source_location::current());

// Nodes in this thread's pending graph (for tests and diagnostics).
int64_t pending_graph_size();
// The IR text of the graph that materializing `outputs` would run now (for debugging).
std::string pending_ir(const std::vector<Tensor>& outputs);

}  // namespace loom
