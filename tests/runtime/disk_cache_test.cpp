// The persistent compile cache: a second process runs with zero compiles; truncated, flipped,
// foreign-key and other-version entries, an unwritable directory and two writers at once all
// give correct results and counted recoveries. Fresh processes are this test binary run with
// a filter on PersistentCacheChild.DISABLED_Run, which writes its results and metrics to a file.
#include "loom/backend/disk_cache.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <thread>

#include "backend/cpu/codegen.h"
#include "backend/cpu/jit.h"
#include "loom/core/config.h"
#include "loom/loom.h"
#include "loom/runtime/engine.h"

namespace {

using namespace loom;
namespace fs = std::filesystem;

// The child's program: a product, softmax, gelu and a reduction (a few fused kernels).
std::vector<float> child_program() {
  std::vector<float> xv(64 * 48), wv(48 * 48);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = static_cast<float>((i * 37) % 101) / 50.f - 1.f;
  for (size_t i = 0; i < wv.size(); ++i) wv[i] = static_cast<float>((i * 17) % 89) / 40.f - 1.f;
  Tensor x = tensor(xv, {64, 48}), w = tensor(wv, {48, 48});
  Tensor y = softmax(matmul(x, w) * 0.25, 1) + gelu(x);
  Tensor s = sum(y * y, {1});
  loom::sync();
  std::vector<float> out = y.to_vector<float>();
  for (float v : s.to_vector<float>()) out.push_back(v);
  // LOOM_TEST_CHILD_SCAN=tanh|sigmoid adds a graph with a scan whose body applies that
  // function, between kernels that do not depend on it: the two share the top level's code.
  if (const char* f = std::getenv("LOOM_TEST_CHILD_SCAN")) {
    const bool use_tanh = std::string(f) == "tanh";
    Tensor xs = exp(reshape(x, {4, 16, 48}) * 0.5);
    auto [h, ys] = scan(
        [use_tanh](const Tensor& h, const Tensor& xt) {
          Tensor next = use_tanh ? tanh(h * 0.5 + xt) : sigmoid(h * 0.5 + xt);
          return std::pair{next, next};
        },
        zeros({16, 48}), xs);
    Tensor z = sum(log(h * h + 1.0)) + sum(ys);
    for (float v : z.to_vector<float>()) out.push_back(v);
  }
  return out;
}

}  // namespace

TEST(PersistentCacheChild, DISABLED_Run) {
  const char* out_path = std::getenv("LOOM_TEST_CHILD_OUT");
  if (!out_path) GTEST_SKIP() << "run by DiskCacheTest in a fresh process";
  // LOOM_TEST_CHILD_TIER_UP=1: every module tiers up after its kernels' first microsecond; the
  // program runs twice more and the tier-ups finish before the child reports.
  const bool tier_up = std::getenv("LOOM_TEST_CHILD_TIER_UP") != nullptr;
  if (tier_up) cpu::set_tier_up_after_us(1);
  std::vector<float> values = child_program();
  if (tier_up) {
    for (int i = 0; i < 2; ++i) child_program();
    cpu::wait_for_tier_ups();
  }
  cpu::Jit::wait_for_start();  // the preload may still be rejecting entries: count them all
  loom::Metrics m = loom::metrics();
  std::ofstream out(out_path);
  out << "tier_ups " << cpu::tier_ups() << "\n"
      << "tiered_loads " << cpu::Jit::tiered_loads() << "\n"
      << "compiles " << m.compiles << "\n"
      << "disk_cache_hits " << m.disk_cache_hits << "\n"
      << "loads " << m.disk_cache_loads << "\n"
      << "misses " << m.disk_cache_misses << "\n"
      << "writes " << m.disk_cache_writes << "\n"
      << "write_failures " << m.disk_cache_write_failures << "\n"
      << "rejected " << m.disk_cache_rejected << "\n"
      << "compile_seconds " << m.compile_seconds << "\n"
      << "values";
  for (float v : values) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    out << " " << bits;
  }
  out << "\n";
}

namespace {

struct Child {
  int rc = -1;
  std::map<std::string, std::string> kv;
  int64_t get(const std::string& k) const {
    auto it = kv.find(k);
    return it == kv.end() ? -1 : std::stoll(it->second);
  }
  const std::string& values() const { return kv.at("values"); }
};

// The floats' bit patterns, space-separated, as the child writes its values.
std::string bits_of(const std::vector<float>& values) {
  std::string bits;
  for (float v : values) {
    uint32_t b;
    std::memcpy(&b, &v, 4);
    bits += (bits.empty() ? "" : " ") + std::to_string(b);
  }
  return bits;
}

std::string self_exe() { return fs::read_symlink("/proc/self/exe").string(); }

std::string child_command(const std::string& cache_dir, const std::string& out,
                          const std::string& env = "") {
  return env + " LOOM_CACHE_DIR='" + cache_dir + "' LOOM_TEST_CHILD_OUT='" + out + "' '" +
         self_exe() +
         "' --gtest_also_run_disabled_tests --gtest_filter=PersistentCacheChild.DISABLED_Run "
         ">/dev/null 2>&1";
}

Child read_child(const std::string& out, int rc) {
  Child c;
  c.rc = rc;
  std::ifstream in(out);
  for (std::string line; std::getline(in, line);) {
    size_t sp = line.find(' ');
    if (sp != std::string::npos) c.kv[line.substr(0, sp)] = line.substr(sp + 1);
  }
  return c;
}

std::vector<fs::path> entries(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().extension() == ".lco") out.push_back(it->path());
  std::sort(out.begin(), out.end());
  return out;
}

// The hasher and entry layout of format 1 (before XXH3), as loom wrote them: two 64-bit
// lanes, one multiply each per word. Used to make the entries an older loom left behind.
class LegacyHasher128 {
 public:
  void add(uint64_t v) {
    a_ = (rotl(a_, 23) ^ v) * 0x9e3779b97f4a7c15ULL;
    b_ = (rotl(b_, 41) + (v ^ 0x632be59bd9b4e019ULL)) * 0xff51afd7ed558ccdULL;
    ++n_;
  }
  Hash128 finish() const {
    uint64_t a = hash_mix(a_ ^ n_), b = hash_mix(b_ + 0x27d4eb2f165667c5ULL * n_);
    return {hash_mix(a ^ (b >> 17)), hash_mix(b + a)};
  }

 private:
  static uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
  uint64_t a_ = 0x243f6a8885a308d3ULL, b_ = 0x13198a2e03707344ULL, n_ = 0;
};

// A whole, checksum-valid format-1 entry for `key` holding `payload`.
std::string legacy_entry(const Hash128& key, std::string_view payload) {
  std::string h(64, '\0');
  std::memcpy(h.data(), "LOOMCCH1", 8);
  const uint32_t version = 1, header_bytes = 64;
  const uint64_t size = payload.size();
  std::memcpy(h.data() + 8, &version, 4);
  std::memcpy(h.data() + 12, &header_bytes, 4);
  std::memcpy(h.data() + 16, &key.lo, 8);
  std::memcpy(h.data() + 24, &key.hi, 8);
  std::memcpy(h.data() + 32, &size, 8);
  LegacyHasher128 hs;
  auto add_bytes = [&](const char* p, size_t n) {
    size_t k = 0;
    for (; k + 8 <= n; k += 8) {
      uint64_t w;
      std::memcpy(&w, p + k, 8);
      hs.add(w);
    }
    uint64_t tail = 0;
    std::memcpy(&tail, p + k, n - k);
    hs.add(tail ^ (uint64_t{n - k} << 56));
  };
  add_bytes(h.data(), 40);
  add_bytes(payload.data(), payload.size());
  Hash128 sum = hs.finish();
  std::memcpy(h.data() + 40, &sum.lo, 8);
  std::memcpy(h.data() + 48, &sum.hi, 8);
  return h + std::string(payload);
}

// Rewrites an entry as format 1 would have stored it (same key and payload).
void rewrite_as_legacy(const fs::path& f) {
  std::ifstream in(f, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  ASSERT_GE(bytes.size(), 64u);
  Hash128 key;
  std::memcpy(&key.lo, bytes.data() + 16, 8);
  std::memcpy(&key.hi, bytes.data() + 24, 8);
  std::ofstream(f, std::ios::binary | std::ios::trunc)
      << legacy_entry(key, std::string_view(bytes).substr(64));
}

class DiskCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (runtime::current_backend().name() != "cpu") GTEST_SKIP() << "the cpu backend stores code";
    root_ = fs::temp_directory_path() /
            ("loom_disk_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
    dir_ = root_ / "cache";
  }
  void TearDown() override { fs::remove_all(root_); }

  // `env`: assignments put before the child's command ("LOOM_VECTOR_WIDTH=256").
  Child run(const fs::path& cache_dir, const std::string& env = "") {
    std::string out = (root_ / ("out" + std::to_string(runs_++))).string();
    int rc = std::system(child_command(cache_dir.string(), out, env).c_str());
    return read_child(out, rc);
  }
  // Runs a child after `corrupt` changed every entry: it must recover (count, recompile,
  // rewrite), give the cold results, and leave entries that the next child loads.
  void expect_recovery(const std::string& what,
                       const std::function<void(const fs::path&)>& corrupt) {
    SCOPED_TRACE(what);
    auto files = entries(dir_);
    ASSERT_FALSE(files.empty());
    for (const auto& f : files) corrupt(f);
    Child c = run(dir_);
    ASSERT_EQ(c.rc, 0);
    EXPECT_EQ(c.get("rejected"), static_cast<int64_t>(files.size()));
    EXPECT_GT(c.get("compiles"), 0);
    EXPECT_EQ(c.values(), cold_.values());
    Child again = run(dir_);
    ASSERT_EQ(again.rc, 0);
    EXPECT_EQ(again.get("compiles"), 0);
    EXPECT_EQ(again.get("rejected"), 0);
    EXPECT_EQ(again.values(), cold_.values());
  }

  fs::path root_, dir_;
  int runs_ = 0;
  Child cold_;
};

TEST_F(DiskCacheTest, SecondProcessRunsWithZeroCompiles) {
  Child cold = run(dir_);
  ASSERT_EQ(cold.rc, 0);
  EXPECT_GT(cold.get("compiles"), 0);
  EXPECT_GT(cold.get("writes"), 0);
  EXPECT_EQ(cold.get("loads"), 0);
  EXPECT_EQ(cold.get("write_failures"), 0);
  EXPECT_EQ(static_cast<int64_t>(entries(dir_).size()), cold.get("writes"));
  Child warm = run(dir_);
  ASSERT_EQ(warm.rc, 0);
  EXPECT_EQ(warm.get("compiles"), 0);
  EXPECT_GT(warm.get("disk_cache_hits"), 0);
  EXPECT_EQ(warm.get("loads"), cold.get("writes"));
  EXPECT_EQ(warm.get("misses"), 0);
  EXPECT_EQ(warm.get("writes"), 0);
  EXPECT_EQ(warm.values(), cold.values());
  // The same program in this process (cache off here) gives the same bits.
  std::vector<float> here = child_program();
  EXPECT_EQ(warm.values(), bits_of(here));
}

// A module that tiered up is stored again, as the full selector generated it, and the next
// process loads that code (it has nothing left to tier up), with the same bits.
TEST_F(DiskCacheTest, TieredUpCodeIsStoredAndLoadedByTheNextProcess) {
  Child cold = run(dir_, "LOOM_TEST_CHILD_TIER_UP=1");
  ASSERT_EQ(cold.rc, 0);
  EXPECT_GT(cold.get("tier_ups"), 0);
  EXPECT_EQ(cold.get("tiered_loads"), 0);
  EXPECT_EQ(static_cast<int64_t>(entries(dir_).size()), cold.get("writes"));
  Child warm = run(dir_, "LOOM_TEST_CHILD_TIER_UP=1");
  ASSERT_EQ(warm.rc, 0);
  EXPECT_EQ(warm.get("compiles"), 0);
  EXPECT_EQ(warm.get("tiered_loads"), cold.get("tier_ups"));
  EXPECT_EQ(warm.get("tier_ups"), 0);
  EXPECT_EQ(warm.get("misses"), 0);
  EXPECT_EQ(warm.get("writes"), 0);
  EXPECT_EQ(warm.values(), cold.values());
  // Without tier-ups (LOOM_TIER_UP_MS=0) a process asks for fast code only: it loads that.
  Child off = run(dir_, "LOOM_TIER_UP_MS=0");
  ASSERT_EQ(off.rc, 0);
  EXPECT_EQ(off.get("compiles"), 0);
  EXPECT_EQ(off.get("tiered_loads"), 0);
  EXPECT_EQ(off.values(), cold.values());
}

std::vector<float> floats_of(const std::string& bits) {
  std::vector<float> out;
  std::istringstream in(bits);
  for (uint32_t b; in >> b;) {
    float v;
    std::memcpy(&v, &b, 4);
    out.push_back(v);
  }
  return out;
}

// A graph whose top-level kernels load from disk but whose loop body is new is a compile,
// not a disk hit: the loop regions compile on a thread of their own (compile_steps), and the
// modules they generate count in the executable's CodeInfo.
TEST_F(DiskCacheTest, ALoopBodyCompiledBesideLoadedKernelsCountsAsACompile) {
  Child cold = run(dir_, "LOOM_TEST_CHILD_SCAN=tanh");
  ASSERT_EQ(cold.rc, 0);
  EXPECT_EQ(cold.get("compiles"), 2);  // the first graph and the scan's
  Child warm = run(dir_, "LOOM_TEST_CHILD_SCAN=sigmoid");
  ASSERT_EQ(warm.rc, 0);
  EXPECT_EQ(warm.get("disk_cache_hits"), 1);  // the first graph
  EXPECT_EQ(warm.get("compiles"), 1);         // the scan's: its body is new
  EXPECT_GT(warm.get("loads"), 1);            // the scan's top-level kernels too
  EXPECT_GT(warm.get("misses"), 0);
  Child again = run(dir_, "LOOM_TEST_CHILD_SCAN=sigmoid");
  ASSERT_EQ(again.rc, 0);
  EXPECT_EQ(again.get("compiles"), 0);
  EXPECT_EQ(again.get("disk_cache_hits"), 2);
  EXPECT_EQ(again.values(), warm.values());
  // The same program in this process (cache off here) gives the same bits.
  ::setenv("LOOM_TEST_CHILD_SCAN", "sigmoid", 1);
  std::vector<float> here = child_program();
  ::unsetenv("LOOM_TEST_CHILD_SCAN");
  EXPECT_EQ(warm.values(), bits_of(here));
}

// Code generated for 256-bit vectors is never loaded where 512 bits are asked for, nor the
// reverse (the vector width is part of the key), and both compute the same values up to the
// order of a vectorized reduction's sums.
TEST_F(DiskCacheTest, TheVectorWidthIsPartOfTheKey) {
  Child narrow = run(dir_, "LOOM_VECTOR_WIDTH=256");
  ASSERT_EQ(narrow.rc, 0);
  EXPECT_GT(narrow.get("writes"), 0);
  Child wide = run(dir_, "LOOM_VECTOR_WIDTH=512");
  ASSERT_EQ(wide.rc, 0);
  EXPECT_EQ(wide.get("loads"), 0);
  EXPECT_EQ(wide.get("compiles"), narrow.get("compiles"));
  Child again = run(dir_, "LOOM_VECTOR_WIDTH=256");
  ASSERT_EQ(again.rc, 0);
  EXPECT_EQ(again.get("compiles"), 0);
  EXPECT_EQ(again.values(), narrow.values());
  std::vector<float> a = floats_of(narrow.values()), b = floats_of(wide.values());
  ASSERT_EQ(a.size(), b.size());
  ASSERT_GT(a.size(), 64u * 48);
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_NEAR(a[i], b[i], 1e-5 * (1 + std::abs(a[i]))) << "value " << i;
}

TEST_F(DiskCacheTest, AVectorWidthOtherThan256Or512IsRefusedByName) {
  std::string out = (root_ / "bad").string();
  std::string cmd = "LOOM_VECTOR_WIDTH=300 LOOM_TEST_CHILD_OUT='" + out + "' '" + self_exe() +
                    "' --gtest_also_run_disabled_tests "
                    "--gtest_filter=PersistentCacheChild.DISABLED_Run 2>&1";
  std::string text;
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[512];
  while (fgets(buf, sizeof buf, p)) text += buf;
  EXPECT_NE(pclose(p), 0);
  EXPECT_NE(text.find("LOOM_VECTOR_WIDTH must be 256 or 512, got '300'"), std::string::npos)
      << text;
}

TEST_F(DiskCacheTest, DamagedEntriesAreRejectedRemovedAndRecompiled) {
  cold_ = run(dir_);
  ASSERT_EQ(cold_.rc, 0);
  auto patch = [](const fs::path& f, size_t offset, auto&& change) {
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(static_cast<std::streamoff>(offset));
    char c = 0;
    io.read(&c, 1);
    io.seekp(static_cast<std::streamoff>(offset));
    c = change(c);
    io.write(&c, 1);
  };
  expect_recovery("truncated", [](const fs::path& f) { fs::resize_file(f, fs::file_size(f) / 2); });
  expect_recovery("truncated inside the header", [](const fs::path& f) { fs::resize_file(f, 20); });
  expect_recovery("flipped payload byte", [&](const fs::path& f) {
    patch(f, backend::DiskCache::kHeaderBytes + (fs::file_size(f) - 64) / 2,
          [](char c) { return static_cast<char>(c ^ 0x5a); });
  });
  expect_recovery("another format version", [&](const fs::path& f) {
    patch(f, 8, [](char c) { return static_cast<char>(c + 1); });  // the version field
  });
  expect_recovery("another key (a foreign file under this name)", [&](const fs::path& f) {
    patch(f, 16, [](char c) { return static_cast<char>(c ^ 1); });  // the key field
  });
  expect_recovery("empty file", [](const fs::path& f) { fs::resize_file(f, 0); });
}

// Entries an older loom wrote with its own hash (format 1, valid under that hash) are foreign:
// counted in `rejected` (Metrics::disk_cache_rejected), removed, recompiled, rewritten.
TEST_F(DiskCacheTest, EntriesWrittenWithTheOldHashAreRejectedAndRecompiled) {
  cold_ = run(dir_);
  ASSERT_EQ(cold_.rc, 0);
  expect_recovery("format 1 (the hand-written hash)", rewrite_as_legacy);
}

TEST_F(DiskCacheTest, OldHashEntriesAreRejectedByLoadAndByThePreload) {
  backend::DiskCache dc(dir_.string(), 1 << 30);
  ASSERT_TRUE(dc.store(Hash128{5, 9}, "fresh"));
  ASSERT_TRUE(dc.load(Hash128{5, 9}).has_value());
  for (uint64_t k : {1, 2}) {
    std::ofstream(dc.path_of(Hash128{k, 9}), std::ios::binary)
        << legacy_entry(Hash128{k, 9}, "old code");
  }
  EXPECT_FALSE(dc.load(Hash128{1, 9}).has_value());
  EXPECT_EQ(dc.stats().rejected, 1);
  EXPECT_FALSE(fs::exists(dc.path_of(Hash128{1, 9})));
  auto newest = dc.newest_entries(8, 1 << 20);  // the preload: skips, counts and removes it
  ASSERT_EQ(newest.size(), 1u);
  EXPECT_EQ(newest[0].second, "fresh");
  EXPECT_EQ(dc.stats().rejected, 2);
  EXPECT_FALSE(fs::exists(dc.path_of(Hash128{2, 9})));
}

TEST_F(DiskCacheTest, UnwritableDirectoryGivesCorrectResultsAndCountedFailures) {
  cold_ = run(root_ / "reference-cache");
  ASSERT_EQ(cold_.rc, 0);
  std::ofstream(root_ / "a-file") << "not a directory";
  Child c = run(root_ / "a-file" / "cache");  // cannot be created, whoever runs the test
  ASSERT_EQ(c.rc, 0);
  EXPECT_GT(c.get("compiles"), 0);
  EXPECT_GT(c.get("write_failures"), 0);
  EXPECT_EQ(c.get("writes"), 0);
  EXPECT_EQ(c.values(), cold_.values());
}

TEST_F(DiskCacheTest, TwoProcessesWritingAtOnceLeaveAValidCache) {
  std::string a = (root_ / "a").string(), b = (root_ / "b").string();
  std::string cmd = "(" + child_command(dir_.string(), a) + ") & (" +
                    child_command(dir_.string(), b) + ") & wait";
  ASSERT_EQ(std::system(("sh -c \"" + cmd + "\"").c_str()), 0);
  Child ca = read_child(a, 0), cb = read_child(b, 0);
  ASSERT_FALSE(ca.kv.empty());
  ASSERT_FALSE(cb.kv.empty());
  EXPECT_EQ(ca.values(), cb.values());
  EXPECT_EQ(ca.get("rejected") + cb.get("rejected"), 0);
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().extension(), ".lco") << "left behind: " << e.path();
  Child c = run(dir_);
  ASSERT_EQ(c.rc, 0);
  EXPECT_EQ(c.get("compiles"), 0);
  EXPECT_EQ(c.get("rejected"), 0);
  EXPECT_EQ(c.values(), ca.values());
}

// The store itself, in this process: LRU eviction by use and verification on load.
// The JIT preloads the newest entries at start-up: newest first, whole and verified, within
// the bounds, and reading them must not count as hits or touch their times.
TEST_F(DiskCacheTest, NewestEntriesAreTheLatestVerifiedOnes) {
  backend::DiskCache dc(dir_.string(), 1 << 30);
  EXPECT_TRUE(dc.newest_entries(8, 1 << 20).empty());  // empty directory
  ASSERT_TRUE(dc.store(Hash128{1, 7}, "older"));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(dc.store(Hash128{2, 7}, "newer"));
  auto before = fs::last_write_time(dc.path_of(Hash128{2, 7}));
  auto all = dc.newest_entries(8, 1 << 20);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].first, (Hash128{2, 7}));
  EXPECT_EQ(all[0].second, "newer");
  EXPECT_EQ(all[1].first, (Hash128{1, 7}));
  EXPECT_EQ(all[1].second, "older");
  EXPECT_EQ(dc.newest_entries(1, 1 << 20).size(), 1u);
  EXPECT_TRUE(dc.newest_entries(8, 10).empty());  // the newest alone is over 10 bytes
  EXPECT_EQ(fs::last_write_time(dc.path_of(Hash128{2, 7})), before);
  EXPECT_EQ(dc.stats().hits, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // file times tick coarsely
  dc.note_hit(Hash128{1, 7});  // a preloaded entry used: counted, and now the newest
  EXPECT_EQ(dc.stats().hits, 1);
  EXPECT_EQ(dc.newest_entries(1, 1 << 20)[0].first, (Hash128{1, 7}));
  {  // a flipped byte: that entry is left out, never handed over corrupt
    std::fstream io(dc.path_of(Hash128{1, 7}), std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(static_cast<std::streamoff>(backend::DiskCache::kHeaderBytes));
    io.put('N');
  }
  all = dc.newest_entries(8, 1 << 20);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].second, "newer");
}

TEST_F(DiskCacheTest, DirectoryIsBoundedAndEvictsTheLeastRecentlyUsed) {
  backend::DiskCache dc(dir_.string(), 350 << 10);
  std::string payload(100 << 10, 'x');
  auto key = [](uint64_t k) { return Hash128{k, 42}; };
  for (uint64_t k = 1; k <= 3; ++k) {
    ASSERT_TRUE(dc.store(key(k), payload));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(dc.load(key(1)).has_value());  // key 1 is now the most recently used
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(dc.store(key(4), payload));
  EXPECT_TRUE(fs::exists(dc.path_of(key(1))));
  EXPECT_FALSE(fs::exists(dc.path_of(key(2))));
  EXPECT_TRUE(fs::exists(dc.path_of(key(3))));
  EXPECT_TRUE(fs::exists(dc.path_of(key(4))));
  EXPECT_EQ(dc.stats().evictions, 1);
  // A flipped byte: rejected, removed, a miss.
  {
    std::fstream io(dc.path_of(key(3)), std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(100);
    io.put('y');
  }
  EXPECT_FALSE(dc.load(key(3)).has_value());
  EXPECT_FALSE(fs::exists(dc.path_of(key(3))));
  EXPECT_EQ(dc.stats().rejected, 1);
  auto back = dc.load(key(4));
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(*back, payload);
  EXPECT_THROW(runtime::set_cache_dir_max_mb(0), Error);
}

}  // namespace
