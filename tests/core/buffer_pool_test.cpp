// The caching pool: blocks come back for allocations of their size, the bound holds, and a
// size that does not fit evicts the least recently used sizes rather than being turned away.
// Small blocks come back to the thread that freed them, and a thread's blocks are freed when it
// exits (the sanitizer build's leak check sees one that is not).
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <thread>

#include "loom/core/buffer.h"

namespace loom {
namespace {

class BufferPool : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = Buffer::pool_limit();
    Buffer::set_pool_limit(0);  // empty the pool
    Buffer::set_pool_limit(1 << 20);
  }
  void TearDown() override { Buffer::set_pool_limit(saved_); }
  size_t saved_ = 0;
};

TEST_F(BufferPool, ANewSizeEvictsTheLeastRecentlyUsedSizes) {
  constexpr size_t kA = 256 << 10, kB = 512 << 10, kC = 128 << 10;
  {
    std::vector<Buffer> as;
    for (int i = 0; i < 4; ++i) as.push_back(Buffer::allocate_uninitialized(kA));
  }
  EXPECT_EQ(Buffer::pool_free_bytes(), 4 * kA);  // 1 MiB of A: the bound is reached
  {
    Buffer c = Buffer::allocate_uninitialized(kC);
  }  // C fits only by evicting one A
  EXPECT_EQ(Buffer::pool_free_bytes(), 3 * kA + kC);
  size_t hits = Buffer::pool_hits();
  {
    Buffer c = Buffer::allocate_uninitialized(kC);
  }  // served by the pool
  EXPECT_EQ(Buffer::pool_hits(), hits + 1);
  {
    Buffer b = Buffer::allocate_uninitialized(kB);
  }  // evicts A blocks (least recent), not C
  EXPECT_EQ(Buffer::pool_free_bytes(), kA + kC + kB);
  hits = Buffer::pool_hits();
  Buffer b = Buffer::allocate_uninitialized(kB), c = Buffer::allocate_uninitialized(kC);
  EXPECT_EQ(Buffer::pool_hits(), hits + 2);
  EXPECT_LE(Buffer::pool_free_bytes(), Buffer::pool_limit());
}

TEST_F(BufferPool, ABlockLargerThanTheBoundIsNotKept) {
  {
    Buffer big = Buffer::allocate_uninitialized(2 << 20);
  }
  EXPECT_EQ(Buffer::pool_free_bytes(), 0u);
  Buffer::set_pool_limit(0);
  EXPECT_EQ(Buffer::pool_free_bytes(), 0u);
}

void reuse_on_a_fresh_thread() {
  // Four blocks of one 64-byte class: freed, the next four of that class are the same memory.
  std::set<const void*> first;
  {
    std::vector<Buffer> bs;
    for (int i = 0; i < 4; ++i) bs.push_back(Buffer::allocate_uninitialized(4000));
    for (const Buffer& b : bs) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % Buffer::kAlignment, 0u);
      first.insert(b.data());
    }
  }
  std::vector<Buffer> again;
  for (int i = 0; i < 4; ++i) {
    again.push_back(Buffer::allocate_uninitialized(4010));  // same class: 4032 bytes
    EXPECT_TRUE(first.count(again.back().data())) << "block " << i << " was not reused";
    std::memset(again.back().data(), 0xab, 4010);  // the whole block is the caller's
  }
  // Buffer::allocate zeroes a reused block too.
  again.clear();
  Buffer z = Buffer::allocate(4000);
  const auto* p = static_cast<const unsigned char*>(z.data());
  for (size_t i = 0; i < 4000; ++i) ASSERT_EQ(p[i], 0) << "byte " << i;
}

TEST(SmallBuffers, ComeBackToTheThreadThatFreedThem) {
  // On a thread of its own: its cache starts empty, far from its bound.
  std::thread(reuse_on_a_fresh_thread).join();
}

TEST(SmallBuffers, AThreadFreesItsBlocksWhenItExits) {
  // Blocks made here and freed on a thread that then exits land in that thread's cache, which
  // must free them as the thread ends: the check is the ASan build's leak checker, which
  // reports the 16 blocks when the cache drops them (as it did with its clear() removed).
  std::vector<Buffer> made;
  for (int i = 0; i < 16; ++i) made.push_back(Buffer::allocate_uninitialized(64 * (i + 1)));
  std::thread([bufs = std::move(made)]() mutable { bufs.clear(); }).join();
}

}  // namespace
}  // namespace loom
