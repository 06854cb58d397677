// The reference backend's element access and conversion rules, and its index arithmetic.
// These few functions define how every dtype is read, rounded and wrapped, so all kernels
// agree on the edge cases (NaN to int, overflow, double rounding to 16-bit floats).
#include <cmath>
#include <cstring>
#include <limits>

#include "backend/ref/ref_impl.h"
#include "loom/core/error.h"
#include "loom/core/half.h"

namespace loom::detail::ref {

namespace {

template <class T>
T load(const Buffer& b, int64_t i) {
  T v;
  std::memcpy(&v, static_cast<const char*>(b.data()) + i * static_cast<int64_t>(sizeof(T)),
              sizeof(T));
  return v;
}

template <class T>
void store(Buffer& b, int64_t i, T v) {
  std::memcpy(static_cast<char*>(b.data()) + i * static_cast<int64_t>(sizeof(T)), &v, sizeof(T));
}

// Rounds |d| toward zero to float and sets the last bit when that was inexact ("round to
// odd"); a later round-to-nearest-even to fewer bits then equals rounding d directly.
float round_to_odd_float(double d) {
  if (std::isnan(d)) return std::numeric_limits<float>::quiet_NaN();
  double a = std::fabs(d);
  float f = static_cast<float>(a);
  if (static_cast<double>(f) != a) {
    if (static_cast<double>(f) > a) f = std::nextafter(f, 0.0f);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u |= 1u;
    std::memcpy(&f, &u, 4);
  }
  return std::signbit(d) ? -f : f;
}

}  // namespace

int64_t float_to_int(double v, int64_t lo, int64_t hi) {
  if (std::isnan(v)) return 0;
  double t = std::trunc(v);
  // (double)hi may round up (2^63 for int64); >= then catches every value that would overflow.
  if (t >= static_cast<double>(hi)) return hi;
  if (t <= static_cast<double>(lo)) return lo;
  return static_cast<int64_t>(t);
}

int64_t dtype_lowest(DType t) {
  switch (t) {
    case DType::Bool: return 0;
    case DType::Int32: return std::numeric_limits<int32_t>::lowest();
    default: return std::numeric_limits<int64_t>::lowest();
  }
}

int64_t dtype_highest(DType t) {
  switch (t) {
    case DType::Bool: return 1;
    case DType::Int32: return std::numeric_limits<int32_t>::max();
    default: return std::numeric_limits<int64_t>::max();
  }
}

int64_t wrap_int(int64_t v, DType t) {
  if (t == DType::Bool) return v != 0;
  // Modular conversion is well defined since C++20.
  if (t == DType::Int32) return static_cast<int32_t>(static_cast<uint32_t>(v));
  return v;
}

uint16_t double_to_bf16(double v) { return float_to_bf16(round_to_odd_float(v)); }
uint16_t double_to_f16(double v) { return float_to_f16(round_to_odd_float(v)); }

double round_to_dtype(double v, DType t) {
  switch (t) {
    case DType::BFloat16: return bf16_to_float(double_to_bf16(v));
    case DType::Float16: return f16_to_float(double_to_f16(v));
    case DType::Float32: return static_cast<float>(v);
    default: return v;
  }
}

double Array::get_f(int64_t i) const {
  switch (type.dtype) {
    case DType::Bool: return load<uint8_t>(buf, i) != 0 ? 1.0 : 0.0;
    case DType::Int32: return load<int32_t>(buf, i);
    case DType::Int64: return static_cast<double>(load<int64_t>(buf, i));
    case DType::BFloat16: return bf16_to_float(load<uint16_t>(buf, i));
    case DType::Float16: return f16_to_float(load<uint16_t>(buf, i));
    case DType::Float32: return load<float>(buf, i);
    case DType::Float64: return load<double>(buf, i);
  }
  LOOM_ASSERT(false);
  return 0;
}

int64_t Array::get_i(int64_t i) const {
  switch (type.dtype) {
    case DType::Bool: return load<uint8_t>(buf, i) != 0;
    case DType::Int32: return load<int32_t>(buf, i);
    case DType::Int64: return load<int64_t>(buf, i);
    default:
      return float_to_int(get_f(i), std::numeric_limits<int64_t>::lowest(),
                          std::numeric_limits<int64_t>::max());
  }
}

void Array::set_f(int64_t i, double v) {
  switch (type.dtype) {
    case DType::Bool: return store<uint8_t>(buf, i, v != 0 ? 1 : 0);  // NaN != 0: true
    case DType::Int32:
      return store<int32_t>(buf, i,
                            static_cast<int32_t>(float_to_int(v, dtype_lowest(DType::Int32),
                                                              dtype_highest(DType::Int32))));
    case DType::Int64:
      return store<int64_t>(
          buf, i, float_to_int(v, dtype_lowest(DType::Int64), dtype_highest(DType::Int64)));
    case DType::BFloat16: return store<uint16_t>(buf, i, double_to_bf16(v));
    case DType::Float16: return store<uint16_t>(buf, i, double_to_f16(v));
    case DType::Float32: return store<float>(buf, i, static_cast<float>(v));
    case DType::Float64: return store<double>(buf, i, v);
  }
}

void Array::set_i(int64_t i, int64_t v) {
  switch (type.dtype) {
    case DType::Bool: return store<uint8_t>(buf, i, v != 0 ? 1 : 0);
    case DType::Int32:
      return store<int32_t>(buf, i, static_cast<int32_t>(wrap_int(v, DType::Int32)));
    case DType::Int64: return store<int64_t>(buf, i, v);
    // int64 -> float32 rounds once here; for bf16/f16 the int64 -> double step is exact up to
    // 2^53, far beyond float16's range and where bfloat16 ties are vanishingly rare.
    case DType::Float32: return store<float>(buf, i, static_cast<float>(v));
    default: return set_f(i, static_cast<double>(v));
  }
}

void Array::copy_from(int64_t di, const Array& src, int64_t si) {
  LOOM_ASSERT(src.type.dtype == type.dtype);
  const int64_t size = itemsize(type.dtype);
  std::memcpy(static_cast<char*>(buf.data()) + di * size,
              static_cast<const char*>(src.buf.data()) + si * size, static_cast<size_t>(size));
}

Array make_array(const TensorType& t) {
  return Array{t, Buffer::allocate(static_cast<size_t>(t.nbytes()))};
}

BroadcastIndex::BroadcastIndex(const Shape& out, const Shape& in)
    : out_dims_(out.begin(), out.end()), in_strides_(out.size(), 0) {
  LOOM_ASSERT(in.size() <= out.size());
  const size_t lead = out.size() - in.size();
  int64_t stride = 1;
  for (size_t d = in.size(); d-- > 0;) {
    LOOM_ASSERT(in[d] == out[lead + d] || in[d] == 1);
    in_strides_[lead + d] = in[d] == 1 ? 0 : stride;
    stride *= in[d];
  }
}

int64_t BroadcastIndex::operator()(int64_t out_index) const {
  int64_t in_index = 0;
  for (size_t d = out_dims_.size(); d-- > 0;) {
    in_index += (out_index % out_dims_[d]) * in_strides_[d];
    out_index /= out_dims_[d];
  }
  return in_index;
}

std::vector<int64_t> unravel(int64_t index, const Shape& s) {
  std::vector<int64_t> coords(s.size());
  for (size_t d = s.size(); d-- > 0;) {
    coords[d] = index % s[d];
    index /= s[d];
  }
  return coords;
}

int64_t ravel(std::span<const int64_t> coords, const Shape& s) {
  int64_t index = 0;
  for (size_t d = 0; d < s.size(); ++d) index = index * s[d] + coords[d];
  return index;
}

int64_t node_axis(const ir::Node& node, int64_t rank) {
  const int64_t axis = node.attrs.i < 0 ? node.attrs.i + rank : node.attrs.i;
  LOOM_ASSERT(axis >= 0 && axis < rank);
  return axis;
}

}  // namespace loom::detail::ref
