// Data parallel training: every rank holds the whole model and a shard of each batch; the
// gradients are averaged across ranks inside the step's graph (bucketed all_reduce), so the
// whole step (forward, backward, all_reduce, optimizer) is one graph, compiled once.
//
//   loom::dist::DataParallel dp(model);          // broadcasts rank 0's parameters
//   auto step = loom::compile([&](const Tensor& x, const Tensor& y) {
//     opt.zero_grad();
//     Tensor loss = loom::mse_loss(model(x), y);  // mean over this rank's shard
//     loss.backward();
//     dp.average_gradients();                     // grad = mean over ranks
//     opt.step();
//     return loss;
//   }, {.trace_once = true});
//   auto [begin, end] = loom::dist::shard(n, batch);   // this rank's rows
//
// Thread-safety: as the module (one rank's thread).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "loom/nn/nn.h"

namespace loom::dist {

struct DataParallelOptions {
  double bucket_mib = 4;  // gradients are concatenated into all_reduce buckets of this size
};

class DataParallel {
 public:
  // Broadcasts the module's parameters and buffers from rank 0 (now, synchronously).
  explicit DataParallel(nn::Module& module, DataParallelOptions options = {});
  // After backward(): replaces every parameter's grad by its mean over the ranks (lazily:
  // one all_reduce per bucket in the current graph). Parameters without a grad on this rank
  // must have none on every rank (the graphs would differ).
  void average_gradients();
  nn::Module& module() { return *module_; }

 private:
  nn::Module* module_;
  DataParallelOptions options_;
};

// Rank `rank` of `world` ranks' part of n items: [begin, end), the remainder dropped so that
// every rank gets n / world items (equal shapes: every rank traces the same graph).
std::pair<int64_t, int64_t> shard(int64_t n, int rank, int world);
// The same for the current communicator's rank and size.
std::pair<int64_t, int64_t> shard(int64_t n);

}  // namespace loom::dist
