// Elementwise reductions shared by the communicators (reduce_impl.h).
#include <algorithm>

#include "distributed/reduce_impl.h"
#include "loom/core/error.h"
#include "loom/core/half.h"

namespace loom::dist::detail {

namespace {

template <class T>
void apply(T* a, const T* x, int64_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Mean:
      for (int64_t i = 0; i < n; ++i) a[i] = static_cast<T>(a[i] + x[i]);
      break;
    case ReduceOp::Max:
      for (int64_t i = 0; i < n; ++i) a[i] = (x[i] > a[i] || x[i] != x[i]) ? x[i] : a[i];
      break;
    case ReduceOp::Min:
      for (int64_t i = 0; i < n; ++i) a[i] = (x[i] < a[i] || x[i] != x[i]) ? x[i] : a[i];
      break;
  }
}

template <float (*Load)(uint16_t), uint16_t (*Store)(float)>
void apply16(uint16_t* a, const uint16_t* x, int64_t n, ReduceOp op) {
  for (int64_t i = 0; i < n; ++i) {
    float p = Load(a[i]), q = Load(x[i]), r;
    switch (op) {
      case ReduceOp::Max: r = (q > p || q != q) ? q : p; break;
      case ReduceOp::Min: r = (q < p || q != q) ? q : p; break;
      default: r = p + q;
    }
    a[i] = Store(r);
  }
}

}  // namespace

void reduce_into(void* acc, const void* x, int64_t n, DType dt, ReduceOp op) {
  switch (dt) {
    case DType::Bool: {
      auto* a = static_cast<uint8_t*>(acc);
      auto* b = static_cast<const uint8_t*>(x);
      for (int64_t i = 0; i < n; ++i) a[i] = op == ReduceOp::Min ? (a[i] && b[i]) : (a[i] || b[i]);
      break;
    }
    case DType::Int32:
      apply(static_cast<int32_t*>(acc), static_cast<const int32_t*>(x), n, op);
      break;
    case DType::Int64:
      apply(static_cast<int64_t*>(acc), static_cast<const int64_t*>(x), n, op);
      break;
    case DType::BFloat16:
      apply16<bf16_to_float, float_to_bf16>(static_cast<uint16_t*>(acc),
                                            static_cast<const uint16_t*>(x), n, op);
      break;
    case DType::Float16:
      apply16<f16_to_float, float_to_f16>(static_cast<uint16_t*>(acc),
                                          static_cast<const uint16_t*>(x), n, op);
      break;
    case DType::Float32:
      apply(static_cast<float*>(acc), static_cast<const float*>(x), n, op);
      break;
    case DType::Float64:
      apply(static_cast<double*>(acc), static_cast<const double*>(x), n, op);
      break;
  }
}

void divide(void* data, int64_t n, DType dt, int world) {
  switch (dt) {
    case DType::Float32: {
      auto* p = static_cast<float*>(data);
      for (int64_t i = 0; i < n; ++i) p[i] /= static_cast<float>(world);
      break;
    }
    case DType::Float64: {
      auto* p = static_cast<double*>(data);
      for (int64_t i = 0; i < n; ++i) p[i] /= world;
      break;
    }
    case DType::BFloat16:
    case DType::Float16: {
      auto* p = static_cast<uint16_t*>(data);
      const bool bf = dt == DType::BFloat16;
      for (int64_t i = 0; i < n; ++i) {
        float v = (bf ? bf16_to_float(p[i]) : f16_to_float(p[i])) / static_cast<float>(world);
        p[i] = bf ? float_to_bf16(v) : float_to_f16(v);
      }
      break;
    }
    default: LOOM_ASSERT(false);
  }
}

void check_reduce(const char* who, DType dt, ReduceOp op) {
  LOOM_CHECK_T(DTypeError, op != ReduceOp::Mean || is_floating(dt), "[", who,
               "] mean needs a floating dtype, got ", dt);
}

}  // namespace loom::dist::detail
