// Column- and row-parallel Linear and the head-sharded attention (tensor_parallel.h).
#include "loom/dist/tensor_parallel.h"

#include <cmath>

#include "loom/core/error.h"
#include "loom/dist/dist.h"
#include "loom/trace/attention.h"
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

}  // namespace

ColumnParallelLinear::ColumnParallelLinear(int64_t in, int64_t out, bool with_bias, bool gather)
    : in_features(in), out_features(out), gather_output(gather) {
  const int64_t local = split("ColumnParallelLinear", out, "out_features");
  weight = register_parameter("weight", init_uniform({local, in}, in));
  if (with_bias) bias = register_parameter("bias", init_uniform({local}, in));
}

Tensor ColumnParallelLinear::forward(const Tensor& x) {
  return column_parallel_linear(x, weight, bias, gather_output);
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

Tensor RowParallelLinear::forward(const Tensor& x) { return row_parallel_linear(x, weight, bias); }

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
  return (*proj)(packed_qkv_attention((*qkv)(x), local_heads));  // this rank's heads
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
