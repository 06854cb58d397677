// Helpers of the reference-backend tests: a Case owns a graph, its builder and the input
// buffers, and runs the graph on the ref backend. Values go in and come out through the test's
// own encoders (plain casts and core/half.h), never the backend's conversion code, so the
// expected values stay an independent oracle.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "loom/backend/ref_backend.h"
#include "loom/core/half.h"
#include "loom/ir/builder.h"
#include "test_constants.h"

namespace loom::reftest {

using testing::kI32Max;
using testing::kI32Min;
using testing::kI64Max;
using testing::kI64Min;
using testing::kInf;
using testing::kNaN;

inline Buffer encode_floats(DType dt, const std::vector<double>& v) {
  Buffer b = Buffer::allocate(v.size() * static_cast<size_t>(itemsize(dt)));
  for (size_t i = 0; i < v.size(); ++i) {
    switch (dt) {
      case DType::Bool: b.as<uint8_t>()[i] = v[i] != 0; break;
      case DType::Int32: b.as<int32_t>()[i] = static_cast<int32_t>(v[i]); break;
      case DType::Int64: b.as<int64_t>()[i] = static_cast<int64_t>(v[i]); break;
      case DType::BFloat16: b.as<uint16_t>()[i] = float_to_bf16(static_cast<float>(v[i])); break;
      case DType::Float16: b.as<uint16_t>()[i] = float_to_f16(static_cast<float>(v[i])); break;
      case DType::Float32: b.as<float>()[i] = static_cast<float>(v[i]); break;
      case DType::Float64: b.as<double>()[i] = v[i]; break;
    }
  }
  return b;
}

inline Buffer encode_ints(DType dt, const std::vector<int64_t>& v) {
  Buffer b = Buffer::allocate(v.size() * static_cast<size_t>(itemsize(dt)));
  for (size_t i = 0; i < v.size(); ++i) {
    switch (dt) {
      case DType::Bool: b.as<uint8_t>()[i] = v[i] != 0; break;
      case DType::Int32: b.as<int32_t>()[i] = static_cast<int32_t>(v[i]); break;
      case DType::Int64: b.as<int64_t>()[i] = v[i]; break;
      default: ADD_FAILURE() << "encode_ints of " << dt;
    }
  }
  return b;
}

inline std::vector<double> decode_floats(DType dt, const Buffer& b) {
  const size_t n = b.nbytes() / static_cast<size_t>(itemsize(dt));
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) {
    switch (dt) {
      case DType::Bool: v[i] = b.as<uint8_t>()[i]; break;
      case DType::Int32: v[i] = b.as<int32_t>()[i]; break;
      case DType::Int64: v[i] = static_cast<double>(b.as<int64_t>()[i]); break;
      case DType::BFloat16: v[i] = bf16_to_float(b.as<uint16_t>()[i]); break;
      case DType::Float16: v[i] = f16_to_float(b.as<uint16_t>()[i]); break;
      case DType::Float32: v[i] = b.as<float>()[i]; break;
      case DType::Float64: v[i] = b.as<double>()[i]; break;
    }
  }
  return v;
}

inline std::vector<int64_t> decode_ints(DType dt, const Buffer& b) {
  const size_t n = b.nbytes() / static_cast<size_t>(itemsize(dt));
  std::vector<int64_t> v(n);
  for (size_t i = 0; i < n; ++i) {
    switch (dt) {
      case DType::Bool: v[i] = b.as<uint8_t>()[i]; break;
      case DType::Int32: v[i] = b.as<int32_t>()[i]; break;
      case DType::Int64: v[i] = b.as<int64_t>()[i]; break;
      default: ADD_FAILURE() << "decode_ints of " << dt;
    }
  }
  return v;
}

// The oracle's rounding of a double to dtype dt (through float for the 16-bit types; the
// rare double-rounding tie is covered by the tolerance of expect_floats).
inline double round_like(DType dt, double v) {
  switch (dt) {
    case DType::BFloat16: return bf16_to_float(float_to_bf16(static_cast<float>(v)));
    case DType::Float16: return f16_to_float(float_to_f16(static_cast<float>(v)));
    case DType::Float32: return static_cast<float>(v);
    default: return v;
  }
}

// Exact for f32/f64 (the backend and the oracle both round one double once); within one unit
// in the last place for bf16/f16. NaN must match NaN, infinities must match exactly.
inline void expect_floats(DType dt, const std::vector<double>& got,
                          const std::vector<double>& want_exact) {
  ASSERT_EQ(got.size(), want_exact.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const double want = round_like(dt, want_exact[i]);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got[i])) << "element " << i << ": got " << got[i];
    } else if (std::isinf(want) || dt == DType::Float32 || dt == DType::Float64) {
      EXPECT_EQ(got[i], want) << "element " << i << " of " << dt;
    } else {
      const double ulp = dt == DType::BFloat16 ? 0x1p-7 : 0x1p-10;
      EXPECT_NEAR(got[i], want, ulp * std::fabs(want) + 1e-7) << "element " << i << " of " << dt;
    }
  }
}

// One graph under construction, with the inputs that its parameters will receive.
struct Case {
  ir::Graph g;
  ir::Builder b{g};
  std::vector<Buffer> inputs;

  ir::Value param(DType dt, const Shape& s, const std::vector<double>& v) {
    EXPECT_EQ(static_cast<int64_t>(v.size()), s.numel());
    inputs.push_back(encode_floats(dt, v));
    return b.parameter(TensorType{dt, s});
  }
  ir::Value param_i(DType dt, const Shape& s, const std::vector<int64_t>& v) {
    EXPECT_EQ(static_cast<int64_t>(v.size()), s.numel());
    inputs.push_back(encode_ints(dt, v));
    return b.parameter(TensorType{dt, s});
  }
  std::shared_ptr<const backend::Executable> compile(const std::vector<ir::Value>& outs) {
    g.outputs() = outs;
    return backend::make_ref_backend()->compile(g, backend::CompileOptions{});
  }
  std::vector<Buffer> run(const std::vector<ir::Value>& outs) { return compile(outs)->run(inputs); }
  std::vector<double> run_f(ir::Value v) { return decode_floats(g.type(v).dtype, run({v})[0]); }
  std::vector<int64_t> run_i(ir::Value v) { return decode_ints(g.type(v).dtype, run({v})[0]); }
};

inline constexpr DType kFloatTypes[] = {DType::Float32, DType::Float64, DType::BFloat16,
                                        DType::Float16};
inline constexpr DType kIntTypes[] = {DType::Int32, DType::Int64};

}  // namespace loom::reftest
