// Hashing helpers: a fast 64-bit mixer for hash tables and a 128-bit hasher for structural
// fingerprints. Deterministic across runs and platforms (no pointer or seed randomness).
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace loom {

inline uint64_t hash_mix(uint64_t x) {  // splitmix64 finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}
inline uint64_t hash_combine(uint64_t seed, uint64_t v) {
  return hash_mix(seed ^ (v + 0x9e3779b97f4a7c15ULL + (seed << 6) + (seed >> 2)));
}

struct Hash128 {
  uint64_t lo = 0, hi = 0;
  friend bool operator==(const Hash128& a, const Hash128& b) { return a.lo == b.lo && a.hi == b.hi; }
  friend bool operator<(const Hash128& a, const Hash128& b) {
    return a.hi != b.hi ? a.hi < b.hi : a.lo < b.lo;
  }
  std::string hex() const;  // 32 lowercase hex digits
};

// Two independent 64-bit lanes fed with every word; order-sensitive.
class Hasher128 {
 public:
  // One multiply per lane and word (the lanes run in parallel); finish() mixes fully.
  void add(uint64_t v) {
    a_ = (rotl(a_, 23) ^ v) * 0x9e3779b97f4a7c15ULL;
    b_ = (rotl(b_, 41) + (v ^ 0x632be59bd9b4e019ULL)) * 0xff51afd7ed558ccdULL;
    ++n_;
  }
  void add_double(double d) {
    uint64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    add(bits);
  }
  void add_string(std::string_view s) {
    add(s.size());
    for (char c : s) add(static_cast<unsigned char>(c));
  }
  Hash128 finish() const {
    uint64_t a = hash_mix(a_ ^ n_), b = hash_mix(b_ + 0x27d4eb2f165667c5ULL * n_);
    return {hash_mix(a ^ (b >> 17)), hash_mix(b + a)};
  }

 private:
  static uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
  uint64_t a_ = 0x243f6a8885a308d3ULL, b_ = 0x13198a2e03707344ULL, n_ = 0;
};

}  // namespace loom
