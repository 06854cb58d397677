// Tests of core/philox.h: the Random123 known-answer vectors for philox4x32_10, the mapping of
// element indices to counter blocks, and statistical sanity of the uniform and normal maps.
#include "loom/core/philox.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

namespace loom {
namespace {

using Words = std::array<uint32_t, 4>;

// Known-answer vectors from Random123's kat_vectors (philox4x32, 10 rounds).
TEST(Philox, KnownAnswerZero) {
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (Words{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
}

TEST(Philox, KnownAnswerAllOnes) {
  EXPECT_EQ(philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                          {0xffffffffu, 0xffffffffu}),
            (Words{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
}

TEST(Philox, KnownAnswerPi) {
  EXPECT_EQ(philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                          {0xa4093822u, 0x299f31d0u}),
            (Words{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

// The layout documented in philox.h: counter {block_lo, block_hi, offset_lo, offset_hi}, key
// {seed_lo, seed_hi}; uniforms take the top 24 bits of word e % 4 of block e / 4.
TEST(Philox, BlockAndUniformLayout) {
  const uint64_t seed = 0x0123456789abcdefULL, offset = 0xfedcba9876543210ULL;
  const uint64_t block = (uint64_t{5} << 32) | 7;
  EXPECT_EQ(philox_block(seed, offset, block),
            philox4x32_10({7, 5, 0x76543210u, 0xfedcba98u}, {0x89abcdefu, 0x01234567u}));
  for (uint64_t e = 0; e < 12; ++e) {
    const uint32_t word = philox_block(seed, offset, e / 4)[e % 4];
    EXPECT_EQ(philox_uniform(seed, offset, e), std::ldexp(static_cast<double>(word >> 8), -24));
  }
}

TEST(Philox, UniformIsInUnitIntervalAndExactInFloat) {
  for (uint64_t e = 0; e < 4096; ++e) {
    const double u = philox_uniform(42, 7, e);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    ASSERT_EQ(static_cast<double>(static_cast<float>(u)), u);
  }
}

// 1e5 draws: the sample mean and variance must lie within 5 standard errors of the truth.
TEST(Philox, UniformMoments) {
  constexpr int kN = 100000;
  double sum = 0, sum_sq = 0;
  for (uint64_t e = 0; e < kN; ++e) {
    const double u = philox_uniform(1234, 0, e);
    sum += u;
    sum_sq += u * u;
  }
  const double mean = sum / kN, var = sum_sq / kN - mean * mean;
  EXPECT_NEAR(mean, 0.5, 5 * std::sqrt(1.0 / 12 / kN));
  // Var of (u - 1/2)^2 for a uniform is 1/80 - 1/144 = 1/180.
  EXPECT_NEAR(var, 1.0 / 12, 5 * std::sqrt(1.0 / 180 / kN));
}

TEST(Philox, NormalMoments) {
  constexpr int kN = 100000;
  double sum = 0, sum_sq = 0;
  for (uint64_t e = 0; e < kN; ++e) {
    const double z = philox_normal(99, 3, e);
    ASSERT_TRUE(std::isfinite(z));
    sum += z;
    sum_sq += z * z;
  }
  const double mean = sum / kN, var = sum_sq / kN - mean * mean;
  EXPECT_NEAR(mean, 0.0, 5 * std::sqrt(1.0 / kN));
  EXPECT_NEAR(var, 1.0, 5 * std::sqrt(2.0 / kN));  // Var(z^2) = 2 for a standard normal
}

// The normal map's own log and cos against libm in long double (an independent oracle, ~11 more
// bits): within 2 ulp of the result on the log path (cos = 1), and within 2 ulp of the radius
// on the cos path, over every u1 and u2 up to 2^14 and a stride across the rest of the 2^24
// values of each (both ends, the octant and quadrant boundaries among them).
TEST(Philox, NormalMapIsWithinTwoUlpOfLibm) {
  const long double two_pi = 6.283185307179586476925286766559L;
  const auto ulp = [](long double v) {
    return std::ldexp(1.0L, std::ilogb(static_cast<double>(v)) - 52);
  };
  auto every = [](uint32_t v) { return v < (1u << 14) ? v + 1 : v + 211; };
  for (uint32_t n = 1; n <= (1u << 24); n = every(n)) {  // u1 = n 2^-24, u2 = 0
    const double got = philox_normal_from_words((n - 1) << 8, 0);
    const long double want = std::sqrt(-2.0L * std::log(static_cast<long double>(n) / 16777216.0L));
    if (n == (1u << 24)) {
      EXPECT_EQ(got, 0.0);  // log 1 = 0
      continue;
    }
    ASSERT_LE(std::fabs(got - want), 2 * ulp(want)) << "u1 = " << n << " 2^-24";
  }
  const long double radius = std::sqrt(-2.0L * std::log(1.0L / 16777216.0L));  // u1 = 2^-24
  for (uint32_t m = 0; m < (1u << 24); m = every(m)) {
    const double got = philox_normal_from_words(0, m << 8);
    const long double want = radius * std::cos(two_pi * static_cast<long double>(m) / 16777216.0L);
    ASSERT_LE(std::fabs(got - want), 2 * ulp(radius)) << "u2 = " << m << " 2^-24";
  }
  // Exact points: a half turn is -radius, a whole one +radius.
  EXPECT_EQ(philox_normal_from_words(0, 1u << 31), -philox_normal_from_words(0, 0));
}

TEST(Philox, DifferentKeysGiveDifferentStreams) {
  int same_seed = 0, same_offset = 0;
  for (uint64_t e = 0; e < 64; ++e) {
    same_seed += philox_uniform(1, 0, e) == philox_uniform(2, 0, e);
    same_offset += philox_uniform(1, 0, e) == philox_uniform(1, 1, e);
  }
  EXPECT_LT(same_seed, 2);
  EXPECT_LT(same_offset, 2);
}

}  // namespace
}  // namespace loom
