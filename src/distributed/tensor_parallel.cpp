// Column- and row-parallel Linear and the head-sharded attention (tensor_parallel.h).
#include "loom/dist/tensor_parallel.h"

#include <cmath>

#include "loom/core/error.h"
#include "loom/dist/dist.h"
#include "loom/trace/autograd.h"
#include "loom/trace/ops.h"

namespace loom::dist {

namespace {

int64_t split(const char* who, int64_t n, const char* what) {
  const int64_t w = require(who).size();
  LOOM_CHECK_T(ShapeError, n > 0 && n % w == 0, "[", who, "] ", what, " ", n,
               " must split evenly across ", w, " ranks");
  return n / w;
}

Tensor init_uniform(Shape s, int64_t fan_in) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  return rand(s) * (2 * bound) - bound;
}

// Copies `from` into `to` (shapes must agree), outside autograd, now.
void assign(Tensor to, const Tensor& from, const char* who) {
  LOOM_CHECK_T(ShapeError, to.shape() == from.shape(), "[", who, "] shard of shape ",
               TensorType{from.dtype(), from.shape()}, " does not fit ",
               TensorType{to.dtype(), to.shape()});
  NoGradGuard g;
  to.copy_(from);
  loom::sync();
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  Tensor y = matmul(x, transpose(w, 0, 1));
  return b.defined() ? y + b : y;
}

}  // namespace

ColumnParallelLinear::ColumnParallelLinear(int64_t in, int64_t out, bool with_bias, bool gather)
    : in_features(in), out_features(out), gather_output(gather) {
  const int64_t local = split("ColumnParallelLinear", out, "out_features");
  weight = register_parameter("weight", init_uniform({local, in}, in));
  if (with_bias) bias = register_parameter("bias", init_uniform({local}, in));
}

Tensor ColumnParallelLinear::forward(const Tensor& x) {
  Tensor y = linear(grad_all_reduce(x), weight, bias);  // Megatron's f, then the local rows
  return gather_output ? all_gather(y, -1, /*replicated=*/true) : y;
}

void ColumnParallelLinear::load(const nn::Linear& full) {
  const int64_t local = weight.size(0), r = rank();
  assign(weight, slice(full.weight, 0, r * local, (r + 1) * local), "ColumnParallelLinear");
  if (bias.defined())
    assign(bias, slice(full.bias, 0, r * local, (r + 1) * local), "ColumnParallelLinear");
}

RowParallelLinear::RowParallelLinear(int64_t in, int64_t out, bool with_bias)
    : in_features(in), out_features(out) {
  const int64_t local = split("RowParallelLinear", in, "in_features");
  weight = register_parameter("weight", init_uniform({out, local}, in));
  if (with_bias) bias = register_parameter("bias", init_uniform({out}, in));
}

Tensor RowParallelLinear::forward(const Tensor& x) {
  Tensor y = all_reduce(linear(x, weight, Tensor()), ReduceOp::Sum, /*replicated=*/true);
  return bias.defined() ? y + bias : y;  // Megatron's g, then the replicated bias
}

void RowParallelLinear::load(const nn::Linear& full) {
  const int64_t local = weight.size(1), r = rank();
  assign(weight, slice(full.weight, 1, r * local, (r + 1) * local), "RowParallelLinear");
  if (bias.defined()) assign(bias, full.bias, "RowParallelLinear");
}

ShardedCausalSelfAttention::ShardedCausalSelfAttention(int64_t dim, int64_t heads)
    : dim(dim), heads(heads) {
  LOOM_CHECK_T(ShapeError, heads > 0 && dim % heads == 0, "[ShardedCausalSelfAttention] dim ", dim,
               " is not a multiple of heads ", heads);
  local_heads = split("ShardedCausalSelfAttention", heads, "heads");
  qkv = register_module("qkv", std::make_shared<ColumnParallelLinear>(dim, 3 * dim, true, false));
  proj = register_module("proj", std::make_shared<RowParallelLinear>(dim, dim));
}

Tensor ShardedCausalSelfAttention::forward(const Tensor& x) {
  LOOM_CHECK_T(ShapeError, x.dim() == 3 && x.size(2) == dim,
               "[ShardedCausalSelfAttention] expected [batch, seq, ", dim, "], got ",
               TensorType{x.dtype(), x.shape()});
  const int64_t B = x.size(0), T = x.size(1), hd = dim / heads, ld = local_heads * hd;
  Tensor qkv_out = (*qkv)(x);  // [B, T, 3 ld]: q, k, v of this rank's heads
  auto head = [&](int64_t k) {
    Tensor part = slice(qkv_out, 2, k * ld, (k + 1) * ld);
    return permute(reshape(part, {B, T, local_heads, hd}), {0, 2, 1, 3});
  };
  Tensor q = head(0), kk = head(1), v = head(2);
  Tensor scores = matmul(q, transpose(kk, 2, 3)) * (1.0 / std::sqrt(static_cast<double>(hd)));
  Tensor pos = arange(0, static_cast<double>(T), int64);
  Tensor allowed = unsqueeze(pos, 1) >= unsqueeze(pos, 0);
  scores = where(allowed, scores, full({}, -1e30, scores.dtype()));
  Tensor y = matmul(softmax(scores, -1), v);
  return (*proj)(reshape(permute(y, {0, 2, 1, 3}), {B, T, ld}));
}

void ShardedCausalSelfAttention::load(const nn::CausalSelfAttention& full) {
  const int64_t ld = dim / require("ShardedCausalSelfAttention").size(), r = rank();
  std::vector<Tensor> w, b;
  for (int64_t k = 0; k < 3; ++k) {  // this rank's rows of q, of k and of v
    w.push_back(slice(full.qkv->weight, 0, k * dim + r * ld, k * dim + (r + 1) * ld));
    b.push_back(slice(full.qkv->bias, 0, k * dim + r * ld, k * dim + (r + 1) * ld));
  }
  assign(qkv->weight, cat(w, 0), "ShardedCausalSelfAttention");
  assign(qkv->bias, cat(b, 0), "ShardedCausalSelfAttention");
  proj->load(*full.proj);
}

}  // namespace loom::dist
