// Run by tests/dist/launch_test.sh under loom-launch -n 2: the ranks find each other from
// the environment loom-launch sets. Skipped when run alone.
#include <gtest/gtest.h>

#include <cstdlib>

#include "loom/loom.h"

namespace loom {
namespace {

TEST(DistLaunch, TwoRanksMeet) {
  if (!std::getenv("LOOM_WORLD_SIZE") || std::getenv("LOOM_TEST_CHILD_RANK"))
    GTEST_SKIP() << "run by launch_test.sh under loom-launch";
  dist::init();
  EXPECT_EQ(dist::world_size(), 2);
  Tensor t = full({3}, 1.0 + dist::rank());
  for (float v : dist::all_reduce(t).to_vector<float>()) EXPECT_EQ(v, 3.0f);
  dist::barrier();
  dist::finalize();
}

}  // namespace
}  // namespace loom
