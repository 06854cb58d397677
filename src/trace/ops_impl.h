// Helpers shared by the op implementations of the trace room.
#pragma once

#include "loom/core/buffer.h"
#include "trace/context.h"

namespace loom::detail {

// Times one recorded op into the thread's trace counters.
struct OpRecord {
  TraceContext& ctx = TraceContext::get();
  uint64_t t0 = ticks();
  ~OpRecord() {
    ctx.trace_ticks += ticks() - t0;
    ++ctx.ops_traced;
  }
  ir::Builder& b() { return ctx.builder(); }
};

Tensor from_buffer(Buffer b, TensorType type);
// PyTorch's result type of a binary op between tensors / a tensor and a host number.
DType result_type(const Tensor& a, const Tensor& b);
DType result_type(const Tensor& a, const Scalar& s);
// Normalized, sorted, unique reduction dims; empty `dims` means all.
std::vector<int64_t> reduce_dims(const char* op, const Tensor& x, std::vector<int64_t> dims);

}  // namespace loom::detail
