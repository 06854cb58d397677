// Philox 4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11), the
// counter-based generator behind loom's random ops, and the mapping from its bits to uniform
// and normal values. Every backend calls these functions (or reproduces them bit for bit), so
// the same seed gives the same numbers everywhere. Pure functions, thread-safe.
//
// A random op has a key input int64[2] = {seed, offset}. Element e of its result uses counter
// {block_lo, block_hi, offset_lo, offset_hi} and key {seed_lo, seed_hi}, where block = e / 4
// (uniform) or e / 2 (normal, which uses two uniforms per element).
#pragma once

#include <array>
#include <cstdint>

namespace loom {

inline std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> ctr,
                                             std::array<uint32_t, 2> key) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(kM0) * ctr[0];
    uint64_t p1 = static_cast<uint64_t>(kM1) * ctr[2];
    ctr = {static_cast<uint32_t>(p1 >> 32) ^ ctr[1] ^ key[0], static_cast<uint32_t>(p1),
           static_cast<uint32_t>(p0 >> 32) ^ ctr[3] ^ key[1], static_cast<uint32_t>(p0)};
    key[0] += kW0;
    key[1] += kW1;
  }
  return ctr;
}

inline std::array<uint32_t, 4> philox_block(uint64_t seed, uint64_t offset, uint64_t block) {
  return philox4x32_10({static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                        static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32)},
                       {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
}

// Uniform in [0, 1) with 24 random bits (exact in float32).
inline double philox_uniform(uint64_t seed, uint64_t offset, uint64_t e) {
  uint32_t bits = philox_block(seed, offset, e / 4)[e % 4];
  return static_cast<double>(bits >> 8) * (1.0 / 16777216.0);
}

namespace detail {
// The constants of philox_normal_from_words, shared with the CPU backend, which reproduces it
// and computes its float64 log op with the same log. Minimax coefficients as in fdlibm: log(1 + g)
// = g - (g^2/2 - s (g^2/2 + R(s^2))) with s = g / (2 + g) for g in [sqrt(1/2) - 1, sqrt(2) - 1];
// sin x = x + x^3 S(x^2) and cos x = 1 - x^2/2 + x^4 C(x^2) for |x| <= pi/4 (coefficients lowest
// power first).
struct NormalConstants {
  static constexpr double kLn2Hi = 6.93147180369123816490e-01;  // 32 bits: k * kLn2Hi is exact
  static constexpr double kLn2Lo = 1.90821492927058770002e-10;
  static constexpr double kSqrt2 = 1.41421356237309514547e+00;
  static constexpr double kLog[7] = {6.666666666666735130e-01, 3.999999999940941908e-01,
                                     2.857142874366239149e-01, 2.222219843214978396e-01,
                                     1.818357216161805012e-01, 1.531383769920937332e-01,
                                     1.479819860511658591e-01};
  static constexpr double kSin[6] = {-1.66666666666666324348e-01, 8.33333333332248946124e-03,
                                     -1.98412698298579493134e-04, 2.75573137070700676789e-06,
                                     -2.50507602534068634195e-08, 1.58969099521155010221e-10};
  static constexpr double kCos[6] = {4.16666666666666019037e-02, -1.38888888888741095749e-03,
                                     2.48015872894767294178e-05, -2.75573143513906633035e-07,
                                     2.08757232129817482790e-09, -1.13596475577881948265e-11};
  static constexpr double kTurn = 6.283185307179586 / 16777216.0;  // 2 pi 2^-24, exactly scaled
};
}  // namespace detail

// A standard normal from two Philox words by Box-Muller: u1 = ((w1 >> 8) + 1) 2^-24 in (0, 1],
// u2 = (w2 >> 8) 2^-24 in [0, 1), sqrt(-2 log u1) cos(2 pi u2), in float64. log and cos are
// loom's own (core/philox.cpp: minimax polynomials on integer-reduced arguments, explicit
// fused multiply-adds, within 2 ulp of libm's), not libm's: the CPU backend generates the same
// operations as vector code, so every backend gives the same bits on every machine, whatever
// its libm.
double philox_normal_from_words(uint32_t w1, uint32_t w2);

// Standard normal over two uniforms of the same block.
inline double philox_normal(uint64_t seed, uint64_t offset, uint64_t e) {
  auto r = philox_block(seed, offset, e / 2);
  int lane = static_cast<int>(e % 2) * 2;
  return philox_normal_from_words(r[lane], r[lane + 1]);
}

}  // namespace loom
