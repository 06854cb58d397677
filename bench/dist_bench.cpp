// Distributed figures, each rank a child process (`loom-bench --child ...`) over Gloo on
// 127.0.0.1 with a fresh file store (all_reduce through the ranks' shared-memory segment):
//   dist_all_reduce     float32 all_reduce(sum) of 1, 16 and 256 MiB between 2 local ranks
//                       (LOOM_BENCH_DIST_MIB="1,16,256"), against memcpy of the same size
//                       in the same run, and on Gloo's TCP ring (LOOM_DIST_SHM=0)
//   dist_data_parallel  the seed decoder's training step (DataParallel, compile trace_once),
//                       2 ranks x 1 thread against 1 rank x 1 thread, each rank with the
//                       seed's x [4,512,512]: samples per second (LOOM_BENCH_DP_LAYERS,
//                       default 4; LOOM_BENCH_DP_SEQ, default 512), and what one all_reduce
//                       of the step's gradient bytes costs alone; and two single-rank
//                       processes run at once (no collective) as the bound two busy cores set;
//                       LOOM_BENCH_DP_ROUNDS rounds (default 3) of the three, medians reported
//   dist_sharding       mark_sharding (column/row weights; the batch dim; L = 50 decoder's first
//                       step) against the hand-written TP layers, DataParallel and no annotation
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "bench.h"
#include "loom/loom.h"

namespace loom::bench {
namespace {

std::string fresh_dir() {
  std::string t = (std::filesystem::temp_directory_path() / "loom-bench-XXXXXX").string();
  std::vector<char> b(t.begin(), t.end());
  b.push_back(0);
  return ::mkdtemp(b.data()) ? std::string(b.data()) : std::string("/tmp");
}

// Runs `world` ranks of the child `name` with `args`; returns rank 0's output.
std::string run_ranks(const std::string& name, int world, const std::string& args,
                      const std::string& env = "") {
  const std::string store = fresh_dir();
  std::string cmd;
  for (int r = world - 1; r >= 0; --r) {
    cmd += env + " LOOM_RANK=" + std::to_string(r) + " LOOM_WORLD_SIZE=" + std::to_string(world) +
           " LOOM_STORE='" + store + "' '" + self_path() + "' --child " + name + " " + args;
    cmd += r > 0 ? " >/dev/null 2>&1 & " : " 2>/dev/null; wait";
  }
  std::string out = command_output(cmd);
  std::error_code ec;
  std::filesystem::remove_all(store, ec);
  return out;
}

std::vector<int64_t> sizes_mib() {
  const char* s = std::getenv("LOOM_BENCH_DIST_MIB");
  std::stringstream in(s && *s ? s : "1,16,256");
  std::vector<int64_t> v;
  for (std::string w; std::getline(in, w, ',');) v.push_back(std::atoll(w.c_str()));
  return v;
}

int all_reduce_rank(int argc, char** argv) {
  dist::init();
  dist::Communicator& c = dist::require("bench");
  for (int64_t mib : sizes_mib()) {
    const int64_t n = mib * 1024 * 1024 / 4;
    std::vector<float> a(static_cast<size_t>(n), 1.0f), b(a.size());
    const int reps = mib >= 256 ? 3 : mib >= 16 ? 5 : 10;
    c.all_reduce(a.data(), n, DType::Float32, dist::ReduceOp::Sum);  // warm the connections
    c.barrier();
    double t = median_seconds(
        reps, [&] { c.all_reduce(a.data(), n, DType::Float32, dist::ReduceOp::Sum); });
    double m = median_seconds(reps, [&] { std::memcpy(b.data(), a.data(), a.size() * 4); });
    std::printf("all_reduce_%lld %.9f\nmemcpy_%lld %.9f\n", static_cast<long long>(mib), t,
                static_cast<long long>(mib), m);
  }
  dist::finalize();
  return 0;
}
RegisterChild all_reduce_child("dist_all_reduce_rank", all_reduce_rank);

Register all_reduce_bench(
    "dist_all_reduce",
    "all_reduce(sum) of float32 buffers between 2 local ranks (shared memory; Gloo's TCP ring) "
    "vs memcpy",
    [] {
      std::vector<Figure> f;
      std::string out = run_ranks("dist_all_reduce_rank", 2, "");
      // The same ranks with the segment off: Gloo's ring over loopback TCP.
      std::string ring = run_ranks("dist_all_reduce_rank", 2, "", "LOOM_DIST_SHM=0");
      for (int64_t mib : sizes_mib()) {
        const std::string k = std::to_string(mib);
        double t = figure_in(out, "all_reduce_" + k), m = figure_in(out, "memcpy_" + k);
        double g = figure_in(ring, "all_reduce_" + k);
        if (t <= 0 || m <= 0 || g <= 0) {
          f.push_back(
              {"failed_" + k, 0, "", "a rank failed (loom-bench --child dist_all_reduce_rank)"});
          continue;
        }
        const double gb = static_cast<double>(mib) / 1024;
        f.push_back({"all_reduce_ms_" + k + "MiB", t * 1e3, "ms",
                     "one all_reduce, 2 ranks, through shared memory"});
        f.push_back({"all_reduce_GBps_" + k + "MiB", gb / t, "GB/s", "buffer size / time"});
        f.push_back({"memcpy_GBps_" + k + "MiB", gb / m, "GB/s", "the same size, same run"});
        f.push_back(
            {"all_reduce_over_memcpy_" + k + "MiB", t / m, "x", "all_reduce time / memcpy time"});
        f.push_back({"gloo_ring_ms_" + k + "MiB", g * 1e3, "ms",
                     "the same on Gloo's TCP ring (LOOM_DIST_SHM=0), same run"});
        f.push_back({"ring_over_shm_" + k + "MiB", g / t, "x", "Gloo ring time / shared memory"});
      }
      return f;
    });

struct Layer : nn::Module {
  std::shared_ptr<nn::Linear> linear;
  explicit Layer(int64_t d) {
    linear = register_module("linear", std::make_shared<nn::Linear>(d, d));
  }
  Tensor forward(const Tensor& x) override { return gelu((*linear)(x)) + x; }
};

int dp_rank(int argc, char** argv) {
  dist::init();
  const char* ls = std::getenv("LOOM_BENCH_DP_LAYERS");
  const int layers_n = ls ? std::atoi(ls) : 4;
  const int steps = argc > 0 ? std::atoi(argv[0]) : 20;
  const char* sq = std::getenv("LOOM_BENCH_DP_SEQ");
  const int64_t dim = 512, per_rank = 4, seq = sq ? std::atoi(sq) : 512;
  manual_seed(0);
  nn::ModuleList layers;
  for (int i = 0; i < layers_n; ++i) layers.push_back(std::make_shared<Layer>(dim));
  dist::DataParallel dp(layers);
  optim::SGD opt(layers.parameters(), 1e-3);
  auto step = compile(
      [&](const Tensor& x) {
        opt.zero_grad();
        Tensor loss = mean(scan_layers(layers, x) * 1.0);
        loss.backward();
        dp.average_gradients();
        opt.step();
        return loss;
      },
      {.name = "dp_bench", .trace_once = true});
  Tensor x = randn({per_rank, seq, dim});
  step(x).item<float>();  // compile
  dist::barrier();
  const double t0 = seconds();
  for (int s = 0; s < steps; ++s) step(x).item<float>();
  const double dt = seconds() - t0;
  std::printf("samples_per_s %.6f\nstep_ms %.6f\n", per_rank * dist::world_size() * steps / dt,
              dt / steps * 1e3);
  // The collective alone: one all_reduce of as many float32 as the gradients hold.
  int64_t n = 0;
  for (const Tensor& p : layers.parameters()) n += p.numel();
  std::vector<float> g(static_cast<size_t>(n), 1.0f);
  dist::Communicator& c = dist::require("bench");
  c.barrier();
  const double ar =
      median_seconds(5, [&] { c.all_reduce(g.data(), n, DType::Float32, dist::ReduceOp::Sum); });
  std::printf("grad_mib %.6f\nall_reduce_ms %.6f\n", n * 4.0 / (1 << 20), ar * 1e3);
  dist::finalize();
  return 0;
}
RegisterChild dp_child("dist_dp_rank", dp_rank);

Register dp_bench(
    "dist_data_parallel",
    "decoder training step: 2 ranks x 1 thread vs 1 rank x 1 thread (DataParallel)", [] {
      const char* st = std::getenv("LOOM_BENCH_DP_STEPS");
      const std::string steps = st ? st : "10";
      const char* rs = std::getenv("LOOM_BENCH_DP_ROUNDS");
      const int rounds = std::max(1, rs ? std::atoi(rs) : 3);
      // Rounds of the three runs back to back: this machine's speed drifts by tens of percent
      // between minutes, so each ratio is taken within a round and the rounds' median reported.
      std::vector<double> s1, s2, sp, scaling, solo_scaling, vs_solo, step1, step2;
      std::string two;
      for (int r = 0; r < rounds; ++r) {
        std::string one = run_ranks("dist_dp_rank", 1, steps, "LOOM_NUM_THREADS=1");
        two = run_ranks("dist_dp_rank", 2, steps, "LOOM_NUM_THREADS=1");
        // Two single-rank processes at once, no collective: what the two cores
        // give when both are busy (a shared L3 and memory, one clock for both).
        const std::string solo = "LOOM_NUM_THREADS=1 LOOM_RANK=0 LOOM_WORLD_SIZE=1 '" +
                                 self_path() + "' --child dist_dp_rank " + steps;
        std::string pair =
            command_output(solo + " >/dev/null 2>&1 & " + solo + " 2>/dev/null; wait");
        const double a = figure_in(one, "samples_per_s"), b = figure_in(two, "samples_per_s"),
                     c = 2 * figure_in(pair, "samples_per_s");
        if (a <= 0 || b <= 0 || c <= 0)
          return std::vector<Figure>{
              {"failed", 0, "", "a rank failed (loom-bench --child dist_dp_rank)"}};
        s1.push_back(a);
        s2.push_back(b);
        sp.push_back(c);
        scaling.push_back(b / a);
        solo_scaling.push_back(c / a);
        vs_solo.push_back(b / c);
        step1.push_back(figure_in(one, "step_ms"));
        step2.push_back(figure_in(two, "step_ms"));
      }
      const auto [lo, hi] = std::minmax_element(scaling.begin(), scaling.end());
      char range[96];
      std::snprintf(range, sizeof range, "goal >= 1.8; median of %d rounds (%.3f-%.3f)", rounds,
                    *lo, *hi);
      return std::vector<Figure>{
          {"samples_per_s_1rank", median(s1), "1/s", "1 rank x 1 thread, x [4,seq,512]"},
          {"samples_per_s_2ranks", median(s2), "1/s", "2 ranks x 1 thread, x [4,seq,512] each"},
          {"scaling_2_over_1", median(scaling), "x", range},
          {"samples_per_s_2solo", median(sp), "1/s",
           "two 1-rank processes at once, no collective (same rounds)"},
          {"scaling_2solo_over_1", median(solo_scaling), "x",
           "what 2 busy cores give without communication: the bound on scaling_2_over_1"},
          {"scaling_2_over_2solo", median(vs_solo), "x",
           "2 ranks against what 2 busy cores give without communication"},
          {"step_ms_1rank", median(step1), "ms", "no collective"},
          {"step_ms_2ranks", median(step2), "ms",
           "the all_reduce runs after the backward (no overlap)"},
          {"grad_MiB", figure_in(two, "grad_mib"), "MiB", "all_reduced per step"},
          {"all_reduce_ms", figure_in(two, "all_reduce_ms"), "ms",
           "that many bytes in one all_reduce, alone, 2 ranks (last round)"},
      };
    });

// A residual MLP block, written at global shapes (annotated) or with the tensor-parallel layers.
struct MlpBlock : nn::Module {
  std::shared_ptr<nn::Linear> up, down;
  explicit MlpBlock(int64_t d) {
    up = register_module("up", std::make_shared<nn::Linear>(d, 4 * d));
    down = register_module("down", std::make_shared<nn::Linear>(4 * d, d));
  }
  Tensor forward(const Tensor& x) override { return x + (*down)(gelu((*up)(x))); }
};
struct TpBlock : nn::Module {
  std::shared_ptr<dist::ColumnParallelLinear> up;
  std::shared_ptr<dist::RowParallelLinear> down;
  explicit TpBlock(int64_t d) {
    up = register_module("up", std::make_shared<dist::ColumnParallelLinear>(d, 4 * d, true, false));
    down = register_module("down", std::make_shared<dist::RowParallelLinear>(4 * d, d));
  }
  Tensor forward(const Tensor& x) override { return x + (*down)(gelu((*up)(x))); }
};

// argv: mode (tp, annotated, dp, batch, seed_plain, seed_annotated), steps.
int sharding_rank(int argc, char** argv) {
  dist::init();
  const std::string mode = argc > 0 ? argv[0] : "";
  const int steps = argc > 1 ? std::atoi(argv[1]) : 10;
  const int64_t world = dist::world_size();
  const dist::Mesh mesh({world}, {"x"});
  if (mode == "seed_plain" || mode == "seed_annotated") {  // the first step's cost
    manual_seed(0);
    nn::ModuleList layers;
    for (int i = 0; i < 50; ++i) layers.push_back(std::make_shared<Layer>(128));
    if (mode == "seed_annotated")
      for (const Tensor& p : layers.parameters())
        if (p.dim() == 2) dist::mark_sharding(p, mesh, {{"x"}, {}});
    optim::SGD opt(layers.parameters(), 1e-3);
    auto step = compile(
        [&](const Tensor& x) {
          opt.zero_grad();
          Tensor loss = mean(scan_layers(layers, x) * 1.0);
          loss.backward();
          opt.step();
          return loss;
        },
        {.name = "seed_first_step", .trace_once = true});
    Tensor x = randn({4, 64, 128});
    sync();
    dist::barrier();
    const double t0 = seconds();
    step(x).item<float>();
    std::printf("first_step_ms %.6f\n", (seconds() - t0) * 1e3);
    dist::finalize();
    return 0;
  }
  const int64_t dim = 512, per_rank = 4, seq = 256, blocks = 4;
  const bool batch_split = mode == "dp" || mode == "batch";
  manual_seed(0);
  nn::ModuleList layers;
  for (int i = 0; i < blocks; ++i) {
    if (mode == "tp")
      layers.push_back(std::make_shared<TpBlock>(dim));
    else
      layers.push_back(std::make_shared<MlpBlock>(dim));
  }
  if (mode == "annotated")
    for (size_t i = 0; i < layers.size(); ++i) {
      auto& b = dynamic_cast<MlpBlock&>(*layers[i]);
      dist::mark_sharding(b.up->weight, mesh, {{"x"}, {}});
      dist::mark_sharding(b.up->bias, mesh, {{"x"}});
      dist::mark_sharding(b.down->weight, mesh, {{}, {"x"}});
    }
  std::unique_ptr<dist::DataParallel> dp;
  if (mode == "dp") dp = std::make_unique<dist::DataParallel>(layers);
  optim::SGD opt(layers.parameters(), 1e-3);
  auto step = compile(
      [&](const Tensor& x) {
        opt.zero_grad();
        Tensor loss = mean(scan_layers(layers, x) * 1.0);
        loss.backward();
        if (dp) dp->average_gradients();
        opt.step();
        return loss;
      },
      {.name = "sharding_bench", .trace_once = true});
  // Data parallel: each rank's batch is per_rank rows (DataParallel) or its block of the
  // annotated global batch; tensor parallel: every rank the same per_rank rows.
  Tensor x = randn({batch_split && mode == "batch" ? per_rank * world : per_rank, seq, dim});
  if (mode == "batch") dist::mark_sharding(x, mesh, {{"x"}, {}, {}});
  for (int s = 0; s < 2; ++s) step(x).item<float>();  // compile (twice: the moments' layout)
  dist::barrier();
  const double t0 = seconds();
  for (int s = 0; s < steps; ++s) step(x).item<float>();
  std::printf("step_ms %.6f\n", (seconds() - t0) / steps * 1e3);
  dist::finalize();
  return 0;
}
RegisterChild sharding_child("dist_sharding_rank", sharding_rank);

Register sharding_bench(
    "dist_sharding",
    "mark_sharding vs hand-written tensor/data parallel, 2 ranks x 1 thread; annotated compile",
    [] {
      const char* rs = std::getenv("LOOM_BENCH_SHARD_ROUNDS");
      const int rounds = std::max(1, rs ? std::atoi(rs) : 3);
      const std::string env = "LOOM_NUM_THREADS=1";
      std::vector<double> tp, an, dp, bt, tp_r, dp_r, sp, sa, seed_r;
      for (int r = 0; r < rounds; ++r) {
        const double a = figure_in(run_ranks("dist_sharding_rank", 2, "tp 10", env), "step_ms");
        const double b =
            figure_in(run_ranks("dist_sharding_rank", 2, "annotated 10", env), "step_ms");
        const double c = figure_in(run_ranks("dist_sharding_rank", 2, "dp 10", env), "step_ms");
        const double d = figure_in(run_ranks("dist_sharding_rank", 2, "batch 10", env), "step_ms");
        const double e =
            figure_in(run_ranks("dist_sharding_rank", 2, "seed_plain", env), "first_step_ms");
        const double f =
            figure_in(run_ranks("dist_sharding_rank", 2, "seed_annotated", env), "first_step_ms");
        if (a <= 0 || b <= 0 || c <= 0 || d <= 0 || e <= 0 || f <= 0)
          return std::vector<Figure>{
              {"failed", 0, "", "a rank failed (loom-bench --child dist_sharding_rank MODE)"}};
        tp.push_back(a), an.push_back(b), dp.push_back(c), bt.push_back(d);
        sp.push_back(e), sa.push_back(f);
        tp_r.push_back(b / a), dp_r.push_back(d / c), seed_r.push_back(f / e);
      }
      return std::vector<Figure>{
          {"step_ms_tensor_parallel_layers", median(tp), "ms", "Column/RowParallelLinear blocks"},
          {"step_ms_annotated_column_row", median(an), "ms", "nn::Linear blocks + mark_sharding"},
          {"annotated_over_tp_layers", median(tp_r), "x", "goal <= 1.05; same-round ratio"},
          {"step_ms_data_parallel", median(dp), "ms", "DataParallel, 4 rows per rank"},
          {"step_ms_batch_annotated", median(bt), "ms", "8 rows with dim 0 annotated"},
          {"batch_annotated_over_dp", median(dp_r), "x", "goal <= 1.05; same-round ratio"},
          {"seed_first_step_ms_plain", median(sp), "ms", "L = 50, trace + compile + run"},
          {"seed_first_step_ms_annotated", median(sa), "ms", "the same with weights annotated"},
          {"annotated_first_step_over_plain", median(seed_r), "x", "goal <= 1.5; same round"},
      };
    });

}  // namespace
}  // namespace loom::bench
