// PyTorch's conveniences that nanoGPT-style code reaches for, composed once from loom's ops
// (no IR op, kernel or gradient rule of their own; gradients come from the pieces):
//
//   Tensor att = loom::masked_fill(scores, loom::tril(ones) == 0.0, -INFINITY);
//   auto [q, k, v] = loom::split(qkv, d, 2);            // a std::vector of 3
//   auto [vals, idx] = loom::topk(logits, 5);            // idx int64, largest first
//   Tensor next = loom::multinomial(loom::softmax(logits, -1), 1);   // Gumbel-max
//   { loom::GradModeGuard g(true); ... }                 // torch.enable_grad
//
// Semantics, dtypes and errors follow torch 1.13; where torch leaves an order unspecified
// (topk's ties) loom picks the lowest index first. Thread-safety: as every op, they record
// into the calling thread's trace.
#pragma once

#include <string_view>
#include <utility>
#include <vector>

#include "loom/trace/ops.h"

namespace loom {

// gelu with torch's `approximate`: "none" (the erf form, gelu(x)) or "tanh":
// x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))).
Tensor gelu(const Tensor& x, std::string_view approximate);
// torch's gelu_backward: grad * gelu'(x), built from the same nodes as gelu(x, approximate), so
// that in one graph the forward's erf (tanh) is shared rather than computed again.
Tensor gelu_backward(const Tensor& grad, const Tensor& x, std::string_view approximate = "none");

// The lower (upper) triangle of the last two dims: entries with j - i <= diagonal (>=) are kept,
// the others are 0.
Tensor tril(const Tensor& x, int64_t diagonal = 0);
Tensor triu(const Tensor& x, int64_t diagonal = 0);

// where(mask, value, x): mask bool, broadcast with x; value converted to x's dtype (a host
// scalar input, so a changing value does not recompile) or a 0-d tensor.
Tensor masked_fill(const Tensor& x, const Tensor& mask, Scalar value);
Tensor masked_fill(const Tensor& x, const Tensor& mask, const Tensor& value);

// Views along dim: pieces of split_size (the last one smaller), or of the given sizes (which
// must add up to x.size(dim)); chunk: ceil(n / chunks) per piece, so maybe fewer than chunks.
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim = 0);
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);

// The running sum along dim (bool and integer inputs give int64, as torch); products with a
// triangular mask, in two levels past 128 elements (O(n sqrt n) work, float16/bfloat16 summed
// in float32).
Tensor cumsum(const Tensor& x, int64_t dim);

// The k largest (smallest) entries along dim and their int64 indices, in order (nan counts
// as the largest, as torch; ties by index); k rounds of a masked argmax up to k = 16, a sort
// past it.
std::pair<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t dim = -1, bool largest = true,
                               bool sorted = true);

// (values, indices): x sorted along dim, as torch.sort(stable=True): argsort's indices, the
// values gathered with them (gradients flow to x through the gather).
std::pair<Tensor, Tensor> sort(const Tensor& x, int64_t dim = -1, bool descending = false);

// num_samples int64 category indices per row of probs ([C] or [N, C], non-negative weights,
// not necessarily normalized) by Gumbel-max on loom::rand (without replacement: the
// Gumbel-top-k). Weights are not checked at run time (negative or all-zero rows give
// arbitrary indices where torch raises).
Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement = false);

// torch's fill_ / zero_: x takes `value` in place; like every in-place op, refused on a leaf
// that requires grad unless gradients are off (NoGradGuard), as Tensor::zero_.
Tensor& fill_(Tensor& x, Scalar value);
Tensor& fill_(Tensor& x, const Tensor& value);  // value 0-d
Tensor& zero_(Tensor& x);
// torch's is_leaf: x requires no grad, or requires_grad_() made it require grad.
bool is_leaf(const Tensor& x);

// Sets gradient recording on or off for this thread (torch.set_grad_enabled);
// GradModeGuard does it for a scope (GradModeGuard g(true) is torch.enable_grad).
void set_grad_enabled(bool on);
class GradModeGuard {
 public:
  explicit GradModeGuard(bool enabled);
  ~GradModeGuard();
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace loom
