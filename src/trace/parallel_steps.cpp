// The data- and tensor-parallel layers' steps (collective.h), composed from the collectives.
#include <map>

#include "loom/trace/autograd.h"
#include "loom/trace/collective.h"
#include "loom/trace/ops.h"

namespace loom::dist {

void average_in_buckets(const std::vector<Tensor>& grads, double bucket_bytes) {
  struct Bucket {
    std::vector<Tensor> grads;
    double bytes = 0;
  };
  std::vector<Bucket> buckets;
  std::map<DType, size_t> open;  // dtype -> the bucket being filled
  for (const Tensor& g : grads) {
    const double n = static_cast<double>(g.numel() * itemsize(g.dtype()));
    auto it = open.find(g.dtype());
    if (it == open.end() || buckets[it->second].bytes + n > bucket_bytes) {
      buckets.emplace_back();
      it = open.insert_or_assign(g.dtype(), buckets.size() - 1).first;
    }
    buckets[it->second].grads.push_back(g);
    buckets[it->second].bytes += n;
  }
  NoGradGuard no_grad;
  for (Bucket& b : buckets) {
    std::vector<Tensor> flat;
    for (const Tensor& g : b.grads) flat.push_back(reshape(g, {-1}));
    Tensor mean = all_reduce(flat.size() == 1 ? flat[0] : cat(flat, 0), ReduceOp::Mean);
    int64_t at = 0;
    for (Tensor g : b.grads) {
      const int64_t n = g.numel();
      g.copy_(reshape(slice(mean, 0, at, at + n), g.shape().vec()));
      at += n;
    }
  }
}

namespace {
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  Tensor y = matmul(x, transpose(w, 0, 1));
  return b.defined() ? y + b : y;
}
}  // namespace

Tensor column_parallel_linear(const Tensor& x, const Tensor& w, const Tensor& b,
                              bool gather_output) {
  Tensor y = linear(grad_all_reduce(x), w, b);  // Megatron's f, then the local rows
  return gather_output ? all_gather(y, -1, /*replicated=*/true) : y;
}

Tensor row_parallel_linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  Tensor y = all_reduce(linear(x, w, Tensor()), ReduceOp::Sum, /*replicated=*/true);
  return b.defined() ? y + b : y;  // Megatron's g, then the replicated bias
}

}  // namespace loom::dist
