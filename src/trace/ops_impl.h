// Helpers shared by the op implementations of the trace room.
#pragma once

#include "loom/core/buffer.h"
#include "trace/context.h"

namespace loom::detail {

// Counts one recorded op and times one op in kTraceSample (reading the cycle counter costs
// about 10 ns here, a tenth of an op); the sampled time is scaled when flushed.
struct OpRecord {
  static constexpr int64_t kTraceSample = 8;
  TraceContext& ctx = TraceContext::get();
  bool timed = ctx.ops_traced % kTraceSample == 0;
  uint64_t t0 = timed ? ticks() : 0;
  ~OpRecord() {
    if (timed) ctx.trace_ticks += (ticks() - t0) * kTraceSample;
    ++ctx.ops_traced;
  }
  ir::Builder& b() { return ctx.builder(); }
};

Tensor from_buffer(Buffer b, TensorType type);
// An operand's type, read from its impl (Tensor::dtype() and shape() are out-of-line calls,
// several per recorded op); an undefined operand is an Error naming `op`.
[[noreturn]] void undefined_operand(const char* op);
inline const TensorType& type_of(const Tensor& t, const char* op) {
  if (!t.defined()) [[unlikely]]
    undefined_operand(op);
  return t.impl()->type;
}
// PyTorch's result type of a binary op between tensors / a tensor and a host number.
DType result_type(const Tensor& a, const Tensor& b);
DType result_type(const TensorType& a, const TensorType& b);
DType result_type(const Tensor& a, const Scalar& s);
// Normalized, sorted, unique reduction dims; empty `dims` means all.
std::vector<int64_t> reduce_dims(const char* op, const Tensor& x, std::vector<int64_t> dims);

}  // namespace loom::detail
