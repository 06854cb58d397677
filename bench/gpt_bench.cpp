// `loom-bench gpt`: nanoGPT's character-level training configuration (shakespeare_char without
// dropout: 6 layers, 6 heads, dim 384, block 256, batch 8, AdamW lr 1e-3, betas (0.9, 0.99),
// weight decay 0.1 on the matrices) on data/tale_of_two_cities.txt, the whole step compiled
// with trace_once. Weights and batches come from splitmix64 (HostRng) exactly as
// bench/peers/common.py draws them, so that with --peers loom's Python program, torch eager,
// torch.compile and JAX train from the same weights on the same batches and their loss curves
// can be compared. Runs in a fresh process (peak RSS, a cold first step).
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "bench.h"
#include "loom/loom.h"

namespace loom::bench {
namespace {

namespace nn = loom::nn;

// As bench/peers/common.py's GPT_* (keep them equal).
constexpr int64_t kLayers = 6, kHeads = 6, kDim = 384, kT = 256, kBatch = 8;
constexpr double kLr = 1e-3, kBeta1 = 0.9, kBeta2 = 0.99, kEps = 1e-8, kWeightDecay = 0.1;
constexpr int kSteps = 31, kLossEvery = 10;
constexpr uint64_t kInitSeed = 1, kBatchSeed = 2;

// nanoGPT's Block: pre-norm causal self-attention (the fused attention) and a GELU MLP.
struct Block : nn::Module {
  std::shared_ptr<nn::LayerNorm> ln_1, ln_2;
  std::shared_ptr<nn::CausalSelfAttention> attn;
  std::shared_ptr<nn::Linear> c_fc, c_proj;
  Block() {
    ln_1 = register_module("ln_1", std::make_shared<nn::LayerNorm>(kDim));
    attn = register_module("attn", std::make_shared<nn::CausalSelfAttention>(kDim, kHeads));
    ln_2 = register_module("ln_2", std::make_shared<nn::LayerNorm>(kDim));
    c_fc = register_module("c_fc", std::make_shared<nn::Linear>(kDim, 4 * kDim));
    c_proj = register_module("c_proj", std::make_shared<nn::Linear>(4 * kDim, kDim));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = x + (*attn)((*ln_1)(x));
    return h + (*c_proj)(gelu((*c_fc)((*ln_2)(h))));
  }
};

// Embeddings, blocks, a final LayerNorm and the LM head tied to the token embedding.
struct Gpt : nn::Module {
  std::shared_ptr<nn::Embedding> wte, wpe;
  std::shared_ptr<nn::ModuleList> h;
  std::vector<std::shared_ptr<Block>> blocks;  // h's children
  std::shared_ptr<nn::LayerNorm> ln_f;
  explicit Gpt(int64_t vocab) {
    wte = register_module("wte", std::make_shared<nn::Embedding>(vocab, kDim));
    wpe = register_module("wpe", std::make_shared<nn::Embedding>(kT, kDim));
    h = register_module("h", std::make_shared<nn::ModuleList>());
    for (int64_t i = 0; i < kLayers; ++i) {
      blocks.push_back(std::make_shared<Block>());
      h->push_back(blocks.back());
    }
    ln_f = register_module("ln_f", std::make_shared<nn::LayerNorm>(kDim));
  }
  Tensor forward(const Tensor& tokens) override {  // [B, T] -> logits [B, T, vocab]
    Tensor x = (*wte)(tokens) + (*wpe)(arange(0, static_cast<double>(kT), int64));
    for (auto& block : blocks) x = (*block)(x);
    return matmul((*ln_f)(x), transpose(wte->weight, 0, 1));
  }
};

// common.gpt_params: every matrix 0.02 sqrt(3) (2u - 1) from one stream, in the order wte, wpe,
// then per block c_attn, attn c_proj, c_fc, mlp c_proj; norms and biases keep loom's ones and
// zeros (biases are zeroed here).
void init_weights(Gpt& m) {
  HostRng rng(kInitSeed);
  NoGradGuard no_grad;
  auto matrix = [&](Tensor& w) {
    std::vector<float> v(static_cast<size_t>(w.numel()));
    for (float& x : v) x = static_cast<float>(0.02 * std::sqrt(3.0) * (2 * rng.uniform() - 1));
    w.copy_(tensor(std::move(v), w.shape()));
  };
  matrix(m.wte->weight);
  matrix(m.wpe->weight);
  for (auto& b : m.blocks) {
    for (nn::Linear* l :
         {b->attn->qkv.get(), b->attn->proj.get(), b->c_fc.get(), b->c_proj.get()}) {
      matrix(l->weight);
      l->bias.zero_();
    }
  }
  sync();
}

std::string read_text() {
  for (const char* p : {"data/tale_of_two_cities.txt", "../data/tale_of_two_cities.txt",
                        LOOM_SOURCE_DIR "/data/tale_of_two_cities.txt"}) {
    std::ifstream in(p, std::ios::binary);
    if (in) return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  return "";
}

// `loom-bench --child gpt_train`: the training run, its figures as "key value" lines.
int train(int, char**) {
  const std::string text = read_text();
  if (text.size() < kT + 2) {
    std::fprintf(stderr, "gpt: data/tale_of_two_cities.txt not found\n");
    return 1;
  }
  std::vector<unsigned char> chars(text.begin(), text.end());
  std::sort(chars.begin(), chars.end());
  chars.erase(std::unique(chars.begin(), chars.end()), chars.end());
  std::vector<int64_t> ids;
  for (unsigned char c : text)
    ids.push_back(std::lower_bound(chars.begin(), chars.end(), c) - chars.begin());
  const int64_t vocab = static_cast<int64_t>(chars.size()), n = static_cast<int64_t>(ids.size());

  Gpt model(vocab);
  init_weights(model);
  std::vector<Tensor> decay, no_decay;  // nanoGPT's configure_optimizers: decay the matrices
  for (const Tensor& p : model.parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  optim::AdamW opt_decay(decay, kLr, kBeta1, kBeta2, kEps, kWeightDecay);
  optim::AdamW opt_rest(no_decay, kLr, kBeta1, kBeta2, kEps, 0.0);
  auto step = compile(
      [&](const Tensor& x, const Tensor& y) {
        Tensor loss =
            cross_entropy(reshape(model(x), {kBatch * kT, vocab}), reshape(y, {kBatch * kT}));
        loss.backward();
        opt_decay.step();
        opt_rest.step();
        opt_decay.zero_grad();
        opt_rest.zero_grad();
        return loss;
      },
      {.name = "gpt_step", .trace_once = true});

  HostRng batch_rng(kBatchSeed);  // common.gpt_starts
  std::vector<double> times;
  std::vector<float> losses;
  for (int s = 0; s < kSteps; ++s) {
    std::vector<int64_t> xs, ys;
    for (int64_t b = 0; b < kBatch; ++b) {
      const auto at = static_cast<int64_t>(batch_rng.uniform() * static_cast<double>(n - kT - 1));
      xs.insert(xs.end(), ids.begin() + at, ids.begin() + at + kT);
      ys.insert(ys.end(), ids.begin() + at + 1, ids.begin() + at + kT + 1);
    }
    const double t0 = seconds();
    Tensor loss = step(tensor(std::move(xs), {kBatch, kT}), tensor(std::move(ys), {kBatch, kT}));
    losses.push_back(loss.item<float>());
    times.push_back(seconds() - t0);
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const double steady = median(std::vector<double>(times.begin() + 1, times.end()));
  std::printf("step_ms %.9g\n", steady * 1e3);
  std::printf("first_step_ms %.9g\n", times[0] * 1e3);
  std::printf("compile_ms %.9g\n", (times[0] - steady) * 1e3);
  std::printf("peak_rss_mb %.9g\n", static_cast<double>(ru.ru_maxrss) / 1024);
  for (int s = 0; s < kSteps; s += kLossEvery) std::printf("loss_%d %.9g\n", s, losses[s]);
  return 0;
}

RegisterChild train_child("gpt_train", train);

std::vector<Figure> gpt() {
  int rc = 0;
  // A fresh process without the persistent compile cache: a cold first step, its own peak RSS.
  const std::string out =
      command_output("env -u LOOM_CACHE_DIR '" + self_path() + "' --child gpt_train", &rc);
  if (rc != 0) return {{"failed", 1, "", "loom-bench --child gpt_train failed"}};
  std::vector<Figure> figs = {
      {"step_ms", figure_in(out, "step_ms"), "ms",
       "median of the steady steps (1-" + std::to_string(kSteps - 1) + "), trace_once"},
      {"first_step_ms", figure_in(out, "first_step_ms"), "ms", "step 0: trace, compile, run"},
      {"compile_ms", figure_in(out, "compile_ms"), "ms",
       "the first step less a steady one: trace and compile, as the peers' figure"},
      {"peak_rss_mb", figure_in(out, "peak_rss_mb"), "MB", "getrusage ru_maxrss, fresh process"},
  };
  for (int s = 0; s < kSteps; s += kLossEvery) {
    const std::string key = "loss_" + std::to_string(s);
    figs.push_back({key, figure_in(out, key), "", "the step's loss (before its update)"});
  }
  return figs;
}

Register r1("gpt",
            "nanoGPT char config (6 x 384, T 256, B 8, AdamW) training step, trace_once; "
            "--peers: loom Python, torch, torch.compile, JAX on the same weights and batches",
            gpt);

}  // namespace
}  // namespace loom::bench
