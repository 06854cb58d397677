// Tier-up (codegen.h, KernelCode): a module generated fast is generated again from the same
// optimized IR with the full instruction selector once its kernels have run for
// tier_up_after_us(), and its kernels swap to that code. The oracle is the fast code itself: every
// result must be the same bit for bit before and after, for the math that FastISel and the full
// selector lower differently (polynomials with fused multiply-adds, selects, divisions,
// integer Philox rounds, reductions, argmax), in float32 and float64.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "backend/cpu/codegen.h"
#include "loom/loom.h"
#include "loom/runtime/engine.h"

namespace {

using loom::Tensor;

// Restores the tier-up setting however a test ends.
class TierUpAfter {
 public:
  explicit TierUpAfter(int64_t us) : saved_(loom::cpu::tier_up_after_us()) {
    loom::cpu::set_tier_up_after_us(us);
  }
  ~TierUpAfter() {
    loom::cpu::wait_for_tier_ups();
    loom::cpu::set_tier_up_after_us(saved_);
  }
  TierUpAfter(const TierUpAfter&) = delete;
  TierUpAfter& operator=(const TierUpAfter&) = delete;

 private:
  int64_t saved_;
};

// The bytes of every output of one run of the program, each value widened to double (exact
// for float32, float64 and the indices here).
std::vector<std::vector<uint8_t>> run_bytes(const std::vector<Tensor>& outs) {
  loom::sync();
  std::vector<std::vector<uint8_t>> bytes;
  for (const Tensor& t : outs) {
    const std::vector<double> v = t.to_vector<double>();
    bytes.emplace_back(v.size() * sizeof(double));
    if (!v.empty()) std::memcpy(bytes.back().data(), v.data(), bytes.back().size());
  }
  return bytes;
}

// Math-heavy kernels on a fresh shape: float32 and float64 transcendentals, a softmax and an argmax
// per row, and random draws.
std::vector<Tensor> program(const Tensor& x32, const Tensor& x64, uint64_t seed) {
  std::vector<Tensor> outs;
  for (const Tensor& x : {x32, x64}) {
    outs.push_back(loom::exp(x) + loom::log(loom::abs(x) + 0.25) * loom::tanh(x));
    outs.push_back(loom::erf(x) - loom::sigmoid(x * 3.0));
    outs.push_back(loom::pow(loom::abs(x) + 0.5, x));
    outs.push_back(loom::softmax(x * 2.0, 1));
    outs.push_back(loom::argmax(loom::sin(x * 40.0) * loom::cos(x * 3.0), 1));
  }
  loom::manual_seed(seed);
  outs.push_back(loom::randn({37, 211}));
  outs.push_back(loom::rand({37, 211}, loom::float64));
  return outs;
}

// Values in [-amp, amp] along a sine of the element index, of a shape no other test uses (fresh
// kernels, so the test's own module is the one that tiers up).
Tensor wave(int64_t rows, int64_t cols, double amp, double step) {
  std::vector<float> host(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < host.size(); ++i)
    host[i] = static_cast<float>(amp * std::sin(step * static_cast<double>(i)));
  return loom::tensor(host, {rows, cols});
}

TEST(CpuTierUp, KernelsTierUpToTheSameBits) {
  loom::sync();
  loom::runtime::set_backend("cpu");
  TierUpAfter after(1);
  Tensor x32 = wave(37, 211, 6.0, 0.37);
  Tensor x64 = loom::to(x32, loom::float64);
  loom::sync();
  const int64_t before = loom::cpu::tier_ups();
  const auto first = run_bytes(program(x32, x64, 11));   // fast code; requests the tier-up
  const auto second = run_bytes(program(x32, x64, 11));  // either code (racing the tier-up)
  loom::cpu::wait_for_tier_ups();
  EXPECT_GT(loom::cpu::tier_ups(), before);
  const auto third = run_bytes(program(x32, x64, 11));  // tiered-up code
  ASSERT_EQ(first.size(), third.size());
  for (size_t o = 0; o < first.size(); ++o) {
    EXPECT_EQ(first[o], second[o]) << "output " << o;
    EXPECT_EQ(first[o], third[o]) << "output " << o << " changed with the tier-up";
  }
  // The tiered-up code still computes: another seed and other data give other draws and
  // values.
  const auto other = run_bytes(program(x32 * 0.5, x64 * 0.5, 12));
  EXPECT_NE(other.back(), third.back());
  EXPECT_NE(other.front(), third.front());
}

// Threads running the same kernels while their module tiers up: every run computes the same
// values, on whichever code it found (under ThreadSanitizer in CI: the swap is race-free).
TEST(CpuTierUp, RunsRacingTheSwapComputeTheSame) {
  loom::sync();
  loom::runtime::set_backend("cpu");
  TierUpAfter after(1);
  Tensor x = wave(29, 307, 4.0, 0.11);
  loom::sync();
  const int64_t before = loom::cpu::tier_ups();
  auto once = [&] {
    return run_bytes({loom::exp(loom::tanh(x) * 2.5) + loom::erf(x * 0.3), loom::argmax(x, 1)});
  };
  const auto want = once();
  std::vector<int> mismatches(2, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) mismatches[static_cast<size_t>(t)] += once() != want;
    });
  for (std::thread& th : threads) th.join();
  loom::cpu::wait_for_tier_ups();
  EXPECT_GT(loom::cpu::tier_ups(), before);  // the swap did happen
  EXPECT_EQ(mismatches, std::vector<int>(2, 0));
  EXPECT_EQ(once(), want);
}

// With tier-up off, nothing is requested however long the kernels run.
TEST(CpuTierUp, OffMeansFastCodeOnly) {
  loom::sync();
  loom::runtime::set_backend("cpu");
  TierUpAfter off(0);
  Tensor x = loom::tensor(std::vector<float>(53 * 7, 0.5f), {53, 7});
  loom::sync();
  const int64_t before = loom::cpu::tier_ups();
  for (int i = 0; i < 5; ++i) run_bytes({loom::exp(x) * 3.0 + loom::tanh(x)});
  loom::cpu::wait_for_tier_ups();
  EXPECT_EQ(loom::cpu::tier_ups(), before);
}

}  // namespace
