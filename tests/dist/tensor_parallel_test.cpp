// Tensor parallel layers against the unsharded model: forward values and gradients (of the
// input and of every parameter, the shard's gradient against the same slice of the full
// one), for Column/RowParallelLinear, the head-sharded attention and a decoder block stack
// through scan_layers. Ranks as threads, 2 and 4; the loss is the same on every rank.
#include <gtest/gtest.h>

#include <cmath>

#include "dist/dist_util.h"
#include "loom/loom.h"

namespace loom {
namespace {

using testing::expect_close;
using testing::host;

void set_params(nn::Module& m, double seed) {
  NoGradGuard g;
  int k = 0;
  for (auto& [name, p] : m.named_parameters()) p.copy_(host(p.shape(), seed + 11 * k++));
  loom::sync();
}

struct FullMlp : nn::Module {
  std::shared_ptr<nn::Linear> up, down;
  FullMlp(int64_t d) {
    up = register_module("up", std::make_shared<nn::Linear>(d, 4 * d));
    down = register_module("down", std::make_shared<nn::Linear>(4 * d, d));
  }
  Tensor forward(const Tensor& x) override { return (*down)(gelu((*up)(x))); }
};

struct ShardedMlp : nn::Module {
  std::shared_ptr<dist::ColumnParallelLinear> up;
  std::shared_ptr<dist::RowParallelLinear> down;
  ShardedMlp(int64_t d) {
    up = register_module("up", std::make_shared<dist::ColumnParallelLinear>(d, 4 * d, true, false));
    down = register_module("down", std::make_shared<dist::RowParallelLinear>(4 * d, d));
  }
  Tensor forward(const Tensor& x) override { return (*down)(gelu((*up)(x))); }
  void load(const FullMlp& f) { up->load(*f.up), down->load(*f.down); }
};

// A decoder block: x + attn(ln(x)), then + mlp(ln(x)).
template <class Attn, class Mlp>
struct Block : nn::Module {
  std::shared_ptr<nn::LayerNorm> ln1, ln2;
  std::shared_ptr<Attn> attn;
  std::shared_ptr<Mlp> mlp;
  Block(int64_t d, int64_t h) {
    ln1 = register_module("ln1", std::make_shared<nn::LayerNorm>(d));
    attn = register_module("attn", std::make_shared<Attn>(d, h));
    ln2 = register_module("ln2", std::make_shared<nn::LayerNorm>(d));
    mlp = register_module("mlp", std::make_shared<Mlp>(d));
  }
  Tensor forward(const Tensor& x) override {
    Tensor y = x + (*attn)((*ln1)(x));
    return y + (*mlp)((*ln2)(y));
  }
};
using FullBlock = Block<nn::CausalSelfAttention, FullMlp>;
using ShardedBlock = Block<dist::ShardedCausalSelfAttention, ShardedMlp>;

// Runs the full and the sharded model on the same input and loss and compares.
template <class Full, class Sharded, class Slice>
void compare(Full& full, Sharded& sharded, const Tensor& x0, Slice&& shard_of) {
  Tensor xf = x0.detach().requires_grad_(), xs = x0.detach().requires_grad_();
  Tensor yf = full(xf), ys = sharded(xs);
  Tensor wt = host(yf.shape(), 5.0);
  sum(wt * yf * yf).backward();
  sum(wt * ys * ys).backward();
  expect_close(ys, yf, "forward");
  expect_close(xs.grad(), xf.grad(), "input gradient");
  auto fp = full.named_parameters();
  auto sp = sharded.named_parameters();
  ASSERT_EQ(fp.size(), sp.size());
  for (size_t k = 0; k < fp.size(); ++k)
    expect_close(sp[k].second.grad(), shard_of(fp[k].first, fp[k].second.grad()),
                 "gradient of " + sp[k].first);
}

// The rank's shard of a full parameter (or its gradient), by parameter name.
Tensor shard_of(const std::string& name, const Tensor& g, int64_t dim) {
  const int r = dist::rank(), w = dist::world_size();
  auto ends = [&](const std::string& s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  if (ends("qkv.weight") || ends("qkv.bias")) {
    std::vector<Tensor> parts;
    const int64_t ld = dim / w;
    for (int64_t k = 0; k < 3; ++k)
      parts.push_back(slice(g, 0, k * dim + r * ld, k * dim + (r + 1) * ld));
    return cat(parts, 0);
  }
  const bool column = ends("up.weight") || ends("up.bias");
  const bool row = ends("proj.weight") || ends("down.weight");
  if (column) {
    const int64_t n = g.size(0) / w;
    return slice(g, 0, r * n, (r + 1) * n);
  }
  if (row) {
    const int64_t n = g.size(1) / w;
    return slice(g, 1, r * n, (r + 1) * n);
  }
  return g;  // replicated: layer norms, row-parallel biases
}

void linear_case(int) {
  const int64_t d = 8;
  FullMlp full(d);
  set_params(full, 1.0);
  ShardedMlp sharded(d);
  sharded.load(full);
  compare(full, sharded, host({3, d}, 2.0, 1.0),
          [&](const std::string& n, const Tensor& g) { return shard_of(n, g, d); });
  // A column-parallel layer with its output gathered equals the full layer.
  nn::Linear fl(d, 12);
  set_params(fl, 3.0);
  dist::ColumnParallelLinear cl(d, 12);
  cl.load(fl);
  expect_close(cl(host({2, d}, 4.0)), fl(host({2, d}, 4.0)), "gathered column-parallel output");
}

void attention_case(int) {
  const int64_t d = 16, h = 4;
  nn::CausalSelfAttention full(d, h);
  set_params(full, 1.5);
  dist::ShardedCausalSelfAttention sharded(d, h);
  sharded.load(full);
  compare(full, sharded, host({2, 5, d}, 2.5, 1.0),
          [&](const std::string& n, const Tensor& g) { return shard_of(n, g, d); });
}

// Two blocks through scan_layers, sharded against full.
void scan_layers_case(int) {
  const int64_t d = 16, h = 4;
  nn::ModuleList full, sharded;
  for (int l = 0; l < 2; ++l) {
    auto f = std::make_shared<FullBlock>(d, h);
    set_params(*f, 7.0 + l);
    auto s = std::make_shared<ShardedBlock>(d, h);
    s->attn->load(*f->attn);
    s->mlp->load(*f->mlp);
    {
      NoGradGuard g;
      s->ln1->weight.copy_(f->ln1->weight), s->ln1->bias.copy_(f->ln1->bias);
      s->ln2->weight.copy_(f->ln2->weight), s->ln2->bias.copy_(f->ln2->bias);
    }
    full.push_back(f);
    sharded.push_back(s);
  }
  struct Stack : nn::Module {
    nn::ModuleList* layers;
    explicit Stack(nn::ModuleList* l) : layers(l) {}
    Tensor forward(const Tensor& x) override { return scan_layers(*layers, x); }
  };
  Stack fs(&full), ss(&sharded);
  Tensor x0 = host({2, 4, d}, 9.0, 1.0);
  Tensor xf = x0.detach().requires_grad_(), xs = x0.detach().requires_grad_();
  Tensor yf = fs(xf), ys = ss(xs);
  Tensor wt = host(yf.shape(), 5.0);
  sum(wt * yf * yf).backward();
  sum(wt * ys * ys).backward();
  expect_close(ys, yf, "scan_layers forward");
  expect_close(xs.grad(), xf.grad(), "scan_layers input gradient");
  auto fp = full.named_parameters();
  auto sp = sharded.named_parameters();
  ASSERT_EQ(fp.size(), sp.size());
  for (size_t k = 0; k < fp.size(); ++k)
    expect_close(sp[k].second.grad(), shard_of(fp[k].first, fp[k].second.grad(), d),
                 "scan_layers gradient of " + sp[k].first);
}

TEST(TensorParallel, LinearPairMatchesTheUnshardedModel) {
  testing::thread_ranks(2, linear_case);
  testing::thread_ranks(4, linear_case);
}
TEST(TensorParallel, ShardedAttentionMatchesTheUnshardedModel) {
  testing::thread_ranks(2, attention_case);
  testing::thread_ranks(4, attention_case);
}
TEST(TensorParallel, DecoderBlocksThroughScanLayers) { testing::thread_ranks(2, scan_layers_case); }

}  // namespace
}  // namespace loom
