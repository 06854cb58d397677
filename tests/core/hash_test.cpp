// Hasher128 is XXH3-128: the published digest of the empty input, one-shot against streaming
// across the inline buffer's end, and the properties fingerprints rely on (order and length
// sensitivity, self-delimiting strings).
#include "loom/core/hash.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace {

using loom::Hash128;
using loom::Hasher128;

TEST(Hash128Test, EmptyInputIsXxh3ReferenceDigest) {
  // xxhsum -H2 of an empty file (xxHash's own test vector): 99aa06d3014798d86001c324468d497f.
  EXPECT_EQ(loom::hash128(nullptr, 0).hex(), "99aa06d3014798d86001c324468d497f");
  EXPECT_EQ(Hasher128().finish().hex(), "99aa06d3014798d86001c324468d497f");
}

TEST(Hash128Test, StreamingEqualsOneShotAtEveryLengthAroundTheInlineBuffer) {
  std::string bytes;
  for (int i = 0; i < 4000; ++i) bytes.push_back(static_cast<char>((i * 131 + 7) & 0xff));
  for (size_t n : {0, 1, 7, 8, 16, 17, 128, 129, 240, 241, 248, 255, 256, 257, 264, 1000, 4000}) {
    SCOPED_TRACE(n);
    const Hash128 want = loom::hash128(bytes.data(), n);
    Hasher128 bytewise, chunks, words;
    for (size_t i = 0; i < n; ++i) bytewise.add_bytes(bytes.data() + i, 1);
    for (size_t i = 0; i < n; i += 300)
      chunks.add_bytes(bytes.data() + i, std::min<size_t>(300, n - i));
    EXPECT_EQ(bytewise.finish(), want);
    EXPECT_EQ(chunks.finish(), want);
    if (n % 8 == 0) {
      for (size_t i = 0; i < n; i += 8) {
        uint64_t w;
        std::memcpy(&w, bytes.data() + i, 8);
        words.add(w);
      }
      EXPECT_EQ(words.finish(), want);
    }
    // finish() does not consume: more input gives another digest, the same input the same.
    EXPECT_EQ(chunks.finish(), want);
  }
}

TEST(Hash128Test, OrderLengthAndStringBoundariesChangeTheDigest) {
  auto words = [](std::vector<uint64_t> ws) {
    Hasher128 h;
    for (uint64_t w : ws) h.add(w);
    return h.finish();
  };
  EXPECT_NE(words({1, 2}), words({2, 1}));
  EXPECT_NE(words({0}), words({0, 0}));
  EXPECT_NE(words({}), words({0}));
  auto strings = [](std::vector<std::string> ss) {
    Hasher128 h;
    for (const auto& s : ss) h.add_string(s);
    return h.finish();
  };
  EXPECT_NE(strings({"ab", "c"}), strings({"a", "bc"}));
  EXPECT_NE(strings({"", "x"}), strings({"x", ""}));
  EXPECT_EQ(strings({"ab", "c"}), strings({"ab", "c"}));
  // Many distinct short inputs (one word each, as the builder feeds them): no collision in
  // either half.
  std::vector<uint64_t> lo, hi;
  for (uint64_t i = 0; i < 20000; ++i) {
    Hash128 h = words({i});
    lo.push_back(h.lo);
    hi.push_back(h.hi);
  }
  std::sort(lo.begin(), lo.end());
  std::sort(hi.begin(), hi.end());
  EXPECT_EQ(std::adjacent_find(lo.begin(), lo.end()), lo.end());
  EXPECT_EQ(std::adjacent_find(hi.begin(), hi.end()), hi.end());
}

}  // namespace
