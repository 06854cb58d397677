// Tests of core/half.h against bit patterns worked out by hand and an independent decoder
// (sign * 2^e * 1.m with std::ldexp): exact values, ties to even, NaN/Inf, float16
// subnormals and overflow.
#include "loom/core/half.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

namespace loom {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Decodes a 16-bit float with `mbits` mantissa bits and exponent bias `bias` by its definition.
double decode(uint16_t h, int mbits, int bias) {
  const int ebits = 15 - mbits;
  const int sign = h >> 15, e = (h >> mbits) & ((1 << ebits) - 1);
  const int m = h & ((1 << mbits) - 1);
  double v;
  if (e == (1 << ebits) - 1) {
    v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (e == 0) {
    v = std::ldexp(m, 1 - bias - mbits);
  } else {
    v = std::ldexp((1 << mbits) + m, e - bias - mbits);
  }
  return sign ? -v : v;
}

TEST(HalfBF16, ExactValues) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(-2.0f), 0xc000);
  EXPECT_EQ(float_to_bf16(0.5f), 0x3f00);
  EXPECT_EQ(float_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bf16(3.140625f), 0x4049);
  EXPECT_EQ(bf16_to_float(0x4049), 3.140625f);
  EXPECT_EQ(bf16_to_float(0x0001), std::ldexp(1.0f, -133));  // smallest subnormal
}

TEST(HalfBF16, RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(from_bits(0x3f808000u)), 0x3f80);  // 1 + 2^-8: tie, down to even
  EXPECT_EQ(float_to_bf16(from_bits(0x3f818000u)), 0x3f82);  // 1 + 3*2^-8: tie, up to even
  EXPECT_EQ(float_to_bf16(from_bits(0x3f808001u)), 0x3f81);  // just above the tie
  EXPECT_EQ(float_to_bf16(from_bits(0x3f807fffu)), 0x3f80);  // just below the tie
  EXPECT_EQ(float_to_bf16(3.14159265f), 0x4049);
  EXPECT_EQ(float_to_bf16(-3.14159265f), 0xc049);
}

TEST(HalfBF16, InfNaNAndOverflow) {
  EXPECT_EQ(float_to_bf16(kInf), 0x7f80);
  EXPECT_EQ(float_to_bf16(-kInf), 0xff80);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds past bf16 max
  EXPECT_EQ(float_to_bf16(from_bits(0x7f7f7fffu)), 0x7f7f);  // the largest finite bf16 stays
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(kNaN))));
  // A NaN whose payload sits in the low 16 bits must not become Inf.
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(from_bits(0x7f800001u)))));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(from_bits(0xff800001u)))));
  EXPECT_EQ(bf16_to_float(0x7f80), kInf);
}

// Every bf16 bit pattern decodes to its defined value and encodes back to itself.
TEST(HalfBF16, AllPatternsRoundTrip) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const double want = decode(static_cast<uint16_t>(h), 7, 127);
    const float f = bf16_to_float(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << h;
      continue;
    }
    EXPECT_EQ(static_cast<double>(f), want) << std::hex << h;
    EXPECT_EQ(float_to_bf16(f), h) << std::hex << h;
  }
}

TEST(HalfF16, ExactValues) {
  EXPECT_EQ(float_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(float_to_f16(0.5f), 0x3800);
  EXPECT_EQ(float_to_f16(65504.0f), 0x7bff);  // the largest finite float16
  EXPECT_EQ(float_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -14)), 0x0400);  // the smallest normal
  EXPECT_EQ(f16_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_float(0x3555), 0x1.554p-2f);  // 0.333251953125
}

TEST(HalfF16, RoundsToNearestEven) {
  EXPECT_EQ(float_to_f16(1.0f + 0x1p-11f), 0x3c00);             // tie, down to even
  EXPECT_EQ(float_to_f16(1.0f + 0x3p-11f), 0x3c02);             // tie, up to even
  EXPECT_EQ(float_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);  // above the tie
  EXPECT_EQ(float_to_f16(2049.0f), 0x6800);                     // ulp 2 at 2048: tie to 2048
  EXPECT_EQ(float_to_f16(2051.0f), 0x6802);                     // tie to 2052
  EXPECT_EQ(float_to_f16(0.1f), 0x2e66);
}

TEST(HalfF16, Subnormals) {
  EXPECT_EQ(float_to_f16(0x1p-24f), 0x0001);    // the smallest subnormal
  EXPECT_EQ(float_to_f16(0x3ffp-24f), 0x03ff);  // the largest subnormal
  EXPECT_EQ(float_to_f16(0x1p-25f), 0x0000);    // tie between 0 and 2^-24: even
  EXPECT_EQ(float_to_f16(0x1.8p-25f), 0x0001);  // above that tie
  EXPECT_EQ(float_to_f16(0x3p-25f), 0x0002);    // tie between 1 and 2 ulps: even
  EXPECT_EQ(float_to_f16(0x5p-25f), 0x0002);    // tie between 2 and 3 ulps: even
  EXPECT_EQ(float_to_f16(-0x1p-24f), 0x8001);
  EXPECT_EQ(float_to_f16(0x1p-30f), 0x0000);    // underflows to zero
  EXPECT_EQ(float_to_f16(0x7ffp-25f), 0x0400);  // rounds up into the normals
  EXPECT_EQ(f16_to_float(0x0001), 0x1p-24f);
  EXPECT_EQ(f16_to_float(0x0200), 0x1p-15f);
  EXPECT_EQ(f16_to_float(0x83ff), -0x3ffp-24f);
}

TEST(HalfF16, InfNaNAndOverflow) {
  EXPECT_EQ(float_to_f16(kInf), 0x7c00);
  EXPECT_EQ(float_to_f16(-kInf), 0xfc00);
  EXPECT_EQ(float_to_f16(65519.0f), 0x7bff);  // under the overflow tie
  EXPECT_EQ(float_to_f16(65520.0f), 0x7c00);  // the tie rounds to even: Inf
  EXPECT_EQ(float_to_f16(1e6f), 0x7c00);
  EXPECT_EQ(float_to_f16(-1e6f), 0xfc00);
  EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(kNaN))));
  EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(from_bits(0x7f800001u)))));
  EXPECT_EQ(f16_to_float(0x7c00), kInf);
  EXPECT_EQ(f16_to_float(0xfc00), -kInf);
}

// Every float16 bit pattern decodes to its defined value and encodes back to itself.
TEST(HalfF16, AllPatternsRoundTrip) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const double want = decode(static_cast<uint16_t>(h), 10, 15);
    const float f = f16_to_float(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << h;
      continue;
    }
    EXPECT_EQ(static_cast<double>(f), want) << std::hex << h;
    EXPECT_EQ(float_to_f16(f), h) << std::hex << h;
  }
}

}  // namespace
}  // namespace loom
