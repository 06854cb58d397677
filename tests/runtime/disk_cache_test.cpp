// The persistent compile cache: a second process runs with zero compiles; truncated, flipped,
// foreign-key and other-version entries, an unwritable directory and two writers at once all
// give correct results and counted recoveries. Fresh processes are this test binary run with
// a filter on PersistentCacheChild.DISABLED_Run, which writes its results and metrics to a file.
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

#include "loom/backend/disk_cache.h"
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
  return out;
}

}  // namespace

TEST(PersistentCacheChild, DISABLED_Run) {
  const char* out_path = std::getenv("LOOM_TEST_CHILD_OUT");
  if (!out_path) GTEST_SKIP() << "run by DiskCacheTest in a fresh process";
  std::vector<float> values = child_program();
  loom::Metrics m = loom::metrics();
  std::ofstream out(out_path);
  out << "compiles " << m.compiles << "\n"
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

std::string self_exe() { return fs::read_symlink("/proc/self/exe").string(); }

std::string child_command(const std::string& cache_dir, const std::string& out) {
  return "LOOM_CACHE_DIR='" + cache_dir + "' LOOM_TEST_CHILD_OUT='" + out + "' '" + self_exe() +
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

class DiskCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (runtime::current_backend().name() != "cpu") GTEST_SKIP() << "the cpu backend stores code";
    root_ = fs::temp_directory_path() / ("loom_disk_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
    dir_ = root_ / "cache";
  }
  void TearDown() override { fs::remove_all(root_); }

  Child run(const fs::path& cache_dir) {
    std::string out = (root_ / ("out" + std::to_string(runs_++))).string();
    int rc = std::system(child_command(cache_dir.string(), out).c_str());
    return read_child(out, rc);
  }
  // Runs a child after `corrupt` changed every entry: it must recover (count, recompile,
  // rewrite), give the cold results, and leave entries that the next child loads.
  void expect_recovery(const std::string& what, const std::function<void(const fs::path&)>& corrupt) {
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
  std::string bits;
  for (float v : here) {
    uint32_t b;
    std::memcpy(&b, &v, 4);
    bits += (bits.empty() ? "" : " ") + std::to_string(b);
  }
  EXPECT_EQ(warm.values(), bits);
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
  backend::DiskCache& dc = backend::DiskCache::instance();
  const std::string saved = dc.dir();
  dc.set_dir(dir_.string());
  dc.reset_stats();
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
  dc.set_dir(saved);
}

TEST_F(DiskCacheTest, DirectoryIsBoundedAndEvictsTheLeastRecentlyUsed) {
  backend::DiskCache& dc = backend::DiskCache::instance();
  const std::string saved = dc.dir();
  dc.set_dir(dir_.string());
  dc.set_max_bytes(350 << 10);
  dc.reset_stats();
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
  dc.set_dir(saved);
  dc.set_max_bytes(config().cache_dir_mb << 20);
  EXPECT_THROW(runtime::set_cache_dir_max_mb(0), Error);
}

}  // namespace
