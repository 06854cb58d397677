// The caching pool: blocks come back for allocations of their size, the bound holds, and a
// size that does not fit evicts the least recently used sizes rather than being turned away.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace loom
