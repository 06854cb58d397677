// train_lm: a small causal transformer language model, trained character by character on the
// opening of A Tale of Two Cities (data/tale_of_two_cities.txt, public domain).
//
// Embedding + learned positions, N pre-norm blocks (causal self-attention and an MLP) run with
// scan_layers, a final LayerNorm and a linear head; AdamW; the whole training step compiled
// with compile({.trace_once = true}), so after the first step it is neither traced nor
// compiled again. Prints the loss as it falls and a sample from the trained model.
//
//   build/examples/loom-train-lm [steps] [path]
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <string>

#include "loom/loom.h"

namespace {

using loom::Tensor;
namespace nn = loom::nn;

constexpr int64_t kDim = 64, kHeads = 4, kLayers = 4, kContext = 32, kBatch = 16;

struct Block : nn::Module {
  std::shared_ptr<nn::LayerNorm> ln1, ln2;
  std::shared_ptr<nn::CausalSelfAttention> attn;
  std::shared_ptr<nn::Linear> up, down;
  Block() {
    ln1 = register_module("ln1", std::make_shared<nn::LayerNorm>(kDim));
    attn = register_module("attn", std::make_shared<nn::CausalSelfAttention>(kDim, kHeads));
    ln2 = register_module("ln2", std::make_shared<nn::LayerNorm>(kDim));
    up = register_module("up", std::make_shared<nn::Linear>(kDim, 4 * kDim));
    down = register_module("down", std::make_shared<nn::Linear>(4 * kDim, kDim));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = x + (*attn)((*ln1)(x));
    return h + (*down)(loom::gelu((*up)((*ln2)(h))));
  }
};

struct LanguageModel : nn::Module {
  std::shared_ptr<nn::Embedding> tok, pos;
  std::shared_ptr<nn::ModuleList> blocks;
  std::shared_ptr<nn::LayerNorm> norm;
  std::shared_ptr<nn::Linear> head;
  explicit LanguageModel(int64_t vocab) {
    tok = register_module("tok", std::make_shared<nn::Embedding>(vocab, kDim));
    pos = register_module("pos", std::make_shared<nn::Embedding>(kContext, kDim));
    blocks = register_module("blocks", std::make_shared<nn::ModuleList>());
    for (int i = 0; i < kLayers; ++i) blocks->push_back(std::make_shared<Block>());
    norm = register_module("norm", std::make_shared<nn::LayerNorm>(kDim));
    head = register_module("head", std::make_shared<nn::Linear>(kDim, vocab));
  }
  // tokens [batch, T] -> logits [batch, T, vocab]
  Tensor forward(const Tensor& tokens) override {
    const int64_t T = tokens.size(1);
    Tensor positions = loom::arange(0, static_cast<double>(T), loom::int64);
    Tensor x = (*tok)(tokens) + (*pos)(positions);
    x = loom::scan_layers(*blocks, x);
    return (*head)((*norm)(x));
  }
};

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 300;
  std::string path = argc > 2 ? argv[2] : "";
  if (path.empty()) {
    for (const char* p : {"data/tale_of_two_cities.txt", "../data/tale_of_two_cities.txt",
                          LOOM_SOURCE_DIR "/data/tale_of_two_cities.txt"}) {
      if (std::ifstream(p)) {
        path = p;
        break;
      }
    }
  }
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "train_lm: cannot read the text (pass its path)\n");
    return 1;
  }
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::map<char, int64_t> index;
  std::string chars;
  for (char c : text)
    if (!index.count(c)) index[c] = 0;
  for (auto& [c, i] : index) i = static_cast<int64_t>(chars.size()), chars.push_back(c);
  const int64_t vocab = static_cast<int64_t>(chars.size());
  std::printf("train_lm: %zu characters, vocabulary %lld, %lld blocks of dim %lld (scan_layers)\n",
              text.size(), static_cast<long long>(vocab), static_cast<long long>(kLayers),
              static_cast<long long>(kDim));

  loom::manual_seed(0);
  LanguageModel model(vocab);
  loom::optim::AdamW opt(model.parameters(), 3e-3, 0.9, 0.99, 1e-8, 0.01);
  auto train_step = loom::compile(
      [&](const Tensor& x, const Tensor& y) {
        Tensor logits = model(x);
        Tensor loss = loom::cross_entropy(loom::reshape(logits, {kBatch * kContext, vocab}),
                                          loom::reshape(y, {kBatch * kContext}));
        loss.backward();
        opt.step();
        opt.zero_grad();
        return loss;
      },
      {.name = "train_lm_step", .trace_once = true});

  std::mt19937 rng(1);
  std::uniform_int_distribution<size_t> start(0, text.size() - kContext - 2);
  loom::reset_metrics();
  auto now = [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  const double t0 = now();
  double t1 = t0;  // after the first step (traced and compiled)
  double executed1 = 0;
  for (int step = 1; step <= steps; ++step) {
    std::vector<int64_t> xs, ys;
    for (int64_t b = 0; b < kBatch; ++b) {
      size_t s = start(rng);
      for (int64_t t = 0; t < kContext; ++t) {
        xs.push_back(index[text[s + t]]);
        ys.push_back(index[text[s + t + 1]]);
      }
    }
    Tensor loss =
        train_step(loom::tensor(xs, {kBatch, kContext}), loom::tensor(ys, {kBatch, kContext}));
    if (step == 1 || step % 50 == 0 || step == steps)
      std::printf("  step %4d  loss %.4f\n", step, loss.item<float>());
    if (step == 1) {
      t1 = now();
      executed1 = loom::metrics().execute_seconds;
    }
  }
  const double dt = now() - t0;
  loom::Metrics m = loom::metrics();
  std::printf(
      "  %d steps in %.2f s (%.1f ms/step); compiles %lld, compile %.2f s, bodies traced %lld\n",
      steps, dt, dt / steps * 1e3, static_cast<long long>(m.compiles), m.compile_seconds,
      static_cast<long long>(m.bodies_traced));
  if (steps > 1) {
    const double outside = (t0 + dt - t1) - (m.execute_seconds - executed1);
    std::printf("  steady: %.2f ms/step (steps 2-%d); outside execute: %.0f us/step\n",
                (t0 + dt - t1) / (steps - 1) * 1e3, steps, outside / (steps - 1) * 1e6);
  }

  // Greedy sample from the trained model.
  std::string sample = text.substr(0, kContext);
  {
    loom::NoGradGuard no_grad;
    model.eval();
    for (int i = 0; i < 80; ++i) {
      std::vector<int64_t> ctx;
      for (size_t k = sample.size() - kContext; k < sample.size(); ++k)
        ctx.push_back(index[sample[k]]);
      Tensor logits = model(loom::tensor(ctx, {1, kContext}));
      int64_t next = loom::argmax(logits[0][kContext - 1]).item<int64_t>();
      sample.push_back(chars[static_cast<size_t>(next)]);
    }
  }
  std::printf("  sample: \"%s\"\n", sample.c_str());
  return 0;
}
