// DataParallel: rank 0's parameters broadcast at start, gradients averaged in buckets.
#include "loom/core/error.h"
#include "loom/dist/dist.h"
#include "loom/dist/parallel.h"
#include "loom/trace/autograd.h"
#include "loom/trace/ops.h"

namespace loom::dist {

DataParallel::DataParallel(nn::Module& module, DataParallelOptions options)
    : module_(&module), options_(options) {
  require("DataParallel");
  NoGradGuard no_grad;
  auto sync_from_root = [](Tensor t) { t.copy_(broadcast(t, 0)); };
  for (auto& [name, p] : module.named_parameters()) sync_from_root(p);
  for (auto& [name, b] : module.named_buffers()) sync_from_root(b);
  loom::sync();
}

void DataParallel::average_gradients() {
  std::vector<Tensor> grads;
  for (const Tensor& p : module_->parameters())
    if (p.grad().defined()) grads.push_back(p.grad());
  average_in_buckets(grads, options_.bucket_mib * 1024 * 1024);
}

std::pair<int64_t, int64_t> shard(int64_t n, int rank, int world) {
  LOOM_CHECK(world >= 1 && rank >= 0 && rank < world, "[shard] rank ", rank,
             " is not in a world of ", world);
  const int64_t per = n / world;
  return {per * rank, per * (rank + 1)};
}

std::pair<int64_t, int64_t> shard(int64_t n) { return shard(n, rank(), world_size()); }

}  // namespace loom::dist
