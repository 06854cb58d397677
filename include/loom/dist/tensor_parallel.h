// Tensor parallel layers (Megatron-style) over the current communicator's ranks. Weights are
// split across ranks; the collectives are inserted for the user, with the replicated-
// objective gradients (every rank computes the same loss from the layers' outputs):
//
//   ColumnParallelLinear(in, out)   weight [out / world, in]: this rank's output features;
//                                   input replicated (its gradient all_reduced), output
//                                   all_gathered (gather_output) or left sharded
//   RowParallelLinear(in, out)      weight [out, in / world]: this rank's input features;
//                                   input sharded, output all_reduced, bias replicated
//   ShardedCausalSelfAttention      nn::CausalSelfAttention with its heads split: qkv column-
//                                   parallel by heads, proj row-parallel
//
// load(full) copies this rank's share of an unsharded layer (tests, checkpoints). The graphs
// do not depend on the rank (shards are data), so every rank traces the same graph and the
// layers work inside scan_layers. Thread-safety: as any module.
#pragma once

#include "loom/nn/nn.h"

namespace loom::dist {

class ColumnParallelLinear : public nn::Module {
 public:
  ColumnParallelLinear(int64_t in_features, int64_t out_features, bool bias = true,
                       bool gather_output = true);
  Tensor forward(const Tensor& x) override;
  void load(const nn::Linear& full);
  Tensor weight, bias;
  int64_t in_features, out_features;
  bool gather_output;
};

class RowParallelLinear : public nn::Module {
 public:
  RowParallelLinear(int64_t in_features, int64_t out_features, bool bias = true);
  // x: this rank's in_features / world input features (a column-parallel output).
  Tensor forward(const Tensor& x) override;
  void load(const nn::Linear& full);
  Tensor weight, bias;
  int64_t in_features, out_features;
};

class ShardedCausalSelfAttention : public nn::Module {
 public:
  ShardedCausalSelfAttention(int64_t dim, int64_t heads);
  Tensor forward(const Tensor& x) override;
  void load(const nn::CausalSelfAttention& full);
  std::shared_ptr<ColumnParallelLinear> qkv;  // [3 * dim / world, dim]: q, k, v of local heads
  std::shared_ptr<RowParallelLinear> proj;
  int64_t dim, heads, local_heads;
};

}  // namespace loom::dist
