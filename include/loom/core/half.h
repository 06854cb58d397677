// Conversions between float and the 16-bit storage types (bfloat16, float16), rounding to
// nearest even, with NaN and Inf preserved. Pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <cstring>

namespace loom {

inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_float(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> Inf
  if (ax < 0x38800000u) {  // subnormal or zero in half precision
    if (ax < 0x33000000u) return static_cast<uint16_t>(sign);  // rounds to 0 (<= 2^-25)
    uint32_t e = ax >> 23;
    uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;  // so that the value is m >> (shift) in units of 2^-24
    uint32_t half = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u);  // round mantissa to 10 bits
  r -= 0x38000000u;                              // rebias exponent 127 -> 15
  return static_cast<uint16_t>(sign | (r >> 13));
}
inline float f16_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  uint32_t u;
  if (e == 0) {
    if (m == 0) {
      u = sign;
    } else {  // subnormal: normalize
      e = 127 - 15 + 1;
      while (!(m & 0x400u)) {
        m <<= 1;
        --e;
      }
      u = sign | (e << 23) | ((m & 0x3ffu) << 13);
    }
  } else if (e == 31) {
    u = sign | 0x7f800000u | (m << 13);
  } else {
    u = sign | ((e + 127 - 15) << 23) | (m << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace loom
