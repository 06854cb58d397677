// Fusion is visible: the number of loop kernels and library calls the CPU backend runs for
// softmax, layer_norm and a decoder layer, and the reuse of identical kernels across graphs.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "backend/cpu/plan.h"
#include "loom/ir/graph.h"
#include "loom/loom.h"
#include "loom/passes/pass.h"
#include "loom/runtime/engine.h"

namespace {

using loom::Tensor;

class CpuFusion : public ::testing::Test {
 protected:
  void SetUp() override {
    loom::sync();
    loom::runtime::set_backend("cpu");
  }
  // The executable the CPU backend builds for the graph that materializing `outs` runs.
  std::shared_ptr<const loom::backend::Executable> compiled(const std::vector<Tensor>& outs) {
    return loom::runtime::compile_cached(loom::ir::parse(loom::pending_ir(outs)));
  }
};

// The CPU backend's plan of the graph that materializing `outs` runs (top level, as
// compile_program makes it).
loom::cpu::Plan plan_of(const std::vector<Tensor>& outs) {
  loom::ir::Graph g = loom::ir::parse(loom::pending_ir(outs));
  loom::passes::default_pipeline().run(g);
  std::vector<std::vector<loom::ir::NodeId>> results;
  loom::ir::Graph split = loom::cpu::split_results(g, &results);
  return loom::cpu::make_plan(split, results, /*allow_views=*/true);
}

Tensor data(loom::Shape s, float scale = 0.01f) {
  std::vector<float> v(static_cast<size_t>(s.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * static_cast<float>((i * 7919) % 101) - 0.5f;
  return loom::tensor(v, s);
}

TEST_F(CpuFusion, SoftmaxIsOneKernel) {
  Tensor x = data({64, 128});
  auto exe = compiled({loom::softmax(x, -1)});
  EXPECT_EQ(exe->num_kernels(), 1);
  EXPECT_EQ(exe->num_library_calls(), 0);
  loom::sync();
}

TEST_F(CpuFusion, LogSoftmaxAndCrossEntropyStayFew) {
  Tensor x = data({64, 128});
  EXPECT_EQ(compiled({loom::log_softmax(x, 1)})->num_kernels(), 1);
  Tensor t = loom::tensor(std::vector<int64_t>(64, 3), {64});
  // log_softmax (1 kernel), gather (reference fallback), the labels' count (1 kernel, which
  // does not wait for the gather) and the mean (1 kernel)
  EXPECT_LE(compiled({loom::cross_entropy(x, t)})->num_kernels(), 4);
  loom::sync();
}

TEST_F(CpuFusion, LayerNormIsOneKernel) {
  Tensor x = data({4, 32, 256});
  Tensor w = data({256}), b = data({256});
  auto exe = compiled({loom::layer_norm(x, {256}, w, b)});
  EXPECT_EQ(exe->num_kernels(), 1);
  loom::sync();
}

TEST_F(CpuFusion, DecoderLayerIsOneProductAndNoKernel) {
  Tensor x = data({4, 64, 128}), w = data({128, 128}), b = data({128});
  // Linear (transposed weight read in place) -> bias + GELU + residual: oneDNN's post-ops
  // (tests/backend/cpu_onednn_test.cpp), so no loop kernel at all.
  Tensor y = loom::gelu(loom::matmul(x, loom::transpose(w, 0, 1)) + b) + x;
  auto exe = compiled({y});
  EXPECT_EQ(exe->num_library_calls(), 1);
  EXPECT_EQ(exe->num_kernels(), 0);
  // With the final LayerNorm behind the last layer's epilogue: one kernel.
  Tensor z = loom::layer_norm(y, {128});
  auto exe2 = compiled({z});
  EXPECT_EQ(exe2->num_library_calls(), 1);
  EXPECT_EQ(exe2->num_kernels(), 1);
  loom::sync();
}

// The exact GELU's 1 + erf(x / sqrt 2) is shared by its forward and its backward: stored
// over small tensors (recomputing a transcendental costs more than a cached read), recomputed
// over tensors of 1 MiB and more (kRecomputeLarge in plan.cpp). Both plans against the closed
// forms y = x/2 (1 + erf(x/sqrt 2)) and dy/dx = (1 + erf(x/sqrt 2))/2 + x exp(-x^2/2)/sqrt(2 pi).
TEST_F(CpuFusion, TheGeluErfTermIsRecomputedOverLargeTensorsAndStoredOverSmallOnes) {
  for (int64_t n : {64, 512}) {
    SCOPED_TRACE(n);
    Tensor x = (data({n, n}, 0.08f) - 3.5).detach().requires_grad_();  // in [-4, 4]
    Tensor y = loom::gelu(x);
    loom::sum(y).backward();
    loom::cpu::Plan plan = plan_of({y, x.grad()});
    int temps = 0;
    for (const loom::cpu::BufferInfo& b : plan.bufs) temps += b.kind == loom::cpu::BufferInfo::Temp;
    EXPECT_EQ(temps, n * n * 4 >= (1 << 20) ? 0 : 1);
    std::vector<float> xv = x.to_vector<float>(), yv = y.to_vector<float>(),
                       dv = x.grad().to_vector<float>();
    for (size_t i = 0; i < xv.size(); ++i) {
      const double v = xv[i], e = 1 + std::erf(v * M_SQRT1_2);
      const double d = e / 2 + v * std::exp(-v * v / 2) / std::sqrt(2 * M_PI);
      ASSERT_NEAR(yv[i], v / 2 * e, 2e-6 * (1 + std::abs(v))) << i;
      ASSERT_NEAR(dv[i], d, 2e-6 * (1 + std::abs(d))) << i;
    }
  }
}

// Over 1 MiB a dropout mask is recomputed by the backward's kernel rather than stored (the
// same rule): the draw depends only on the key and the element, so both kernels see one mask.
// The oracle: the input's gradient is zero exactly where the output was dropped.
TEST_F(CpuFusion, ARecomputedDropoutMaskIsTheForwardsMask) {
  loom::manual_seed(3);
  for (int64_t n : {256, 4096}) {
    SCOPED_TRACE(n);
    Tensor x = (loom::randn({n, 512}) + 3.0).detach().requires_grad_();
    Tensor w = loom::randn({512, 64}) * 0.05;
    loom::sync();
    Tensor y = loom::dropout(x, 0.5);
    loom::sum(loom::tanh(loom::matmul(y, w))).backward();
    loom::cpu::Plan plan = plan_of({y, x.grad()});
    int masks = 0;  // stored bool temporaries
    for (const loom::cpu::BufferInfo& b : plan.bufs)
      masks += b.kind == loom::cpu::BufferInfo::Temp && b.type.dtype == loom::DType::Bool;
    EXPECT_EQ(masks, n * 512 >= (1 << 20) ? 0 : 1);
    std::vector<float> yv = y.to_vector<float>(), gv = x.grad().to_vector<float>();
    int64_t kept = 0;
    for (size_t i = 0; i < yv.size(); ++i) {
      ASSERT_EQ(yv[i] == 0, gv[i] == 0) << i;
      kept += yv[i] != 0;
    }
    EXPECT_NEAR(static_cast<double>(kept) / static_cast<double>(yv.size()), 0.5, 0.02);
  }
}

TEST_F(CpuFusion, ElementwiseChainsWithLayoutOpsAreOneKernel) {
  Tensor a = data({32, 64}), b = data({64, 32}), c = data({64});
  Tensor y = loom::relu(a * 2 + loom::transpose(b, 0, 1)) - loom::slice(c, 0, 0, 64) * loom::exp(a);
  EXPECT_EQ(compiled({loom::to(y, loom::DType::Float64)})->num_kernels(), 1);
  loom::sync();
}

}  // namespace

namespace {

// Kernels are shared by their description text: constants that differ only in their 7th
// significant digit (or in their last bit) must still give kernels of their own.
TEST_F(CpuFusion, KernelsWithNearlyEqualConstantsAreNotShared) {
  loom::Buffer in = loom::Buffer::allocate(2 * sizeof(double));
  double* p = static_cast<double*>(in.data());
  p[0] = 1.0;
  p[1] = 3.0;
  for (const char* c : {"1.0000001", "1.0000002", "1.0000000000000002"}) {
    auto exe = loom::runtime::compile_cached(loom::ir::parse(std::string(R"(graph(%0: f64[2]) {
  %1 = constant() {value=)") + c + R"(} : f64[]
  %2 = expand(%1) {shape=[2]} : f64[2]
  %3 = mul(%0, %2) : f64[2]
  return %3
}
)"));
    std::vector<loom::Buffer> out =
        loom::runtime::run_executable(*exe, std::vector<loom::Buffer>{in});
    const double v = std::strtod(c, nullptr);
    EXPECT_EQ(static_cast<const double*>(out[0].data())[0], v) << c;
    EXPECT_EQ(static_cast<const double*>(out[0].data())[1], 3.0 * v) << c;
  }
}

}  // namespace

namespace {

// The JIT turns a product that feeds a sum into one fused multiply-add (jit.cpp,
// fuse_multiply_adds): every position of the product in an add and a sub, a product with two
// uses (not fused), and the polynomial transcendentals, against the closed form in double.
TEST_F(CpuFusion, MultiplyAddsKeepTheirOperandsAndSigns) {
  const loom::Shape s{3, 67};  // a vector body and a remainder
  Tensor a = data(s, 0.013f), b = data(s, 0.021f), c = data(s, 0.017f);
  std::vector<float> av = a.to_vector<float>(), bv = b.to_vector<float>(),
                     cv = c.to_vector<float>();
  // One graph each: CSE would merge the products of one graph into a value of many uses.
  std::vector<std::function<Tensor()>> exprs{[&] { return a * b + c; },
                                             [&] { return c + a * b; },
                                             [&] { return a * b - c; },
                                             [&] { return c - a * b; },
                                             [&] {
                                               Tensor ab = a * b;
                                               return ab * c - ab;
                                             },
                                             [&] { return loom::exp(a * 3.0); },
                                             [&] { return loom::log(b + 1.0); },
                                             [&] { return loom::erf(c * 2.0); },
                                             [&] { return loom::tanh(a * 4.0); }};
  std::vector<Tensor> got;
  for (const auto& e : exprs) {
    got.push_back(e());
    loom::sync();
  }
  std::vector<std::function<double(double, double, double)>> want{
      [](double x, double y, double z) { return x * y + z; },
      [](double x, double y, double z) { return z + x * y; },
      [](double x, double y, double z) { return x * y - z; },
      [](double x, double y, double z) { return z - x * y; },
      [](double x, double y, double z) { return x * y * z - x * y; },
      [](double x, double, double) { return std::exp(x * 3.0); },
      [](double, double y, double) { return std::log(y + 1.0); },
      [](double, double, double z) { return std::erf(z * 2.0); },
      [](double x, double, double) { return std::tanh(x * 4.0); }};
  for (size_t k = 0; k < got.size(); ++k) {
    std::vector<float> v = got[k].to_vector<float>();
    for (size_t i = 0; i < v.size(); ++i) {
      const double w = want[k](av[i], bv[i], cv[i]);
      ASSERT_NEAR(v[i], w, 2e-6 * (1 + std::abs(w))) << "expression " << k << " at " << i;
    }
  }
}

}  // namespace
