// DataParallel: 2 ranks with batch B each end with the parameters of 1 rank with batch 2B
// after 20 compiled (trace_once) steps, within 1e-5 relative; rank 0's parameters are
// broadcast at start (rank 1 starts from other values); shard() splits rows.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "dist/dist_util.h"
#include "loom/loom.h"

namespace loom {
namespace {

struct Mlp : nn::Module {
  std::shared_ptr<nn::Linear> a, b;
  Mlp() {
    a = register_module("a", std::make_shared<nn::Linear>(8, 16));
    b = register_module("b", std::make_shared<nn::Linear>(16, 4));
  }
  Tensor forward(const Tensor& x) override { return (*b)(gelu((*a)(x))); }
};

Tensor host_tensor(Shape s, double seed) {
  std::vector<float> v;
  for (int64_t i = 0; i < s.numel(); ++i)
    v.push_back(static_cast<float>(std::sin(seed + 0.7 * i)) * 0.5f);
  return tensor(v, s);
}

// Trains 20 steps on rows [begin, end) of each step's batch of 2B; returns the parameters.
std::map<std::string, std::vector<float>> train(int rank, int64_t B) {
  Mlp model;
  int k = 0;
  for (auto& [name, p] : model.named_parameters()) {
    NoGradGuard g;
    p.copy_(host_tensor(p.shape(), rank == 0 ? 1.0 + k : 50.0 + k));  // rank 1: other values
    ++k;
  }
  loom::sync();
  dist::DataParallel dp(model, {.bucket_mib = 0.0005});  // several buckets
  optim::SGD opt(model.parameters(), 0.05, 0.9);
  auto step = compile(
      [&](const Tensor& x, const Tensor& y) {
        opt.zero_grad();
        Tensor loss = mse_loss(model(x), y);
        loss.backward();
        dp.average_gradients();
        opt.step();
        return loss;
      },
      {.name = "dp_step", .trace_once = true});
  auto [begin, end] = dist::shard(2 * B);
  for (int s = 0; s < 20; ++s) {
    Tensor X = host_tensor({2 * B, 8}, 3.0 * s), Y = host_tensor({2 * B, 4}, 7.0 * s + 1);
    step(slice(X, 0, begin, end), slice(Y, 0, begin, end));
  }
  std::map<std::string, std::vector<float>> out;
  for (auto& [name, p] : model.named_parameters()) out[name] = p.to_vector<float>();
  return out;
}

TEST(DataParallel, TwoRanksEqualOneRankWithTheWholeBatch) {
  const int64_t B = 6;
  std::map<std::string, std::vector<float>> one, two[2];
  testing::thread_ranks(1, [&](int) { one = train(0, B); });
  testing::thread_ranks(2, [&](int r) { two[r] = train(r, B); });
  ASSERT_FALSE(one.empty());
  for (auto& [name, ref] : one) {
    for (int r = 0; r < 2; ++r) {
      const std::vector<float>& got = two[r][name];
      ASSERT_EQ(got.size(), ref.size()) << name;
      for (size_t i = 0; i < ref.size(); ++i)
        ASSERT_NEAR(got[i], ref[i], 1e-5 * std::max(1.0f, std::abs(ref[i])))
            << name << "[" << i << "] on rank " << r;
    }
  }
  // The parameters moved (the comparison is not of two untouched copies).
  EXPECT_NE(one["a.weight"], host_tensor({16, 8}, 1.0).to_vector<float>());
}

TEST(DataParallel, ShardSplitsRowsAndDropsTheRemainder) {
  EXPECT_EQ(dist::shard(10, 0, 3), (std::pair<int64_t, int64_t>{0, 3}));
  EXPECT_EQ(dist::shard(10, 2, 3), (std::pair<int64_t, int64_t>{6, 9}));
}

}  // namespace
}  // namespace loom
