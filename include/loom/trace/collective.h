// Collectives as lazy graph ops (ops.def's dist family); loom/dist/dist.h includes this.
//
// Each call records a node in the pending graph, like any op: it runs when the graph runs, on
// every rank, through the current dist::Communicator (loom/core/communicator.h). Every rank
// must run the same graphs: rank-dependent data enters as inputs, never as graph structure
// (the runtime compares the graphs' fingerprints across ranks before each run and raises a
// DistError naming the ranks and the first differing op when they differ).
//
//   Tensor g = loom::dist::all_reduce(local_grad, loom::dist::ReduceOp::Mean);
//
// Two identical collectives of the same value are one (hash-consing and CSE merge them, the
// same way on every rank); a collective no output needs is not run, on any rank.
// Gradients: the objective is the sum of the ranks' objectives (all_reduce's adjoint is the
// all_reduce of the adjoints; all_gather and reduce_scatter are each other's adjoints), unless
// `replicated` says every rank computes the same objective from the result (tensor parallel:
// the adjoint is then the rank's own share). grad_all_reduce is Megatron's f: identity
// forward, all_reduce of the adjoint backward. Thread-safety: as every op (the thread's graph).
#pragma once

#include <vector>

#include "loom/core/communicator.h"
#include "loom/trace/tensor.h"

namespace loom::dist {

// Sum, Mean (floating dtypes), Max or Min over the ranks, elementwise.
Tensor all_reduce(const Tensor& t, ReduceOp op = ReduceOp::Sum, bool replicated = false);
// The ranks' tensors concatenated along dim, in rank order.
Tensor all_gather(const Tensor& t, int64_t dim = 0, bool replicated = false);
// t split into world() blocks along dim; rank r gets the reduction (Sum or Mean) of block r.
Tensor reduce_scatter(const Tensor& t, int64_t dim = 0, ReduceOp op = ReduceOp::Sum);
// root's t on every rank (no gradient).
Tensor broadcast(const Tensor& t, int root = 0);
// t, whose gradient is summed over the ranks (Megatron's f).
Tensor grad_all_reduce(const Tensor& t);

// The parallel layers' steps, shared by loom::dist's modules and loom.distributed's.
// DataParallel's reduce: every grad replaced in place (gradients off) by its mean over the
// ranks, one all_reduce per bucket of up to `bucket_bytes` of grads of one dtype (a bucket
// holds at least one grad; a dtype's bucket stays open while grads of other dtypes come).
void average_in_buckets(const std::vector<Tensor>& grads, double bucket_bytes);
// Megatron's column-parallel product: x (replicated; its gradient summed over the ranks) times
// this rank's rows w [out / world, in] (+ b), all_gathered on the last dim if gather_output.
Tensor column_parallel_linear(const Tensor& x, const Tensor& w, const Tensor& b,
                              bool gather_output);
// The row-parallel product: x holds this rank's in / world features, w [out, in / world]; the
// partial products are all_reduced, then the replicated b is added.
Tensor row_parallel_linear(const Tensor& x, const Tensor& w, const Tensor& b);

}  // namespace loom::dist
