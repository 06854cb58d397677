// Elementwise reductions for the communicators: acc = acc op x over n elements of one dtype
// (bfloat16 and float16 through float, bool as logical or/and), and Mean's final division.
#pragma once

#include <cstdint>

#include "loom/core/communicator.h"
#include "loom/core/dtype.h"

namespace loom::dist::detail {

// acc[i] = op(acc[i], x[i]); Mean accumulates like Sum.
void reduce_into(void* acc, const void* x, int64_t n, DType dt, ReduceOp op);
// data[i] /= world (floating dtypes).
void divide(void* data, int64_t n, DType dt, int world);
// DTypeError unless `op` applies to dt (Mean needs a floating dtype).
void check_reduce(const char* who, DType dt, ReduceOp op);

}  // namespace loom::dist::detail
