// `loom-bench --peers`: the peer workloads (decoder_forward, decoder_train_step,
// scan_layers_compile, cumsum_scan, mlp_train) run by JAX, PyTorch/XLA, torch.compile and
// PyTorch eager in the same run, each figure beside loom's as a ratio. The peers live in
// venvs outside the repository (LOOM_PEER_JAX, LOOM_PEER_TORCH_XLA, LOOM_PEER_TORCH; recipe
// in ../shared/reference/peers_setup.md); their scripts are bench/peers/*.py.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "bench.h"

namespace loom::bench {
namespace {

// One comparison: loom's figure `loom_key` against each peer's `peer_key`.
struct Pair {
  const char* loom_key;
  const char* peer_key;
  bool higher_is_better;  // rates (steps/s) against times
  const char* goal;       // the goal against the best peer, for the table
};

struct Work {
  const char* name;
  std::vector<Pair> pairs;
};

const std::vector<Work>& works() {
  static const std::vector<Work> w = {
      {"decoder_forward", {{"forward_ms", "forward_ms", false, "<= 0.9x best"}}},
      {"decoder_train_step", {{"train_step_ms", "train_step_ms", false, "<= 0.85x best"}}},
      {"scan_layers_compile",
       {{"scan_layers_L50_compile_ms", "scan_compile_ms", false, "<= 1/20 JAX"},
        {"for_loop_L50_compile_ms", "loop_compile_ms", false, "<= 1/20 JAX"}}},
      {"cumsum_scan",
       {{"scan_call_ns_per_iteration", "ns_per_iteration", false, "<= 0.5x JAX"},
        {"scan_ns_per_iteration", "execute_ns_per_iteration", false, "run alone"}}},
      {"mlp_train",
       {{"trace_once_steps_per_s", "steps_per_s", true, ">= 2x JAX pipelined"},
        {"trace_once_steps_per_s", "steps_per_s_pipelined", true, ">= 2x JAX pipelined"}}},
  };
  return w;
}

struct Peer {
  const char* name;    // as printed
  const char* id;      // figure prefix
  const char* env;     // the interpreter's variable
  const char* script;  // under bench/peers
  const char* args;    // after the work's name
  const char* vars;    // the peer's own environment
};

const std::vector<Peer>& peers() {
  static const std::vector<Peer> p = {
      {"JAX", "jax", "LOOM_PEER_JAX", "jax_peer.py", "", "JAX_PLATFORMS=cpu"},
      {"PyTorch/XLA", "torch_xla", "LOOM_PEER_TORCH_XLA", "torch_xla_peer.py", "",
       "PJRT_DEVICE=CPU"},
      {"torch.compile", "torch_compile", "LOOM_PEER_TORCH", "torch_peer.py", "--mode compile", ""},
      {"torch eager", "torch_eager", "LOOM_PEER_TORCH", "torch_peer.py", "--mode eager", ""},
  };
  return p;
}

// What one peer printed for one work, or why it printed nothing.
struct PeerRun {
  std::string output, why, version;
};

PeerRun run_peer(const Peer& peer, const std::string& work) {
  PeerRun r;
  const char* py = std::getenv(peer.env);
  if (!py || !*py) {
    r.why = std::string("not measured: set ") + peer.env +
            "=path/to/venv/bin/python (recipe: ../shared/reference/peers_setup.md)";
    return r;
  }
  const std::string script = bench_file(std::string("peers/") + peer.script);
  if (script.empty()) {
    r.why = std::string("not measured: bench/peers/") + peer.script + " not found";
    return r;
  }
  // Cold compiles: no persistent compile caches, as loom's benchmarks clear LOOM_CACHE_DIR.
  const std::string cmd = std::string(
                              "env -u XLA_PERSISTENT_CACHE_PATH -u "
                              "JAX_COMPILATION_CACHE_DIR ") +
                          peer.vars + " '" + py + "' '" + script + "' " + work + " " + peer.args +
                          " 2>&1";
  int rc = 0;
  r.output = command_output(cmd, &rc);
  r.version = word_in(r.output, "version");
  if (rc != 0) {
    std::string last = r.output.substr(r.output.find_last_of('\n', r.output.size() - 2) + 1);
    while (!last.empty() && last.back() == '\n') last.pop_back();
    r.why = "failed (exit " + std::to_string(rc) + "): " + last;
  }
  return r;
}

double value_of(const std::vector<Figure>& figs, const std::string& key) {
  for (const Figure& f : figs)
    if (f.name == key) return f.value;
  return -1;
}

// The figures of the last --peers run, for the closing table: [work/loom_key][peer] = value.
struct Row {
  std::string label, goal;
  bool higher_is_better = false;
  double loom = -1;
  std::map<std::string, double> peer;
};
std::vector<Row>& rows() {
  static std::vector<Row> r;
  return r;
}

}  // namespace

bool has_peers(const std::string& benchmark) {
  for (const Work& w : works())
    if (benchmark == w.name) return true;
  return false;
}

std::vector<std::string> peer_benchmarks() {
  std::vector<std::string> names;
  for (const Work& w : works()) names.push_back(w.name);
  return names;
}

void add_peer_figures(const std::string& benchmark, std::vector<Figure>& figs) {
  const Work* work = nullptr;
  for (const Work& w : works())
    if (benchmark == w.name) work = &w;
  if (!work) return;
  const size_t first_row = rows().size();
  for (const Pair& p : work->pairs) {
    Row row;
    row.label = benchmark + ": " + p.loom_key + " vs " + p.peer_key;
    row.goal = p.goal;
    row.higher_is_better = p.higher_is_better;
    row.loom = value_of(figs, p.loom_key);
    rows().push_back(row);
  }
  for (const Peer& peer : peers()) {
    std::fprintf(stderr, "loom-bench: %s on %s...\n", benchmark.c_str(), peer.name);
    const PeerRun run = run_peer(peer, benchmark);
    if (!run.why.empty()) {
      figs.push_back({std::string(peer.id) + "_not_measured", 0, "", run.why});
      continue;
    }
    const std::string who = std::string(peer.name) + " " + run.version;
    for (size_t i = 0; i < work->pairs.size(); ++i) {
      const Pair& p = work->pairs[i];
      const double v = figure_in(run.output, p.peer_key);
      if (v <= 0) continue;
      const double loom = rows()[first_row + i].loom;
      rows()[first_row + i].peer[peer.name] = v;
      const std::string key = std::string(peer.id) + "_" + p.peer_key;
      if (value_of(figs, key) < 0) figs.push_back({key, v, "", "same run: " + who});
      if (loom > 0)
        figs.push_back({"ratio_vs_" + key, loom / v, "x",
                        p.higher_is_better ? "loom / peer: > 1 = loom faster"
                                           : "loom / peer: < 1 = loom faster"});
    }
  }
}

void print_peer_table() {
  if (rows().empty()) return;
  std::printf("\n| work: loom figure vs peer figure | loom |");
  for (const Peer& p : peers()) std::printf(" %s |", p.name);
  std::printf(" loom / best peer | goal |\n|---|---|");
  for (size_t i = 0; i < peers().size(); ++i) std::printf("---|");
  std::printf("---|---|\n");
  for (const Row& r : rows()) {
    std::printf("| %s | %.4g |", r.label.c_str(), r.loom);
    double best = -1;
    for (const Peer& p : peers()) {
      auto it = r.peer.find(p.name);
      if (it == r.peer.end()) {
        std::printf(" — |");
        continue;
      }
      std::printf(" %.4g |", it->second);
      if (best < 0 || (r.higher_is_better ? it->second > best : it->second < best))
        best = it->second;
    }
    if (best > 0 && r.loom > 0)
      std::printf(" %.3g |", r.loom / best);
    else
      std::printf(" — |");
    std::printf(" %s |\n", r.goal.c_str());
  }
}

}  // namespace loom::bench
