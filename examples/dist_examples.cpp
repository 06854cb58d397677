// The distributed examples, run on 2 ranks by the main job:
//
//   loom-launch -n 2 build/examples/loom-dist-examples decoder-dp [steps]
//   loom-launch -n 2 build/examples/loom-dist-examples train-lm-tp [steps] [text]
//   loom-launch -n 2 build/examples/loom-dist-examples decoder-sharded [steps]
//
// decoder-dp: the seed's decoder (Example 3: residual gelu(Linear) layers through
//   scan_layers; 4 layers of 128 here) trained data-parallel: each rank takes its shard of
//   every batch, DataParallel averages the gradients inside the compiled step.
// train-lm-tp: train_lm's model with its blocks tensor-parallel (attention heads and the
//   MLP split across ranks: ShardedCausalSelfAttention, Column/RowParallelLinear), every
//   rank on the same batch; embeddings, norms and head replicated.
// decoder-sharded: the seed's decoder written once at global shapes, laid out by annotations
//   (mark_sharding) instead of rewritten: its layers in pairs, the first's weight split by rows
//   and the second's by columns (Megatron's column then row: one all_reduce per pair), then
//   the same program with the batch dim split instead (data parallel as one annotation);
//   both beside the unannotated program on the same weights and batches.
// Every rank reads the loss (a graph with collectives must run on every rank).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <random>
#include <string>

#include "loom/loom.h"

namespace {

using loom::Tensor;
namespace nn = loom::nn;
namespace dist = loom::dist;

struct DecoderLayer : nn::Module {
  std::shared_ptr<nn::Linear> linear;
  explicit DecoderLayer(int64_t dim) {
    linear = register_module("linear", std::make_shared<nn::Linear>(dim, dim));
  }
  Tensor forward(const Tensor& x) override { return loom::gelu((*linear)(x)) + x; }
};

int decoder_dp(int steps) {
  const int64_t dim = 128, batch = 32, seq = 16;
  loom::manual_seed(0);  // the same on every rank; DataParallel broadcasts rank 0's anyway
  nn::ModuleList layers;
  for (int i = 0; i < 4; ++i) layers.push_back(std::make_shared<DecoderLayer>(dim));
  dist::DataParallel dp(layers);
  loom::optim::SGD opt(layers.parameters(), 0.02, 0.9);
  auto step = loom::compile(
      [&](const Tensor& x, const Tensor& y) {
        opt.zero_grad();
        Tensor loss = loom::mse_loss(loom::scan_layers(layers, x), y);
        loss.backward();
        dp.average_gradients();
        opt.step();
        return dist::all_reduce(loss.detach(), dist::ReduceOp::Mean);
      },
      {.name = "decoder_dp_step", .trace_once = true});
  auto [begin, end] = dist::shard(batch);
  loom::manual_seed(1);
  Tensor target_w = loom::randn({dim, dim}) * (0.5 / std::sqrt(static_cast<double>(dim)));
  for (int s = 1; s <= steps; ++s) {
    Tensor x = loom::randn({batch, seq, dim});  // the same stream on every rank
    Tensor y = loom::tanh(loom::matmul(x, target_w));
    Tensor loss = step(loom::slice(x, 0, begin, end), loom::slice(y, 0, begin, end));
    const float l = loss.item<float>();
    if (s == 1 || s % 10 == 0 || s == steps)
      std::printf("decoder-dp: step %3d  mean loss over %d ranks %.5f\n", s, dist::world_size(), l);
  }
  return 0;
}

// Two of the seed's decoder layers: the unit scan_layers repeats when the pair is laid out
// column then row.
struct DecoderPair : nn::Module {
  std::shared_ptr<DecoderLayer> first, second;
  explicit DecoderPair(int64_t dim) {
    first = register_module("first", std::make_shared<DecoderLayer>(dim));
    second = register_module("second", std::make_shared<DecoderLayer>(dim));
  }
  Tensor forward(const Tensor& x) override { return (*second)((*first)(x)); }
};

// Trains the decoder (4 pairs of 128) for `steps` SGD steps; `layout` annotates the model
// (and, through `batch_spec`, each batch) first. Returns the losses.
std::vector<float> train_decoder(int steps, const std::function<void(nn::ModuleList&)>& layout,
                                 const dist::ShardSpec* batch_spec, const dist::Mesh* mesh) {
  const int64_t dim = 128, batch = 32, seq = 16;
  loom::manual_seed(0);
  nn::ModuleList pairs;
  for (int i = 0; i < 4; ++i) pairs.push_back(std::make_shared<DecoderPair>(dim));
  layout(pairs);
  loom::optim::SGD opt(pairs.parameters(), 0.02, 0.9);
  auto step = loom::compile(
      [&](const Tensor& x, const Tensor& y) {
        opt.zero_grad();
        Tensor loss = loom::mse_loss(loom::scan_layers(pairs, x), y);
        loss.backward();
        opt.step();
        return loss.detach();
      },
      {.name = "decoder_sharded_step", .trace_once = true});
  loom::manual_seed(1);
  Tensor target_w = loom::randn({dim, dim}) * (0.5 / std::sqrt(static_cast<double>(dim)));
  std::vector<float> losses;
  for (int s = 1; s <= steps; ++s) {
    Tensor x = loom::randn({batch, seq, dim});
    Tensor y = loom::tanh(loom::matmul(x, target_w));
    if (batch_spec) {
      dist::mark_sharding(x, *mesh, *batch_spec);
      dist::mark_sharding(y, *mesh, *batch_spec);
    }
    losses.push_back(step(x, y).item<float>());
  }
  return losses;
}

int decoder_sharded(int steps) {
  const dist::Mesh mesh({dist::world_size()}, {"model"});
  const std::vector<float> plain = train_decoder(steps, [](nn::ModuleList&) {}, nullptr, nullptr);
  const std::vector<float> megatron = train_decoder(
      steps,
      [&](nn::ModuleList& pairs) {
        for (size_t i = 0; i < pairs.size(); ++i) {
          auto& p = dynamic_cast<DecoderPair&>(*pairs[i]);
          dist::mark_sharding(p.first->linear->weight, mesh, {{"model"}, {}});  // column
          dist::mark_sharding(p.first->linear->bias, mesh, {{"model"}});
          dist::mark_sharding(p.second->linear->weight, mesh, {{}, {"model"}});  // row
        }
      },
      nullptr, nullptr);
  const std::string megatron_report = dist::sharding_report();
  const dist::ShardSpec batch_spec{{"model"}, {}, {}};
  const std::vector<float> data = train_decoder(steps, [](nn::ModuleList&) {}, &batch_spec, &mesh);
  auto count = [](const std::string& report, const std::string& op) {
    int n = 0;
    for (size_t at = 0; (at = report.find(op, at)) != std::string::npos; ++at) ++n;
    return n;
  };
  double worst = 0;
  for (int s = 0; s < steps; ++s) {
    worst = std::max({worst, std::abs(double{megatron[s]} - plain[s]) / std::abs(plain[s]),
                      std::abs(double{data[s]} - plain[s]) / std::abs(plain[s])});
    if (s == 0 || (s + 1) % 10 == 0 || s + 1 == steps)
      std::printf(
          "decoder-sharded: step %3d  loss %.5f  column/row-annotated %.5f  "
          "batch-annotated %.5f\n",
          s + 1, plain[s], megatron[s], data[s]);
  }
  std::printf(
      "decoder-sharded: %d ranks, largest relative loss difference %.1e; the partitioner "
      "inserted %d all_reduce(s), %d all_gather(s) and %d local slice(s) into the "
      "annotated step (each loop body counted once)\n",
      dist::world_size(), worst, count(megatron_report, "mesh_all_reduce"),
      count(megatron_report, "mesh_all_gather"), count(megatron_report, "mesh_slice"));
  return worst < 1e-4 ? 0 : 1;
}

constexpr int64_t kDim = 64, kHeads = 4, kLayers = 4, kContext = 32, kBatch = 16;

struct FullBlock : nn::Module {  // train_lm's block, to initialize the shards from
  std::shared_ptr<nn::LayerNorm> ln1, ln2;
  std::shared_ptr<nn::CausalSelfAttention> attn;
  std::shared_ptr<nn::Linear> up, down;
  FullBlock() {
    ln1 = register_module("ln1", std::make_shared<nn::LayerNorm>(kDim));
    attn = register_module("attn", std::make_shared<nn::CausalSelfAttention>(kDim, kHeads));
    ln2 = register_module("ln2", std::make_shared<nn::LayerNorm>(kDim));
    up = register_module("up", std::make_shared<nn::Linear>(kDim, 4 * kDim));
    down = register_module("down", std::make_shared<nn::Linear>(4 * kDim, kDim));
  }
};

struct ShardedBlock : nn::Module {
  std::shared_ptr<nn::LayerNorm> ln1, ln2;
  std::shared_ptr<dist::ShardedCausalSelfAttention> attn;
  std::shared_ptr<dist::ColumnParallelLinear> up;
  std::shared_ptr<dist::RowParallelLinear> down;
  explicit ShardedBlock(const FullBlock& full) {
    ln1 = register_module("ln1", std::make_shared<nn::LayerNorm>(kDim));
    attn =
        register_module("attn", std::make_shared<dist::ShardedCausalSelfAttention>(kDim, kHeads));
    ln2 = register_module("ln2", std::make_shared<nn::LayerNorm>(kDim));
    up = register_module("up",
                         std::make_shared<dist::ColumnParallelLinear>(kDim, 4 * kDim, true, false));
    down = register_module("down", std::make_shared<dist::RowParallelLinear>(4 * kDim, kDim));
    attn->load(*full.attn);
    up->load(*full.up);
    down->load(*full.down);
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
    for (int i = 0; i < kLayers; ++i)
      blocks->push_back(std::make_shared<ShardedBlock>(FullBlock()));
    norm = register_module("norm", std::make_shared<nn::LayerNorm>(kDim));
    head = register_module("head", std::make_shared<nn::Linear>(kDim, vocab));
  }
  Tensor forward(const Tensor& tokens) override {
    Tensor positions = loom::arange(0, static_cast<double>(tokens.size(1)), loom::int64);
    Tensor x = (*tok)(tokens) + (*pos)(positions);
    return (*head)((*norm)(loom::scan_layers(*blocks, x)));
  }
};

int train_lm_tp(int steps, std::string path) {
  if (path.empty())
    for (const char* p :
         {"data/tale_of_two_cities.txt", LOOM_SOURCE_DIR "/data/tale_of_two_cities.txt"})
      if (std::ifstream(p)) {
        path = p;
        break;
      }
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "train-lm-tp: cannot read the text (pass its path)\n");
    return 1;
  }
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::map<char, int64_t> index;
  for (char c : text) index[c] = 0;
  int64_t vocab = 0;
  for (auto& [c, i] : index) i = vocab++;
  loom::manual_seed(0);  // equal replicated parameters on every rank
  LanguageModel model(vocab);
  loom::optim::AdamW opt(model.parameters(), 3e-3, 0.9, 0.99, 1e-8, 0.01);
  auto step = loom::compile(
      [&](const Tensor& x, const Tensor& y) {
        Tensor logits = model(x);
        Tensor loss = loom::cross_entropy(loom::reshape(logits, {kBatch * kContext, vocab}),
                                          loom::reshape(y, {kBatch * kContext}));
        loss.backward();
        opt.step();
        opt.zero_grad();
        return loss;
      },
      {.name = "train_lm_tp_step", .trace_once = true});
  std::mt19937 rng(1);  // the same batches on every rank
  std::uniform_int_distribution<size_t> start(0, text.size() - kContext - 2);
  for (int s = 1; s <= steps; ++s) {
    std::vector<int64_t> xs, ys;
    for (int64_t b = 0; b < kBatch; ++b) {
      size_t at = start(rng);
      for (int64_t t = 0; t < kContext; ++t) {
        xs.push_back(index[text[at + t]]);
        ys.push_back(index[text[at + t + 1]]);
      }
    }
    Tensor loss = step(loom::tensor(xs, {kBatch, kContext}), loom::tensor(ys, {kBatch, kContext}));
    const float l = loss.item<float>();
    if (s == 1 || s % 25 == 0 || s == steps)
      std::printf("train-lm-tp: step %3d  loss %.4f (blocks split over %d ranks)\n", s, l,
                  dist::world_size());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "";
  const int steps = argc > 2 ? std::atoi(argv[2]) : 0;
  loom::dist::init();
  int rc = 2;
  if (what == "decoder-dp")
    rc = decoder_dp(steps > 0 ? steps : 40);
  else if (what == "decoder-sharded")
    rc = decoder_sharded(steps > 0 ? steps : 30);
  else if (what == "train-lm-tp")
    rc = train_lm_tp(steps > 0 ? steps : 100, argc > 3 ? argv[3] : "");
  else
    std::fprintf(
        stderr,
        "usage: loom-dist-examples decoder-dp|decoder-sharded|train-lm-tp [steps] [text]\n");
  loom::dist::finalize();
  return rc;
}
