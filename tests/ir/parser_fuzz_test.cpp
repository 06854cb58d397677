// A seeded mutation fuzzer for the IR parser. Valid texts are mutated (byte flips, span
// inserts, deletes and duplicates, splices of two texts, numbers replaced by extremes) and
// parsed; parse may only fail with loom::Error. What parses must verify, print, and re-parse
// to the same structure and text. LOOM_FUZZ_INPUTS sets the input count (default 20000),
// LOOM_FUZZ_SEED the seed; one seed always produces the same inputs.
#include <gtest/gtest.h>

#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "ir/sample_graphs.h"
#include "loom/core/error.h"

namespace loom::ir {
namespace {

// splitmix64: the same stream on every platform (std distributions are not specified).
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() { return hash_mix(s_ += 0x9e3779b97f4a7c15ULL); }
  size_t below(size_t n) { return n ? static_cast<size_t>(next() % n) : 0; }
  bool chance(int percent) { return below(100) < static_cast<size_t>(percent); }

 private:
  uint64_t s_;
};

uint64_t env_u64(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : fallback;
}

std::vector<std::string> seed_texts() {
  std::vector<std::string> texts;
  for (const Graph& g : testing::sample_graphs()) texts.push_back(to_text(g));
  texts.push_back(
      "graph(%x: f32[2,3], %y: f32[3]) {  # names and comments\n"
      "  %e = expand(%y) {shape=[2,3]} : f32[2,3]\n"
      "  %s = add(%x, %e) : f32[2,3]\n"
      "  %r = reduce_sum(%s) {axes=[0,1], keepdim=true} : f32[1,1]\n"
      "  %k = slice(%x) {range=[0,2,1], axis=1} : f32[2,2]\n"
      "  %c = constant() {value=-inf} : f32[]\n"
      "  return %r, %k, %c\n}\n");
  texts.push_back("graph(%0: i64[2]) {\n  %1 = rand_normal(%0) : f16[4,4]\n  return %1\n}\n");
  texts.push_back("graph() {\n  %0 = iota() {axis=0} : i32[8]\n  return %0\n}\n");
  return texts;
}

const char* const kExtremes[] = {"0",
                                 "-1",
                                 "1",
                                 "2147483647",
                                 "2147483648",
                                 "-2147483648",
                                 "4294967296",
                                 "9223372036854775807",
                                 "-9223372036854775808",
                                 "9223372036854775808",
                                 "18446744073709551616",
                                 "1099511627776",
                                 "1e308",
                                 "-1e308",
                                 "1e-320",
                                 "nan",
                                 "-inf",
                                 "65536",
                                 "16",
                                 "17",
                                 "64",
                                 "65",
                                 "0.5",
                                 "-0"};
const char* const kTokens[] = {"graph",    "return", "%",   "#",    ":",    "=",        "(",
                               ")",        "{",      "}",   "[",    "]",    ",",        "#1",
                               ":2",       "f32",    "i64", "bool", "add",  "reshape",  "concat",
                               "constant", "\n",     " ",   "%0",   "%1#0", "graph() {"};

size_t number_end(const std::string& t, size_t at) {
  while (at < t.size() && (std::isdigit(static_cast<unsigned char>(t[at])) || t[at] == '.' ||
                           t[at] == 'e' || t[at] == '-'))
    ++at;
  return at;
}

void mutate_once(Rng& rng, std::string& t, const std::vector<std::string>& texts) {
  size_t n = t.size();
  size_t at = rng.below(n + 1);
  switch (rng.below(8)) {
    case 7: {  // whitespace or a comment between tokens: harmless when it lands between them
      const char* const kBlanks[] = {" ", "\n", "\t", " # comment\n"};
      t.insert(at, kBlanks[rng.below(std::size(kBlanks))]);
      break;
    }
    case 0:  // byte flip
      if (n) t[rng.below(n)] ^= static_cast<char>(1u << rng.below(8));
      break;
    case 1: {  // insert random bytes or a token
      if (rng.chance(50)) {
        t.insert(at, kTokens[rng.below(std::size(kTokens))]);
      } else {
        std::string bytes(1 + rng.below(8), '\0');
        for (char& c : bytes) c = static_cast<char>(rng.below(256));
        t.insert(at, bytes);
      }
      break;
    }
    case 2:  // delete a span
      t.erase(at, 1 + rng.below(16));
      break;
    case 3: {  // duplicate a span elsewhere
      size_t from = rng.below(n + 1), len = rng.below(64);
      t.insert(at, t.substr(from, len));
      break;
    }
    case 4: {  // splice: a prefix of this text and a suffix of another
      const std::string& o = texts[rng.below(texts.size())];
      t = t.substr(0, at) + o.substr(rng.below(o.size() + 1));
      break;
    }
    default: {  // replace the next number with an extreme
      size_t d = at;
      while (d < n && !std::isdigit(static_cast<unsigned char>(t[d]))) ++d;
      if (d == n) break;
      t.replace(d, number_end(t, d) - d, kExtremes[rng.below(std::size(kExtremes))]);
      break;
    }
  }
}

TEST(ParserFuzzTest, MutatedTextsParseOrFailCleanly) {
  const uint64_t inputs = env_u64("LOOM_FUZZ_INPUTS", 20000);
  const uint64_t seed = env_u64("LOOM_FUZZ_SEED", 20240611);
  const std::vector<std::string> texts = seed_texts();
  Rng rng(seed);
  uint64_t parsed = 0, failures = 0;
  std::optional<Graph> previous;
  auto start = std::chrono::steady_clock::now();
  for (uint64_t k = 0; k < inputs && failures < 5; ++k) {
    std::string t = texts[rng.below(texts.size())];
    for (size_t m = 1 + rng.below(rng.chance(70) ? 2 : 8); m > 0; --m) mutate_once(rng, t, texts);
    std::optional<Graph> g;
    try {
      g = parse(t);
    } catch (const Error&) {
      continue;
    }
    ++parsed;
    try {
      verify(*g);
      std::string printed = to_text(*g);
      Graph back = parse(printed);
      bool same = structurally_equal(*g, back) && to_text(back) == printed;
      // Fingerprints agree with structural equality, also between different inputs.
      if (previous) {
        bool fp_same = fingerprint(*g) == fingerprint(*previous);
        same = same && fp_same == structurally_equal(*g, *previous);
      }
      if (!same) ++failures;
      EXPECT_TRUE(same)
          << "input " << k
          << " does not round-trip (or its fingerprint disagrees with structurally_equal):\n"
          << t;
      previous = std::move(back);
    } catch (const std::exception& e) {
      ++failures;
      ADD_FAILURE() << "input " << k << ": " << e.what() << "\n" << t;
    }
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("[ParserFuzz] seed %llu: %llu inputs, %llu parsed, %.2f s\n",
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(inputs),
              static_cast<unsigned long long>(parsed), secs);
  EXPECT_GT(parsed, 0u);
}

}  // namespace
}  // namespace loom::ir
