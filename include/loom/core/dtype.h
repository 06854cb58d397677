// DType: the element types of loom tensors, after MLX (loom::float32, loom::int64, ...).
//
// bfloat16 and float16 are storage types: kernels may compute them in float32. Promotion
// follows PyTorch (see promote_types). Value type, thread-safe.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string_view>

namespace loom {

enum class DType : uint8_t { Bool, Int32, Int64, BFloat16, Float16, Float32, Float64 };
inline constexpr int kNumDTypes = 7;

inline constexpr DType bool_ = DType::Bool;
inline constexpr DType int32 = DType::Int32;
inline constexpr DType int64 = DType::Int64;
inline constexpr DType bfloat16 = DType::BFloat16;
inline constexpr DType float16 = DType::Float16;
inline constexpr DType float32 = DType::Float32;
inline constexpr DType float64 = DType::Float64;

constexpr int64_t itemsize(DType t) {
  switch (t) {
    case DType::Bool: return 1;
    case DType::Int32: return 4;
    case DType::Int64: return 8;
    case DType::BFloat16:
    case DType::Float16: return 2;
    case DType::Float32: return 4;
    case DType::Float64: return 8;
  }
  return 0;
}
constexpr bool is_floating(DType t) { return t >= DType::BFloat16; }
constexpr bool is_integral(DType t) { return t == DType::Int32 || t == DType::Int64; }

// Short name used by the IR text: bool i32 i64 bf16 f16 f32 f64.
std::string_view short_name(DType t);
// Long name used in messages and printing: "float32".
std::string_view name(DType t);
// Parses a short name; returns false when the text names no dtype.
bool parse_dtype(std::string_view text, DType* out);
// PyTorch's promote_types: bool < integers < floats; bfloat16 with float16 gives float32.
DType promote_types(DType a, DType b);

std::ostream& operator<<(std::ostream& os, DType t);

}  // namespace loom
