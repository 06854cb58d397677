// The run's floating-point mode (loom/core/fp_mode.h): with flushing on (the default),
// denormal inputs read as zero and denormal results are written as zero on every thread a
// run uses (the calling thread, the pool's workers, inside products and native loops); with
// it off, results are IEEE's. The oracle: the same arithmetic on the host, in the test's own
// IEEE mode, and zero where flushing applies. The host's mode is the same after a run.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "loom/loom.h"
#include "loom/runtime/engine.h"

namespace {

using loom::Tensor;

constexpr float kDenormal = 1e-39f;  // below float32's smallest normal, 1.18e-38
constexpr float kSmall = 1e-20f;     // normal; its square, 1e-40, is not

struct Results {
  std::vector<float> scaled, squared, product, cumsum;
};

// Three programs whose results are normal numbers computed from denormal operands, or
// denormal numbers computed from normal ones; each large enough to run across the pool.
Results run(const std::string& backend) {
  loom::sync();
  loom::runtime::set_backend(backend);
  loom::runtime::clear_compile_cache();
  Tensor tiny = loom::full({1 << 18}, kDenormal), small = loom::full({1 << 18}, kSmall);
  Tensor a = loom::full({256, 512}, kDenormal), b = loom::ones({512, 256});
  Tensor xs = loom::full({100, 1}, kDenormal);
  loom::sync();
  Results r;
  r.scaled = (tiny * 64.0f).to_vector<float>();  // IEEE: 6.4e-38, normal
  r.squared = (small * small).to_vector<float>();
  r.product = loom::matmul(a, b).to_vector<float>();  // IEEE: 512e-39, normal
  auto [sum, ys] = loom::scan(
      [](const Tensor& acc, const Tensor& x) {
        Tensor s = acc + x;
        return std::pair{s, s};
      },
      loom::zeros({1}), xs);
  r.cumsum = sum.to_vector<float>();  // IEEE: 1e-37
  loom::runtime::set_backend("cpu");
  return r;
}

void expect_all(const std::vector<float>& v, float want, const char* what) {
  ASSERT_FALSE(v.empty());
  size_t bad = 0;
  for (float x : v) bad += !(want == 0 ? x == 0 : std::abs(x - want) <= 1e-5f * want);
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << v.size() << " elements differ from "
                     << want << " (first " << v[0] << ")";
}

class FpMode : public ::testing::TestWithParam<std::string> {
 protected:
  void TearDown() override { loom::set_flush_denormal(true); }
};

TEST_P(FpMode, FlushedRunsReadAndWriteDenormalsAsZero) {
  uint32_t host = loom::detail::fp_control();
  ASSERT_TRUE(loom::flush_denormal());  // the default
  volatile float d = kDenormal, s = kSmall;
  ASSERT_NE(d * 64.0f, 0.0f);  // the host computes in IEEE mode
  ASSERT_NE(s * s, 0.0f);
  Results r = run(GetParam());
  expect_all(r.scaled, 0, "denormal * 64");
  expect_all(r.squared, 0, "1e-20 squared");
  expect_all(r.product, 0, "matmul of denormals");
  expect_all(r.cumsum, 0, "scan sum of denormals");
  EXPECT_EQ(loom::detail::fp_control(), host) << "the thread's own mode is restored";
  EXPECT_NE(d * 64.0f, 0.0f);
}

TEST_P(FpMode, IeeeRunsKeepGradualUnderflow) {
  uint32_t host = loom::detail::fp_control();
  EXPECT_TRUE(loom::set_flush_denormal(false));  // returns the previous setting
  EXPECT_FALSE(loom::flush_denormal());
  volatile float d = kDenormal, s = kSmall;
  float sum = 0;
  for (int i = 0; i < 100; ++i) sum += d;
  float dot = 0;
  for (int i = 0; i < 512; ++i) dot += d;
  Results r = run(GetParam());
  expect_all(r.scaled, d * 64.0f, "denormal * 64");
  expect_all(r.squared, s * s, "1e-20 squared");
  expect_all(r.product, dot, "matmul of denormals");
  expect_all(r.cumsum, sum, "scan sum of denormals");
  EXPECT_EQ(loom::detail::fp_control(), host);
  // Back on: the compiled programs (cached) now flush again, the mode being read per run.
  EXPECT_FALSE(loom::set_flush_denormal(true));
  Tensor tiny = loom::full({1 << 18}, kDenormal);
  expect_all((tiny * 64.0f).to_vector<float>(), 0, "denormal * 64 after turning it on");
}

INSTANTIATE_TEST_SUITE_P(Backends, FpMode, ::testing::Values("cpu", "ref"),
                         [](const auto& info) { return info.param; });

}  // namespace
