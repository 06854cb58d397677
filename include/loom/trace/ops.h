// The ops of the public API, as free functions and operators. Broadcasting, type promotion
// (an int tensor plus a C++ int stays int; a 0-d tensor does not raise a dimensioned one's
// dtype within a category) and defaults follow PyTorch. Every op throws a loom::Error subclass
// naming the op, the shapes and dtypes, and what was expected, when given bad input.
#pragma once

#include <optional>
#include <vector>

#include "loom/trace/tensor.h"

namespace loom {

// A host number in an op: C++ integers stay integers, floating values are "weak" floats.
// Its value becomes a graph input, not a constant, so it may change every step.
struct Scalar {
  Scalar(double v) : value(v), is_int(false) {}                                  // NOLINT
  Scalar(float v) : value(v), is_int(false) {}                                   // NOLINT
  Scalar(int v) : value(v), ivalue(v), is_int(true) {}                           // NOLINT
  Scalar(int64_t v) : value(static_cast<double>(v)), ivalue(v), is_int(true) {}  // NOLINT
  Scalar(bool v) : value(v), ivalue(v), is_int(true), is_bool(true) {}           // NOLINT
  double value;
  int64_t ivalue = 0;
  bool is_int;
  bool is_bool = false;
};
// torch's result type of a tensor of dtype `t` with the host number `s`: `t`, unless the
// number's category is wider (bool < integer < floating), then int64 or float32.
DType result_type(DType t, const Scalar& s);

// elementwise
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);  // true division: integers give float32
Tensor pow(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, Scalar b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor neg(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x);  // exact erf form
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
Tensor erf(const Tensor& x);
Tensor logical_not(const Tensor& x);
Tensor logical_and(const Tensor& a, const Tensor& b);  // bool tensors
Tensor logical_or(const Tensor& a, const Tensor& b);
// torch's floor, fmod (C's, the dividend's sign), floor_divide (//) and remainder (%, the
// divisor's sign), torch's values at infinities and zeros for floats; integer division by zero
// gives 0 (as numpy), or raises when the divisor is known to be 0 as the op is traced. See
// docs/ir.md.
Tensor floor(const Tensor& x);
Tensor fmod(const Tensor& a, const Tensor& b);
Tensor floor_divide(const Tensor& a, const Tensor& b);
Tensor remainder(const Tensor& a, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max);
Tensor to(const Tensor& x, DType dtype);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, Scalar b);
Tensor operator-(const Tensor& a, Scalar b);
Tensor operator*(const Tensor& a, Scalar b);
Tensor operator/(const Tensor& a, Scalar b);
Tensor operator+(Scalar a, const Tensor& b);
Tensor operator-(Scalar a, const Tensor& b);
Tensor operator*(Scalar a, const Tensor& b);
Tensor operator/(Scalar a, const Tensor& b);
Tensor operator-(const Tensor& x);
Tensor operator<(const Tensor& a, const Tensor& b);
Tensor operator<=(const Tensor& a, const Tensor& b);
Tensor operator>(const Tensor& a, const Tensor& b);
Tensor operator>=(const Tensor& a, const Tensor& b);
Tensor operator==(const Tensor& a, const Tensor& b);
Tensor operator!=(const Tensor& a, const Tensor& b);
Tensor operator<(const Tensor& a, Scalar b);
Tensor operator<=(const Tensor& a, Scalar b);
Tensor operator>(const Tensor& a, Scalar b);
Tensor operator>=(const Tensor& a, Scalar b);
Tensor operator==(const Tensor& a, Scalar b);
Tensor operator!=(const Tensor& a, Scalar b);

// reductions: no dims reduces every element; dims may be negative
Tensor sum(const Tensor& x);
Tensor sum(const Tensor& x, std::vector<int64_t> dims, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, std::vector<int64_t> dims, bool keepdim = false);
Tensor max(const Tensor& x);
Tensor max(const Tensor& x, std::vector<int64_t> dims, bool keepdim = false);
Tensor min(const Tensor& x);
Tensor min(const Tensor& x, std::vector<int64_t> dims, bool keepdim = false);
Tensor argmax(const Tensor& x);  // index into the flattened tensor
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);
// The int64 indices that sort x along dim: stable (equal entries keep their order), nan after
// every number ascending and before descending, as torch.argsort(stable=True); bool as 0/1.
Tensor argsort(const Tensor& x, int64_t dim = -1, bool descending = false);
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);

// linear algebra: torch.matmul semantics (1-d operands, batching, broadcasting)
Tensor matmul(const Tensor& a, const Tensor& b);

// layout; -1 in reshape/view infers one extent
Tensor reshape(const Tensor& x, std::vector<int64_t> shape);
Tensor view(const Tensor& x, std::vector<int64_t> shape);
// torch's contiguous(): x when its layout (as torch would hold it) is row-major, else a copy
// that view() accepts (`x.transpose(1, 2).contiguous().view(b, t, d)`).
Tensor contiguous(const Tensor& x);
Tensor permute(const Tensor& x, std::vector<int64_t> dims);
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1);
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor squeeze(const Tensor& x);
Tensor squeeze(const Tensor& x, int64_t dim);
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor expand(const Tensor& x, std::vector<int64_t> shape);  // -1 keeps an extent
Tensor cat(const std::vector<Tensor>& xs, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& xs, int64_t dim = 0);
// Python-style slice of dim: negative start/end count from the end and are clamped.
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor select(const Tensor& x, int64_t dim, int64_t index);
// index_select, gather, embedding and cross_entropy (its class targets) can fail at run time
// (an index out of range): `loc`, the call site, is named in the error.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index,
                    std::source_location loc = std::source_location::current());
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index,
              std::source_location loc = std::source_location::current());
// torch.index_add: x with source's slice j added at index[j] along dim (repeated indices
// accumulate); index 1-d, source shaped as x with index.numel() along dim.
Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& source,
                 std::source_location loc = std::source_location::current());

// neural-network functions
Tensor layer_norm(const Tensor& x, std::vector<int64_t> normalized_shape, const Tensor& weight = {},
                  const Tensor& bias = {}, double eps = 1e-5);
Tensor embedding(const Tensor& indices, const Tensor& weight,
                 std::source_location loc = std::source_location::current());
Tensor dropout(const Tensor& x, double p, bool training = true);
// Mean over the batch of the targets that are not ignore_index (torch's default -100; nan when
// every target is ignored, as torch); ignored rows get gradient 0.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index = -100,
                     std::source_location loc = std::source_location::current());
Tensor mse_loss(const Tensor& input, const Tensor& target);  // mean

}  // namespace loom
