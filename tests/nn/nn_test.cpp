// nn, optim and scan_layers: modules against closed forms computed here in double, causal
// attention against a host reference, functional_call, scan_layers against the for loop
// (forward and every parameter's gradient), optimizers against their update rules written
// out, no recompiles when the learning rate changes, safetensors round trips and errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>

#include "expect_error.h"
#include "loom/loom.h"
#include "loom/runtime/engine.h"

namespace {

using loom::Tensor;
namespace nn = loom::nn;

class NnTest : public ::testing::Test {
 protected:
  void SetUp() override {
    loom::sync();
    loom::manual_seed(42);
    loom::reset_metrics();
  }
  void TearDown() override { loom::sync(); }
};

std::vector<double> dv(const Tensor& t) { return t.to_vector<double>(); }

void expect_close(const std::vector<double>& a, const std::vector<double>& b, double tol) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], tol * (1 + std::abs(b[i]))) << i;
}

using loom::testing::expect_error;

struct Block : nn::Module {
  std::shared_ptr<nn::Linear> fc;
  std::shared_ptr<nn::LayerNorm> norm;
  explicit Block(int64_t d) {
    fc = register_module("fc", std::make_shared<nn::Linear>(d, d));
    norm = register_module("norm", std::make_shared<nn::LayerNorm>(d));
  }
  Tensor forward(const Tensor& x) override { return loom::gelu((*fc)((*norm)(x))) + x; }
};

TEST_F(NnTest, ModulesNameTheirTensorsAndInitLikePyTorch) {
  nn::ModuleList layers;
  for (int i = 0; i < 2; ++i) layers.push_back(std::make_shared<Block>(8));
  std::vector<std::string> names;
  for (auto& [n, t] : layers.named_parameters()) {
    names.push_back(n);
    EXPECT_TRUE(t.requires_grad()) << n;
  }
  EXPECT_EQ(names,
            (std::vector<std::string>{"0.fc.weight", "0.fc.bias", "0.norm.weight", "0.norm.bias",
                                      "1.fc.weight", "1.fc.bias", "1.norm.weight", "1.norm.bias"}));
  auto fc = std::dynamic_pointer_cast<Block>(layers[1])->fc;
  EXPECT_EQ(fc->weight.shape(), (loom::Shape{8, 8}));
  for (double w : dv(fc->weight)) EXPECT_LE(std::abs(w), 1 / std::sqrt(8.0));
  for (double w : dv(std::dynamic_pointer_cast<Block>(layers[1])->norm->weight)) EXPECT_EQ(w, 1);
  layers.eval();
  EXPECT_FALSE(layers[0]->is_training());
  EXPECT_FALSE(std::dynamic_pointer_cast<Block>(layers[0])->fc->is_training());
  EXPECT_THROW(layers[5], loom::ShapeError);
}

TEST_F(NnTest, LayersAgainstClosedForms) {
  nn::Linear lin(3, 2);
  Tensor x = loom::randn({4, 3});
  std::vector<double> xv = dv(x), w = dv(lin.weight), b = dv(lin.bias), want;
  for (int r = 0; r < 4; ++r)
    for (int o = 0; o < 2; ++o) {
      double s = b[o];
      for (int i = 0; i < 3; ++i) s += xv[r * 3 + i] * w[o * 3 + i];
      want.push_back(s);
    }
  expect_close(dv(lin(x)), want, 1e-5);

  nn::RMSNorm rms(3);
  std::vector<double> rw;
  for (int r = 0; r < 4; ++r) {
    double ms = 0;
    for (int i = 0; i < 3; ++i) ms += xv[r * 3 + i] * xv[r * 3 + i] / 3;
    for (int i = 0; i < 3; ++i) rw.push_back(xv[r * 3 + i] / std::sqrt(ms + 1e-6));
  }
  expect_close(dv(rms(x)), rw, 1e-5);

  nn::LayerNorm ln(3);
  std::vector<double> lw;
  for (int r = 0; r < 4; ++r) {
    double m = 0, v = 0;
    for (int i = 0; i < 3; ++i) m += xv[r * 3 + i] / 3;
    for (int i = 0; i < 3; ++i) v += (xv[r * 3 + i] - m) * (xv[r * 3 + i] - m) / 3;
    for (int i = 0; i < 3; ++i) lw.push_back((xv[r * 3 + i] - m) / std::sqrt(v + 1e-5));
  }
  expect_close(dv(ln(x)), lw, 1e-4);

  nn::Embedding emb(5, 2);
  Tensor rows = emb(loom::tensor(std::vector<int64_t>{4, 0, 4}, {3}));
  std::vector<double> ew = dv(emb.weight);
  expect_close(dv(rows), {ew[8], ew[9], ew[0], ew[1], ew[8], ew[9]}, 0);

  nn::Dropout drop(0.5);
  drop.eval();
  expect_close(dv(drop(x)), xv, 0);
  nn::Sequential seq{std::make_shared<nn::Linear>(3, 4), std::make_shared<nn::ReLU>(),
                     std::make_shared<nn::Linear>(4, 2), std::make_shared<nn::GELU>()};
  for (double v : dv(seq(x))) EXPECT_GE(v, -0.2);  // gelu's minimum is about -0.17
}

TEST_F(NnTest, CausalSelfAttentionMatchesAHostReferenceAndIsCausal) {
  const int64_t B = 2, T = 4, D = 4, H = 2, hd = D / H;
  nn::CausalSelfAttention att(D, H);
  Tensor x = loom::randn({B, T, D});
  std::vector<double> xv = dv(x), wq = dv(att.qkv->weight), bq = dv(att.qkv->bias),
                      wp = dv(att.proj->weight), bp = dv(att.proj->bias);
  std::vector<double> want;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<double> qkv(T * 3 * D);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t o = 0; o < 3 * D; ++o) {
        double s = bq[o];
        for (int64_t i = 0; i < D; ++i) s += xv[(b * T + t) * D + i] * wq[o * D + i];
        qkv[t * 3 * D + o] = s;
      }
    std::vector<double> y(T * D, 0);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> sc(t + 1);
        double mx = -1e300;
        for (int64_t u = 0; u <= t; ++u) {
          double s = 0;
          for (int64_t e = 0; e < hd; ++e)
            s += qkv[t * 3 * D + h * hd + e] * qkv[u * 3 * D + D + h * hd + e];
          sc[u] = s / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, sc[u]);
        }
        double z = 0;
        for (double& s : sc) z += (s = std::exp(s - mx));
        for (int64_t e = 0; e < hd; ++e) {
          double acc = 0;
          for (int64_t u = 0; u <= t; ++u) acc += sc[u] / z * qkv[u * 3 * D + 2 * D + h * hd + e];
          y[t * D + h * hd + e] = acc;
        }
      }
    for (int64_t t = 0; t < T; ++t)
      for (int64_t o = 0; o < D; ++o) {
        double s = bp[o];
        for (int64_t i = 0; i < D; ++i) s += y[t * D + i] * wp[o * D + i];
        want.push_back(s);
      }
  }
  std::vector<double> got = dv(att(x));
  expect_close(got, want, 1e-4);
  // Changing the last position changes no earlier output.
  std::vector<float> xf = x.to_vector<float>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < D; ++i) xf[(b * T + T - 1) * D + i] += 3.0f;
  std::vector<double> moved = dv(att(loom::tensor(xf, {B, T, D})));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t + 1 < T; ++t)
      for (int64_t i = 0; i < D; ++i)
        EXPECT_NEAR(moved[(b * T + t) * D + i], got[(b * T + t) * D + i], 1e-6);
}

TEST_F(NnTest, FunctionalCallUsesTheGivenTensorsAndRestoresTheModule) {
  Block block(4);
  Tensor x = loom::randn({3, 4});
  nn::ParamMap p = block.parameters_map();
  Tensor before = block(x);
  nn::ParamMap other;
  for (auto& [n, t] : p) other[n] = t * 2.0;
  Tensor y = nn::functional_call(block, other, {}, x);
  // The same module with its tensors doubled, by hand.
  Block copy(4);
  {
    loom::NoGradGuard g;
    auto mine = copy.parameters_map();
    for (auto& [n, t] : other) mine.at(n).copy_(t);
  }
  expect_close(dv(y), dv(copy(x)), 1e-6);
  expect_close(dv(block(x)), dv(before), 0);  // restored
  expect_error<loom::Error>([&] { nn::functional_call(block, {{"fc.nope", x}}, {}, x); },
                            {"[functional_call]", "fc.nope"});
  expect_error<loom::ShapeError>([&] { nn::functional_call(block, {{"fc.bias", x}}, {}, x); },
                                 {"[functional_call]", "fc.bias", "f32[4]", "f32[3,4]"});
  // Gradients reach the given tensors.
  Tensor w = other.at("fc.weight").detach().requires_grad_();
  loom::sum(nn::functional_call(block, {{"fc.weight", w}}, {}, x)).backward();
  EXPECT_TRUE(w.grad().defined());
  EXPECT_FALSE(block.fc->weight.grad().defined());
}

// scan_layers against the for loop: outputs and every parameter's gradient.
void compare_scan_layers(int n, bool remat) {
  SCOPED_TRACE(std::to_string(n) + (remat ? " remat" : ""));
  loom::manual_seed(7);
  nn::ModuleList a, b;
  for (int i = 0; i < n; ++i) a.push_back(std::make_shared<Block>(8));
  {
    loom::NoGradGuard g;
    for (int i = 0; i < n; ++i) {
      auto blk = std::make_shared<Block>(8);
      auto src = a[i]->parameters_map();
      for (auto& [name, t] : blk->parameters_map()) t.copy_(src.at(name));
      b.push_back(blk);
    }
  }
  Tensor x = loom::randn({2, 3, 8});
  Tensor ya = loom::scan_layers(a, x, {.remat = remat});
  Tensor yb = x;
  for (size_t i = 0; i < b.size(); ++i) yb = (*b[i])(yb);
  expect_close(dv(ya), dv(yb), 1e-5);
  loom::sum(ya * ya).backward();
  loom::sum(yb * yb).backward();
  auto pa = a.named_parameters(), pb = b.named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t k = 0; k < pa.size(); ++k) {
    SCOPED_TRACE(pa[k].first);
    ASSERT_TRUE(pa[k].second.grad().defined());
    expect_close(dv(pa[k].second.grad()), dv(pb[k].second.grad()), 1e-4);
  }
}

TEST_F(NnTest, ScanLayersEqualsTheForLoop) {
  compare_scan_layers(6, false);
  compare_scan_layers(24, false);
  compare_scan_layers(6, true);
}

TEST_F(NnTest, ScanLayersTreeCarryExtraInputsAndErrors) {
  nn::ModuleList layers;
  for (int i = 0; i < 3; ++i) layers.push_back(std::make_shared<nn::Linear>(4, 4));
  Tensor mask = loom::tensor(std::vector<float>{1, 0, 1, 1}, {4});
  using C = std::pair<Tensor, Tensor>;
  C init{loom::randn({2, 4}), loom::zeros({})};
  C out = loom::scan_layers(layers, init, [&](nn::Module& l, const C& c) {
    Tensor h = l(c.first) * mask;
    return C{h, c.second + loom::sum(h)};
  });
  C ref = init;
  for (size_t i = 0; i < layers.size(); ++i) {
    Tensor h = (*layers[i])(ref.first) * mask;
    ref = C{h, ref.second + loom::sum(h)};
  }
  expect_close(dv(out.first), dv(ref.first), 1e-5);
  expect_close(dv(out.second), dv(ref.second), 1e-5);
  nn::ModuleList empty;
  Tensor x = loom::randn({2, 4});
  EXPECT_EQ(loom::scan_layers(empty, x).impl(), x.impl());
  nn::ModuleList mixed;
  mixed.push_back(std::make_shared<nn::Linear>(4, 4));
  mixed.push_back(std::make_shared<nn::Linear>(4, 4, false));
  expect_error<loom::ShapeError>([&] { loom::scan_layers(mixed, x); },
                                 {"[scan_layers]", "layer 1", "'bias'"});
  nn::ModuleList extra;
  extra.push_back(std::make_shared<nn::Linear>(4, 4, false));
  extra.push_back(std::make_shared<nn::Linear>(4, 4));
  expect_error<loom::ShapeError>([&] { loom::scan_layers(extra, x); },
                                 {"layer 1", "extra", "'bias'"});
  nn::ModuleList shaped;
  shaped.push_back(std::make_shared<nn::Linear>(4, 4));
  shaped.push_back(std::make_shared<nn::Linear>(4, 4));
  shaped.push_back(std::make_shared<nn::Linear>(4, 5));
  expect_error<loom::ShapeError>([&] { loom::scan_layers(shaped, x); },
                                 {"layer 2", "'weight'", "f32[5,4]", "f32[4,4]"});
}

TEST_F(NnTest, SgdAndAdamWFollowTheirUpdateRules) {
  // One parameter, loss = sum(w * c): the gradient is c every step.
  std::vector<double> c = {0.5, -2, 1};
  for (int which = 0; which < 2; ++which) {
    Tensor w = loom::tensor(std::vector<double>{1, 2, 3}, {3}).requires_grad_();
    std::unique_ptr<loom::optim::Optimizer> opt;
    if (which == 0)
      opt = std::make_unique<loom::optim::SGD>(std::vector<Tensor>{w}, 0.1, 0.9, 0.01);
    else
      opt =
          std::make_unique<loom::optim::AdamW>(std::vector<Tensor>{w}, 0.1, 0.9, 0.999, 1e-8, 0.01);
    std::vector<double> h = {1, 2, 3}, buf(3, 0), m(3, 0), v(3, 0);
    for (int step = 1; step <= 3; ++step) {
      loom::sum(w * loom::tensor(c, {3})).backward();
      opt->step();
      opt->zero_grad();
      loom::sync();
      for (int i = 0; i < 3; ++i) {
        if (which == 0) {
          double g = c[i] + 0.01 * h[i];
          buf[i] = step == 1 ? g : 0.9 * buf[i] + g;
          h[i] -= 0.1 * buf[i];
        } else {
          m[i] = 0.9 * m[i] + 0.1 * c[i];
          v[i] = 0.999 * v[i] + 0.001 * c[i] * c[i];
          double mh = m[i] / (1 - std::pow(0.9, step)), vh = v[i] / (1 - std::pow(0.999, step));
          h[i] = h[i] * (1 - 0.1 * 0.01) - 0.1 * mh / (std::sqrt(vh) + 1e-8);
        }
      }
      expect_close(dv(w), h, 1e-12);
      EXPECT_FALSE(w.grad().defined());
    }
  }
}

TEST_F(NnTest, ChangingTheLearningRateDoesNotRecompile) {
  nn::Linear lin(4, 2);
  loom::optim::SGD opt(lin.parameters(), 0.1, 0.9);
  Tensor x = loom::randn({8, 4}), y = loom::randn({8, 2});
  loom::sync();
  for (int step = 0; step < 6; ++step) {
    opt.set_lr(0.1 / (1 + step));
    loom::mse_loss(lin(x), y).backward();
    opt.step();
    opt.zero_grad();
    loom::sync();
    if (step == 1) loom::reset_metrics();  // step 0 has no momentum buffer yet
  }
  EXPECT_EQ(loom::metrics().compiles, 0);
}

TEST_F(NnTest, SafetensorsRoundTripAndErrors) {
  const std::string path = ::testing::TempDir() + "/loom_nn_test.safetensors";
  std::map<std::string, Tensor> all{
      {"f32", loom::randn({2, 3})},
      {"f64", loom::tensor(std::vector<double>{1.5, -2}, {2})},
      {"i64", loom::tensor(std::vector<int64_t>{7, -8, 9}, {3})},
      {"i32", loom::tensor(std::vector<int32_t>{1}, {1, 1})},
      {"bool", loom::tensor(std::vector<bool>{true, false}, {2})},
      {"bf16", loom::to(loom::tensor(std::vector<float>{0.5, 3}, {2}), loom::bfloat16)},
      {"f16", loom::to(loom::tensor(std::vector<float>{-1.25f}, {}), loom::float16)}};
  nn::save_safetensors(all, path);
  auto back = nn::load_safetensors(path);
  ASSERT_EQ(back.size(), all.size());
  for (auto& [n, t] : all) {
    SCOPED_TRACE(n);
    EXPECT_EQ(back.at(n).dtype(), t.dtype());
    EXPECT_EQ(back.at(n).shape(), t.shape());
    expect_close(dv(back.at(n)), dv(t), 0);
  }
  // The header is the format's JSON, readable by other tools.
  std::ifstream f(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_NE(bytes.find("\"f32\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":["),
            std::string::npos);
  // Module save and load.
  Block a(4), b(4);
  nn::save(a, path);
  nn::load(b, path);
  for (auto& [n, t] : a.parameters_map()) expect_close(dv(b.parameters_map().at(n)), dv(t), 0);
  nn::Linear other(4, 3);
  expect_error<loom::ShapeError>(
      [&] {
        nn::save(other, path);
        nn::load(*b.fc, path);
      },
      {"[nn::load]", "weight", "f32[3,4]", "f32[4,4]"});
  std::ofstream(path, std::ios::binary) << std::string("\x10\0\0\0\0\0\0\0{\"a\":", 13);
  expect_error<loom::Error>([&] { nn::load_safetensors(path); }, {"[load_safetensors]", "header"});
  std::remove(path.c_str());
}

}  // namespace
