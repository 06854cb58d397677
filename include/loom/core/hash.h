// Hashing helpers: a fast 64-bit mixer for hash tables, and `Hasher128`, XXH3-128 (xxHash,
// SMHasher-tested) over the bytes fed to it, for structural fingerprints, the builder's Merkle
// hashes, trace keys and the persistent cache's keys and checksums. A 128-bit collision there
// would run the wrong executable, so those never use the 64-bit mixer.
//
//   Hasher128 h;
//   h.add(uint64_t{n}); h.add_string(name); h.add(other_hash);
//   Hash128 fp = h.finish();  // == XXH3_128bits of the little-endian bytes fed, in order
//
// Deterministic across runs and platforms (no pointer or seed randomness). Words are fed in
// native byte order (loom runs on little-endian machines only). Inputs up to kInline bytes
// stay in the object and are hashed in one shot by finish(); longer ones stream through an
// XXH3 state kept in the object too (no allocation). xxhash.h stays in src/core/hash.cpp.
// Thread-safety: a Hasher128 is a plain value; use one per thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
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
  friend bool operator==(const Hash128& a, const Hash128& b) {
    return a.lo == b.lo && a.hi == b.hi;
  }
  friend bool operator<(const Hash128& a, const Hash128& b) {
    return a.hi != b.hi ? a.hi < b.hi : a.lo < b.lo;
  }
  std::string hex() const;  // 32 lowercase hex digits
};

// XXH3-128 of `n` bytes at `data` (one shot).
Hash128 hash128(const void* data, size_t n);

// XXH3-128 over everything added, in order; order-sensitive. add_string is self-delimiting
// (length first), add and add_double feed 8 bytes, add_bytes feeds raw bytes.
class Hasher128 {
 public:
  static constexpr size_t kInline = 256;  // bytes hashed in one shot by finish()

  void add(uint64_t v) {
    if (n_ + 8 > kInline) [[unlikely]]
      spill();
    std::memcpy(buf_ + n_, &v, 8);
    n_ += 8;
  }
  void add(const Hash128& h) {
    add(h.lo);
    add(h.hi);
  }
  void add_double(double d) {
    uint64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    add(bits);
  }
  void add_string(std::string_view s) {
    add(s.size());
    add_bytes(s.data(), s.size());
  }
  void add_bytes(const void* p, size_t n) {
    if (n_ + n > kInline) [[unlikely]]
      return add_long(p, n);
    std::memcpy(buf_ + n_, p, n);
    n_ += n;
  }
  Hash128 finish() const;

 private:
  void spill();                            // moves buf_ into the stream state
  void add_long(const void* p, size_t n);  // spill, then stream p directly

  // An XXH3_state_t (576 bytes, checked in hash.cpp), set up on the first spill.
  alignas(64) unsigned char state_[640];
  unsigned char buf_[kInline];
  size_t n_ = 0;
  bool streaming_ = false;
};

}  // namespace loom
