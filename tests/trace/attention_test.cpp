// scaled_dot_product_attention against a host reference written here in double (masks,
// causal with L != S, both together, grouped heads, fully masked rows), its gradients against
// float64 central differences, the CPU backend's blocked kernel against the reference backend at
// sizes that cross and do not divide its blocks, its memory at T = 4096 against the closed
// form, packed_qkv_attention against the sdpa of its heads, the layouts around attention
// read and written in place (values and gradients against the reference backend, and no copy
// kernels left in the plan), and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "backend/cpu/block_gemm.h"
#include "backend/cpu/plan.h"
#include "expect_error.h"
#include "loom/core/buffer.h"
#include "loom/ir/graph.h"
#include "loom/loom.h"
#include "loom/passes/pass.h"
#include "loom/runtime/engine.h"

namespace {

using loom::Tensor;
using loom::testing::expect_error;

std::vector<double> dv(const Tensor& t) { return t.to_vector<double>(); }

struct Case {
  int64_t B, Hq, Hk, L, S, E, Ev;
  bool causal = false;
  int mask = 0;  // 0 none, 1 boolean [L, S], 2 additive [B, 1, L, S]
};

// softmax(q k^T * scale + mask) v per (batch, head), heads of k and v shared by Hq / Hk
// consecutive q heads; a row with no key gives zeros.
std::vector<double> reference(const Case& c, const std::vector<double>& q,
                              const std::vector<double>& k, const std::vector<double>& v,
                              const std::vector<double>& mask) {
  const double scale = 1 / std::sqrt(static_cast<double>(c.E));
  std::vector<double> out(c.B * c.Hq * c.L * c.Ev, 0);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.Hq; ++h) {
      const int64_t hk = h / (c.Hq / c.Hk);
      for (int64_t i = 0; i < c.L; ++i) {
        std::vector<double> s(c.S, -INFINITY);
        double top = -INFINITY;
        for (int64_t j = 0; j < c.S; ++j) {
          if (c.causal && j > i) continue;
          if (c.mask == 1 && mask[i * c.S + j] == 0) continue;
          double dot = 0;
          for (int64_t e = 0; e < c.E; ++e)
            dot +=
                q[((b * c.Hq + h) * c.L + i) * c.E + e] * k[((b * c.Hk + hk) * c.S + j) * c.E + e];
          s[j] = dot * scale + (c.mask == 2 ? mask[(b * c.L + i) * c.S + j] : 0);
          top = std::max(top, s[j]);
        }
        if (top == -INFINITY) continue;
        double z = 0;
        for (double& x : s) z += (x = std::exp(x - top));
        for (int64_t e = 0; e < c.Ev; ++e) {
          double acc = 0;
          for (int64_t j = 0; j < c.S; ++j)
            acc += s[j] / z * v[((b * c.Hk + hk) * c.S + j) * c.Ev + e];
          out[((b * c.Hq + h) * c.L + i) * c.Ev + e] = acc;
        }
      }
    }
  return out;
}

struct Inputs {
  Tensor q, k, v, mask;
  loom::SdpaOptions opts;
};

Inputs make(const Case& c, loom::DType dt) {
  Inputs in;
  in.q = loom::to(loom::randn({c.B, c.Hq, c.L, c.E}), dt);
  in.k = loom::to(loom::randn({c.B, c.Hk, c.S, c.E}), dt);
  in.v = loom::to(loom::randn({c.B, c.Hk, c.S, c.Ev}), dt);
  if (c.mask == 1) {  // every other row keeps no key at all: torch >= 2.5 gives zeros there
    std::vector<bool> m(c.L * c.S);
    for (int64_t i = 0; i < c.L; ++i)
      for (int64_t j = 0; j < c.S; ++j) m[i * c.S + j] = (i % 3 != 1) && ((i + j) % 3 != 0);
    in.mask = loom::tensor(m, {c.L, c.S});
  } else if (c.mask == 2) {
    in.mask = loom::to(loom::randn({c.B, 1, c.L, c.S}), dt);
  }
  in.opts.attn_mask = in.mask;
  in.opts.is_causal = c.causal;
  in.opts.enable_gqa = c.Hq != c.Hk;
  return in;
}

std::vector<double> mask_values(const Case& c, const Inputs& in) {
  return c.mask == 0 ? std::vector<double>{} : dv(in.mask);
}

TEST(AttentionTest, MatchesAHostReference) {
  loom::manual_seed(7);
  const Case cases[] = {
      {2, 2, 2, 5, 5, 4, 4},           {1, 3, 3, 4, 7, 5, 3, true},
      {1, 2, 2, 7, 4, 3, 2, true},     {2, 4, 2, 3, 6, 4, 5},
      {1, 2, 2, 6, 5, 4, 4, false, 1}, {2, 2, 1, 4, 6, 3, 3, false, 2},
      {1, 1, 1, 1, 9, 8, 8},           {1, 6, 2, 5, 5, 4, 4, true},
      {1, 2, 2, 6, 5, 4, 4, true, 1},  {2, 2, 1, 4, 6, 3, 3, true, 2},  // a mask and causal
  };
  for (const Case& c : cases)
    for (loom::DType dt : {loom::DType::Float32, loom::DType::Float64}) {
      Inputs in = make(c, dt);
      std::vector<double> got = dv(loom::scaled_dot_product_attention(in.q, in.k, in.v, in.opts));
      std::vector<double> want = reference(c, dv(in.q), dv(in.k), dv(in.v), mask_values(c, in));
      ASSERT_EQ(got.size(), want.size());
      const double tol = dt == loom::DType::Float64 ? 1e-12 : 2e-5;
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i])))
            << "case L=" << c.L << " S=" << c.S << " Hq=" << c.Hq << " Hk=" << c.Hk
            << " causal=" << c.causal << " mask=" << c.mask << " at " << i;
    }
}

// d/dx sum(w * sdpa) against central differences in float64, for q, k, v and an additive mask.
TEST(AttentionTest, GradientsMatchCentralDifferences) {
  loom::manual_seed(11);
  for (const Case& c : {Case{1, 2, 2, 3, 4, 3, 2, true}, Case{1, 2, 1, 3, 4, 3, 2, false, 1},
                        Case{2, 1, 1, 3, 3, 2, 2, false, 2}}) {
    Inputs in = make(c, loom::DType::Float64);
    Tensor w = loom::to(loom::randn({c.B, c.Hq, c.L, c.Ev}), loom::DType::Float64);
    std::vector<Tensor*> leaves = {&in.q, &in.k, &in.v};
    if (c.mask == 2) leaves.push_back(&in.mask);
    for (Tensor* t : leaves) t->requires_grad_();
    auto loss = [&](const Inputs& x) {
      loom::SdpaOptions o = x.opts;
      o.attn_mask = x.mask;
      return loom::sum(loom::scaled_dot_product_attention(x.q, x.k, x.v, o) * w);
    };
    loss(in).backward();
    for (Tensor* t : leaves) {
      std::vector<double> g = dv(t->grad()), base = dv(*t);
      ASSERT_EQ(g.size(), base.size());
      for (size_t i = 0; i < base.size(); ++i) {
        double f[2];
        for (int side = 0; side < 2; ++side) {
          std::vector<double> moved = base;
          moved[i] += side ? 1e-6 : -1e-6;
          Inputs x = in;
          Tensor* target = t == &in.q ? &x.q : t == &in.k ? &x.k : t == &in.v ? &x.v : &x.mask;
          *target = loom::tensor(moved, t->shape());
          loom::NoGradGuard ng;
          f[side] = dv(loss(x))[0];
        }
        const double fd = (f[1] - f[0]) / 2e-6;
        ASSERT_TRUE(std::isfinite(g[i]));
        ASSERT_NEAR(g[i], fd, 1e-6 * (1 + std::abs(fd))) << "leaf " << (t - &in.q) << " at " << i;
      }
    }
  }
}

// Output and every gradient on the CPU backend (blocks of queries and keys, online softmax,
// recomputing backward) against the reference backend (each score row in double).
TEST(AttentionTest, BlockedKernelMatchesTheReferenceBackendAcrossBlocks) {
  const Case cases[] = {
      {1, 2, 2, 200, 333, 16, 8},
      {1, 2, 2, 300, 130, 8, 16, true},
      {2, 4, 2, 129, 257, 8, 8},
      {1, 2, 2, 150, 270, 8, 8, false, 1},
      {1, 1, 1, 131, 260, 8, 8, false, 2},
      {1, 2, 1, 70, 70, 16, 16, true},
      {1, 1, 1, 1, 1, 4, 4},
  };
  for (const Case& c : cases)
    for (int run = 0; run < 3; ++run) {
      // float32 on the AVX-512 block products (where the CPU has them) and on oneDNN's sgemm.
      const loom::DType dt = run == 2 ? loom::DType::Float64 : loom::DType::Float32;
      loom::cpu::enable_block_gemm(run == 0);
      loom::manual_seed(5);
      Inputs in = make(c, dt);
      Tensor w = loom::to(loom::randn({c.B, c.Hq, c.L, c.Ev}), dt);
      std::vector<Tensor*> leaves = {&in.q, &in.k, &in.v};
      if (c.mask == 2) leaves.push_back(&in.mask);
      std::vector<std::vector<double>> got[2];
      for (int backend = 0; backend < 2; ++backend) {
        loom::runtime::set_backend(backend ? "ref" : "cpu");
        for (Tensor* t : leaves) *t = t->detach().requires_grad_();
        loom::SdpaOptions o = in.opts;
        o.attn_mask = in.mask;
        Tensor y = loom::scaled_dot_product_attention(in.q, in.k, in.v, o);
        loom::sum(y * w).backward();
        got[backend].push_back(dv(y));
        for (Tensor* t : leaves) got[backend].push_back(dv(t->grad()));
      }
      loom::runtime::set_backend("cpu");
      const double tol = dt == loom::DType::Float64 ? 1e-11 : 1e-5;
      for (size_t r = 0; r < got[0].size(); ++r) {
        ASSERT_EQ(got[0][r].size(), got[1][r].size());
        for (size_t i = 0; i < got[0][r].size(); ++i)
          ASSERT_NEAR(got[0][r][i], got[1][r][i], tol * (1 + std::abs(got[1][r][i])))
              << (r == 0 ? "output" : "gradient of leaf " + std::to_string(r - 1)) << " L=" << c.L
              << " S=" << c.S << " Hq=" << c.Hq << " Hk=" << c.Hk << " causal=" << c.causal
              << " mask=" << c.mask << " " << dt << " block products " << (run == 0) << " at " << i;
      }
    }
  loom::cpu::enable_block_gemm(true);
}

// A NaN score makes its softmax row NaN, as torch's: a query row of NaNs (every score of the row
// NaN, which a max ignoring NaN would take for a fully masked row and give zeros) and a NaN in
// one key of another head (in a later key block: every row of that head). Other rows stay exact.
TEST(AttentionTest, NaNScoresSpreadToTheirRowsOnBothBackends) {
  const int64_t H = 2, L = 140, S = 300, E = 8;
  for (loom::DType dt : {loom::DType::Float32, loom::DType::Float64}) {
    loom::manual_seed(9);
    std::vector<double> q = dv(loom::randn({1, H, L, E})), k = dv(loom::randn({1, H, S, E}));
    for (int64_t e = 0; e < E; ++e) q[5 * E + e] = std::numeric_limits<double>::quiet_NaN();
    k[(S + 280) * E] = std::numeric_limits<double>::quiet_NaN();
    Tensor qt = loom::to(loom::tensor(q, {1, H, L, E}), dt);
    Tensor kt = loom::to(loom::tensor(k, {1, H, S, E}), dt);
    Tensor vt = loom::to(loom::randn({1, H, S, E}), dt);
    std::vector<double> got[2];
    for (int backend = 0; backend < 2; ++backend) {
      loom::runtime::set_backend(backend ? "ref" : "cpu");
      got[backend] = dv(loom::scaled_dot_product_attention(qt, kt, vt));
    }
    loom::runtime::set_backend("cpu");
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < L; ++i)
        for (int64_t e = 0; e < E; ++e) {
          const size_t at = static_cast<size_t>((h * L + i) * E + e);
          const bool want_nan = h == 1 || i == 5;
          for (int backend = 0; backend < 2; ++backend)
            ASSERT_EQ(std::isnan(got[backend][at]), want_nan)
                << (backend ? "ref" : "cpu") << " head " << h << " row " << i << " " << dt;
          if (!want_nan) ASSERT_NEAR(got[0][at], got[1][at], 1e-5 * (1 + std::abs(got[1][at])));
        }
  }
}

// Forward and backward at T = 4096 keep no [T, S] buffer: the peak of live buffers stays
// within 1.2x the closed-form size of q, k, v, the output's weights, the output, the
// log-sum-exp, delta and the three gradients (one score tensor alone is 4x that).
TEST(AttentionTest, ForwardAndBackwardAtT4096HoldNoScoreSizedBuffer) {
  const int64_t B = 1, H = 2, T = 4096, E = 64;
  loom::manual_seed(2);
  Tensor q = loom::randn({B, H, T, E}), k = loom::randn({B, H, T, E}),
         v = loom::randn({B, H, T, E}), w = loom::randn({B, H, T, E});
  for (Tensor* t : {&q, &k, &v}) t->requires_grad_();
  loom::sync();
  const size_t before = loom::Buffer::live_bytes();
  loom::Buffer::reset_peak();
  loom::SdpaOptions causal;
  causal.is_causal = true;
  Tensor y = loom::scaled_dot_product_attention(q, k, v, causal);
  loom::sum(y * w).backward();
  loom::sync();
  ASSERT_TRUE(q.grad().defined() && k.grad().defined() && v.grad().defined());
  const double tensor = static_cast<double>(B * H * T * E * 4), row = B * H * T * 4;
  const double inputs = 4 * tensor, made = tensor + 2 * row + 3 * tensor;  // o, lse, delta, grads
  // Other tests' buffers may still be live: what this one allocated, plus its inputs.
  const double peak = static_cast<double>(loom::Buffer::peak_bytes() - before) + inputs;
  EXPECT_LE(peak, 1.2 * (inputs + made))
      << "peak " << peak / 1e6 << " MB, closed form " << (inputs + made) / 1e6
      << " MB; one score tensor is " << T * T * H * 4 / 1e6 << " MB";
  EXPECT_GE(peak - inputs, 0.9 * made) << "the results were not counted";
}

TEST(AttentionTest, PackedQkvAttentionIsTheSdpaOfItsHeads) {
  loom::manual_seed(3);
  const int64_t B = 2, T = 5, D = 6, H = 3;
  Tensor qkv = loom::randn({B, T, 3 * D});
  auto head = [&](int64_t k) {
    return loom::permute(loom::reshape(loom::slice(qkv, 2, k * D, (k + 1) * D), {B, T, H, D / H}),
                         {0, 2, 1, 3});
  };
  Tensor want = loom::scaled_dot_product_attention(head(0), head(1), head(2), {.is_causal = true});
  want = loom::reshape(loom::permute(want, {0, 2, 1, 3}), {B, T, D});
  std::vector<double> got = dv(loom::packed_qkv_attention(qkv, H)), w = dv(want);
  for (size_t i = 0; i < w.size(); ++i) EXPECT_DOUBLE_EQ(got[i], w[i]);
}

// Layouts around attention as a GPT layer writes them: q, k and v sliced from one [B, T, 3C]
// projection plus bias, split into heads and permuted; the output permuted back and projected;
// the gradients concatenated into the projection's. Variants: grouped heads, q read transposed
// (its rows not contiguous: copied), k and v broadcast over the batch (a zero stride), and the
// output concatenated beside another tensor. The CPU backend against the reference backend.
struct LayoutCase {
  int variant;  // 0 GPT, 1 grouped heads, 2 q transposed, 3 k and v broadcast, 4 output in a cat
  bool grad;
};

// The layer's output, or with c.grad the gradients of its leaves, still pending.
std::vector<Tensor> layout_layer(const LayoutCase& c, loom::DType dt) {
  const int64_t B = 2, T = 37, H = 4, D = 8, C = H * D, Hk = c.variant == 1 ? 2 : H;
  const int64_t width = C + 2 * Hk * D;
  loom::manual_seed(11);
  Tensor x = loom::to(loom::randn({B, T, C}), dt), wqkv = loom::to(loom::randn({C, width}), dt);
  Tensor bias = loom::to(loom::randn({width}), dt), wo = loom::to(loom::randn({C, C}), dt);
  Tensor kv = loom::to(loom::randn({1, H, T, 2 * D}), dt), w = loom::to(loom::randn({B, T, C}), dt);
  Tensor extra = loom::to(loom::randn({B, T, 3}), dt), qt = loom::to(loom::randn({B, H, D, T}), dt);
  std::vector<Tensor*> leaves = {&x, &wqkv, &bias, &wo, &kv, &qt};
  if (c.grad)
    for (Tensor* t : leaves) *t = t->detach().requires_grad_();
  // Only y outlives the block: the layouts are no outputs of the graph that computes it.
  Tensor y = [&] {
    Tensor qkv = loom::matmul(x, wqkv * 0.3) + bias;
    auto heads = [&](int64_t from, int64_t n) {
      Tensor s = loom::slice(qkv, 2, from, from + n * D);
      return loom::permute(loom::reshape(s, {B, T, n, D}), {0, 2, 1, 3});
    };
    Tensor q = heads(0, H), k = heads(C, Hk), v = heads(C + Hk * D, Hk);
    if (c.variant == 2) q = loom::permute(qt, {0, 1, 3, 2});
    if (c.variant == 3) {
      k = loom::expand(loom::slice(kv, 3, 0, D), {B, H, T, D});
      v = loom::expand(loom::slice(kv, 3, D, 2 * D), {B, H, T, D});
    }
    loom::SdpaOptions o;
    o.is_causal = true;
    o.enable_gqa = Hk != H;
    Tensor a = loom::scaled_dot_product_attention(q, k, v, o);
    a = loom::reshape(loom::permute(a, {0, 2, 1, 3}), {B, T, C});
    return c.variant == 4 ? loom::cat({a, extra}, 2) : loom::matmul(a, wo * 0.2);
  }();
  Tensor ww = c.variant == 4 ? loom::to(loom::randn({B, T, C + 3}), dt) : w;
  if (!c.grad) return {y};
  loom::sum(y * ww).backward();
  std::vector<Tensor> grads;
  for (Tensor* t : leaves)
    if (t->grad().defined()) grads.push_back(t->grad());
  return grads;
}

TEST(AttentionTest, LayoutsAroundItAreReadAndWrittenInPlace) {
  for (int variant = 0; variant < 5; ++variant)
    for (bool grad : {false, true})
      for (loom::DType dt : {loom::DType::Float32, loom::DType::Float64}) {
        const LayoutCase c{variant, grad};
        std::vector<std::vector<double>> got[2];
        for (int backend = 0; backend < 2; ++backend) {
          loom::runtime::set_backend(backend ? "ref" : "cpu");
          for (const Tensor& t : layout_layer(c, dt)) got[backend].push_back(dv(t));
        }
        loom::runtime::set_backend("cpu");
        const double tol = dt == loom::DType::Float64 ? 1e-10 : 2e-4;
        ASSERT_EQ(got[0].size(), got[1].size());
        for (size_t r = 0; r < got[0].size(); ++r) {
          ASSERT_EQ(got[0][r].size(), got[1][r].size());
          double scale = 0;
          for (double x : got[1][r]) scale = std::max(scale, std::abs(x));
          for (size_t i = 0; i < got[0][r].size(); ++i)
            ASSERT_NEAR(got[0][r][i], got[1][r][i], tol * (1 + scale))
                << "variant " << variant << (grad ? " gradient " : " value ") << r << " " << dt
                << " at " << i;
        }
      }
}

// The GPT layer's plan copies no layout around attention, but the output's permute in the
// training step (delta reads the output too): kernels whose every stage is a layout op of the
// layer's activations.
TEST(AttentionTest, TheGptLayerPlanHasNoLayoutCopies) {
  loom::runtime::set_backend("cpu");
  for (bool grad : {false, true}) {
    std::vector<Tensor> outs = layout_layer({0, grad}, loom::DType::Float32);
    loom::ir::Graph g = loom::ir::parse(loom::pending_ir(outs));
    loom::passes::default_pipeline().run(g);
    std::vector<std::vector<loom::ir::NodeId>> results;
    loom::ir::Graph split = loom::cpu::split_results(g, &results);
    const loom::cpu::Plan plan = loom::cpu::make_plan(split, results, /*allow_views=*/true);
    int copies = 0, attention = 0;
    for (const loom::cpu::Step& st : plan.steps) {
      if (st.kind == loom::cpu::Step::Native) attention++;
      if (st.kind != loom::cpu::Step::Kernel) continue;
      bool layout = true;
      for (const loom::cpu::Stage& s : plan.kernels[st.kernel].stages) {
        const loom::ir::OpKind op = split.node(s.node).op;
        layout = layout && !s.reduce && s.shape.rank() >= 3 &&
                 (op == loom::ir::OpKind::Permute || op == loom::ir::OpKind::Slice ||
                  op == loom::ir::OpKind::Reshape);
      }
      copies += layout;
    }
    EXPECT_EQ(attention, grad ? 2 : 1);
    EXPECT_EQ(copies, grad ? 1 : 0) << (grad ? "training step" : "forward");
    loom::sync();
  }
}

TEST(AttentionTest, BadInputIsAClearError) {
  Tensor q = loom::randn({2, 4, 8}), k = loom::randn({2, 6, 8}), v = loom::randn({2, 6, 3});
  expect_error<loom::ShapeError>(
      [&] { loom::scaled_dot_product_attention(q, loom::randn({2, 6, 7}), v); },
      {"[scaled_dot_product_attention]", "f32[2,4,8]", "f32[2,6,7]"});
  expect_error<loom::DTypeError>(
      [&] { loom::scaled_dot_product_attention(q, loom::to(k, loom::DType::Float64), v); },
      {"[scaled_dot_product_attention]", "one floating dtype"});
  loom::SdpaOptions wrong;
  wrong.attn_mask = loom::ones({4, 5}, loom::DType::Bool);
  expect_error<loom::ShapeError>([&] { loom::scaled_dot_product_attention(q, k, v, wrong); },
                                 {"attn_mask", "bool[4,5]", "[..., 4, 6]"});
  loom::SdpaOptions gqa;
  gqa.enable_gqa = true;
  expect_error<loom::ShapeError>(
      [&] {
        loom::scaled_dot_product_attention(loom::randn({1, 3, 4, 8}), loom::randn({1, 2, 6, 8}),
                                           loom::randn({1, 2, 6, 8}), gqa);
      },
      {"multiple of k's"});
  expect_error<loom::ShapeError>([&] { loom::packed_qkv_attention(loom::randn({2, 3, 10}), 2); },
                                 {"[packed_qkv_attention]", "f32[2,3,10]"});
}

}  // namespace
