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
#include <cmath>
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

// Standard normal by Box-Muller over two uniforms of the same block.
inline double philox_normal(uint64_t seed, uint64_t offset, uint64_t e) {
  auto r = philox_block(seed, offset, e / 2);
  int lane = static_cast<int>(e % 2) * 2;
  double u1 = (static_cast<double>(r[lane] >> 8) + 1.0) * (1.0 / 16777216.0);  // (0, 1]
  double u2 = static_cast<double>(r[lane + 1] >> 8) * (1.0 / 16777216.0);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace loom
