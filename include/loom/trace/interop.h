// Interop: tensors over memory that loom did not allocate, and the memory of a tensor's value.
// Used by the Python bindings (numpy's buffer protocol and DLPack, both ways).
//
//   loom::Buffer b = loom::Buffer::wrap(ptr, nbytes, owner);        // owner keeps ptr alive
//   loom::Tensor t = loom::tensor_from_buffer(b, {2, 3}, loom::float32);  // shares, no copy
//   loom::Buffer v = loom::tensor_buffer(t);   // materializes t; v.data() is its row-major value
//
// Thread-safety: as Tensor (the tensor belongs to the calling thread).
#pragma once

#include "loom/core/buffer.h"
#include "loom/trace/tensor.h"

namespace loom {

// A materialized tensor whose value is `buffer`, row-major, shared and not copied. Throws a
// ShapeError when the buffer does not hold shape.numel() elements of dtype.
Tensor tensor_from_buffer(Buffer buffer, Shape shape, DType dtype);

// The buffer holding t's value, row-major and contiguous, materializing t first (runs what it
// needs). The returned copy keeps the memory alive; while it lives loom does not reuse it.
// A TraceError inside a traced body, as for every value read.
Buffer tensor_buffer(const Tensor& t, std::source_location loc = std::source_location::current());

}  // namespace loom
