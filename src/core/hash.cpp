// Hasher128 over xxHash's XXH3-128 (Debian libxxhash-dev): one shot for what fits the inline
// buffer, the streaming state beyond it. Both give XXH3_128bits of the concatenated bytes.
// XXH_INLINE_ALL compiles xxHash into this file (its documented header-only mode): the
// state lives inside Hasher128, a layout libxxhash.so does not promise across versions, and
// the one-shot path for short inputs (every traced op) inlines.
#include "loom/core/hash.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace loom {

namespace {

static_assert(sizeof(XXH3_state_t) <= 640 && alignof(XXH3_state_t) <= 64,
              "Hasher128::state_ must hold an XXH3_state_t");

Hash128 to_hash(XXH128_hash_t h) { return Hash128{h.low64, h.high64}; }

}  // namespace

Hash128 hash128(const void* data, size_t n) { return to_hash(XXH3_128bits(data, n)); }

void Hasher128::spill() {
  auto* st = reinterpret_cast<XXH3_state_t*>(state_);
  if (!streaming_) {
    XXH3_INITSTATE(st);
    XXH3_128bits_reset(st);
    streaming_ = true;
  }
  XXH3_128bits_update(st, buf_, n_);
  n_ = 0;
}

void Hasher128::add_long(const void* p, size_t n) {
  spill();
  XXH3_128bits_update(reinterpret_cast<XXH3_state_t*>(state_), p, n);
}

Hash128 Hasher128::finish() const {
  if (!streaming_) return to_hash(XXH3_128bits(buf_, n_));
  alignas(64) unsigned char copy[sizeof state_];
  std::memcpy(copy, state_, sizeof(XXH3_state_t));  // XXH3_copyState is a memcpy too
  auto* st = reinterpret_cast<XXH3_state_t*>(copy);
  XXH3_128bits_update(st, buf_, n_);
  return to_hash(XXH3_128bits_digest(st));
}

}  // namespace loom
