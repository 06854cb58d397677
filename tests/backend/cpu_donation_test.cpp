// Donation: an input whose tensor dies with the step lends its memory to an output, in place
// for elementwise updates; a live input is never overwritten.
#include <gtest/gtest.h>

#include "loom/loom.h"
#include "loom/runtime/engine.h"
#include "trace/context.h"

namespace {

using loom::Tensor;

const void* storage(const Tensor& t) { return t.impl()->buffer.data(); }

class CpuDonation : public ::testing::Test {
 protected:
  void SetUp() override {
    loom::sync();
    loom::runtime::set_backend("cpu");
    loom::reset_metrics();
  }
};

TEST_F(CpuDonation, AStepThatReplacesItsWeightsReusesTheirMemory) {
  Tensor w = loom::full({4096}, 1.0), g = loom::full({4096}, 0.5);
  loom::sync();
  for (int step = 0; step < 3; ++step) {
    const void* before = storage(w);
    w = w - g * 0.1;  // the old w dies with the step: its memory takes the new w
    loom::sync();
    EXPECT_EQ(storage(w), before) << "step " << step;
  }
  EXPECT_NEAR(w.to_vector<float>()[17], 1.0f - 3 * 0.05f, 1e-6);
  EXPECT_EQ(g.to_vector<float>()[17], 0.5f);  // g stayed alive and untouched
  EXPECT_GE(loom::metrics().donated_buffers, 3);
}

TEST_F(CpuDonation, ALiveInputIsNeverOverwritten) {
  Tensor w = loom::full({4096}, 1.0);
  loom::sync();
  Tensor keep = w;  // a second handle keeps the old value alive
  w = w * 3.0;
  loom::sync();
  EXPECT_NE(storage(w), storage(keep));
  EXPECT_EQ(keep.to_vector<float>()[0], 1.0f);
  EXPECT_EQ(w.to_vector<float>()[0], 3.0f);
}

TEST_F(CpuDonation, ReadsAtOtherPositionsPreventInPlaceReuse) {
  std::vector<float> v(64);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  Tensor x = loom::tensor(v, {8, 8});
  loom::sync();
  const void* before = storage(x);
  x = loom::transpose(x, 0, 1) + 0.0;  // reads x transposed: writing over it would corrupt it
  loom::sync();
  EXPECT_NE(storage(x), before);
  std::vector<float> got = x.to_vector<float>();
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 8; ++j) EXPECT_EQ(got[i * 8 + j], v[j * 8 + i]);
}

TEST_F(CpuDonation, PartialReadsDoNotDonate) {
  Tensor a = loom::full({4096}, 2.0);
  loom::sync();
  Tensor b = a + 1.0;
  Tensor c = a * 2.0;
  a = Tensor();
  EXPECT_EQ(b.to_vector<float>()[0], 3.0f);  // c still pending and still needs a's memory
  EXPECT_EQ(c.to_vector<float>()[0], 4.0f);
}

}  // namespace
