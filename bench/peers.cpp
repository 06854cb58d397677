// `loom-bench --peers`: the peer workloads (decoder_forward, decoder_train_step,
// scan_layers_compile, cumsum_scan, mlp_train, attention, gpt) run by JAX, PyTorch/XLA,
// torch.compile and PyTorch eager (and gpt by loom's Python package) in the same run, each figure
// beside loom's as a ratio, in rounds of loom and every peer back to back (LOOM_BENCH_PEER_ROUNDS,
// default 3): medians of the rounds' ratios. The peers live in venvs outside the repository
// (LOOM_PEER_JAX, LOOM_PEER_TORCH_XLA, LOOM_PEER_TORCH; recipe in
// ../shared/reference/peers_setup.md); their scripts are bench/peers/*.py.
#include <algorithm>
#include <cmath>
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
  bool higher_is_better;        // rates (steps/s) against times
  const char* goal;             // the goal against the best peer, for the table
  bool compilers_only = false;  // a compile time: peers that compile nothing are not compared
};

struct Work {
  const char* name;
  std::vector<Pair> pairs;
  // Figures every program must reproduce (the same training run's losses): each program's
  // relative difference from loom's, in the figures and the table.
  std::vector<const char*> agree = {};
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
        {"compiled_call_ns_per_iteration", "ns_per_iteration", false, "compiled, as jax.jit"},
        {"scan_ns_per_iteration", "execute_ns_per_iteration", false, "run alone"}}},
      {"mlp_train",
       {{"trace_once_steps_per_s", "steps_per_s", true, ">= 2x JAX pipelined"},
        {"trace_once_steps_per_s", "steps_per_s_pipelined", true, ">= 2x JAX pipelined"}}},
      {"attention",
       {{"fwd_bwd_T1024_ms", "fwd_bwd_T1024_ms", false, "<= 0.8x torch SDPA"},
        {"fwd_bwd_T4096_ms", "fwd_bwd_T4096_ms", false, "<= 0.8x torch SDPA"}}},
      // ~30 s per program and round; rounds as every work: one round let one program's drift
      // between minutes decide the ratio (0.75-0.87 across three one-round runs).
      {"gpt",
       {{"step_ms", "step_ms", false, "<= 0.8x best"},
        {"peak_rss_mb", "peak_rss_mb", false, "<= 0.7x best"},
        {"first_step_ms", "first_step_ms", false, "trace + compile + run"},
        {"compile_ms", "compile_ms", false, "<= 1/10 fastest compiler", true}},
       {"loss_0", "loss_30"}},
  };
  return w;
}

struct Peer {
  const char* name;            // as printed
  const char* id;              // figure prefix
  const char* env;             // the interpreter's variable
  const char* script;          // under bench/peers
  const char* args;            // after the work's name
  const char* vars;            // the peer's own environment
  const char* only = nullptr;  // runs only this work
  bool is_loom = false;        // loom itself (its Python package): no peer for "best peer"
  bool compiles = true;        // false: torch eager, whose compile_ms is only warm-up
};

const std::vector<Peer>& peers() {
  static const std::vector<Peer> p = {
      {"JAX", "jax", "LOOM_PEER_JAX", "jax_peer.py", "", "JAX_PLATFORMS=cpu"},
      {"PyTorch/XLA", "torch_xla", "LOOM_PEER_TORCH_XLA", "torch_xla_peer.py", "",
       "PJRT_DEVICE=CPU"},
      {"torch.compile", "torch_compile", "LOOM_PEER_TORCH", "torch_peer.py", "--mode compile", ""},
      {"torch eager", "torch_eager", "LOOM_PEER_TORCH", "torch_peer.py", "--mode eager", "",
       nullptr, false, false},
      {"loom Python", "loom_python", "LOOM_PEER_LOOM_PYTHON", "loom_peer.py", "", "", "gpt", true},
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
  std::string vars = peer.vars;
#ifdef LOOM_BENCH_PYTHON  // loom's own package: the build's interpreter and build/python
  if (peer.is_loom && (!py || !*py)) {
    py = LOOM_BENCH_PYTHON;
    vars += " PYTHONPATH='" LOOM_BENCH_PYTHONPATH "'";
  }
#endif
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
                          vars + " '" + py + "' '" + script + "' " + work + " " + peer.args +
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

// The figures of the last --peers run, for the closing table: medians over the rounds.
struct Row {
  std::string label, goal;
  bool higher_is_better = false;
  double loom = -1;
  std::map<std::string, double> peer;
  std::vector<double> vs_best;  // each round's loom / its best peer
  double max_rel_diff = -1;     // an `agree` row: the largest |peer / loom - 1|
};
std::vector<Row>& rows() {
  static std::vector<Row> r;
  return r;
}

// Rounds of loom and every peer back to back (LOOM_BENCH_PEER_ROUNDS, default 3; 1 when no
// peer is set): this machine's speed drifts by tens of percent between minutes, so each ratio
// is taken within a round and the median of the rounds' ratios reported, as
// dist_data_parallel does.
int peer_rounds() {
  bool any = false;
  for (const Peer& p : peers()) any = any || (std::getenv(p.env) && *std::getenv(p.env));
  const char* r = std::getenv("LOOM_BENCH_PEER_ROUNDS");
  return any ? std::max(1, r && *r ? std::atoi(r) : 3) : 1;
}

// `loom-bench --child figures NAME`: one benchmark in a fresh process, its figures as "key
// value" lines (the later rounds: a fresh process has cold caches, as the first round had).
RegisterChild figures_child("figures", [](int argc, char** argv) {
  for (const Benchmark& b : registry())
    if (argc > 0 && b.name == argv[0]) {
      for (const Figure& f : b.run()) std::printf("%s %.9g\n", f.name.c_str(), f.value);
      return 0;
    }
  return 2;
});

// "(lo-hi)" of the rounds' values; "" for a single round.
std::string range_text(const std::vector<double>& v) {
  if (v.size() < 2) return "";
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  char buf[64];
  std::snprintf(buf, sizeof buf, "(%.3g-%.3g)", *lo, *hi);
  return buf;
}
std::string range_note(const std::vector<double>& v) {
  return v.size() < 2 ? "" : "median of " + std::to_string(v.size()) + " rounds " + range_text(v);
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
  // The pairs, then the figures that must agree (as pairs without a goal).
  std::vector<Pair> pairs = work->pairs;
  for (const char* key : work->agree)
    pairs.push_back({key, key, false, "the same as loom's (same weights and batches)"});
  const size_t np = pairs.size();
  const int rounds = peer_rounds();
  // [pair][round] of loom's figure; [peer][pair][round] of each peer's (-1: not measured).
  std::vector<std::vector<double>> loom(np);
  std::map<std::string, std::vector<std::vector<double>>> theirs;
  std::map<std::string, std::string> who, why;
  for (int r = 0; r < rounds; ++r) {
    std::string out;
    if (r > 0) {
      std::fprintf(stderr, "loom-bench: %s, round %d of %d: loom...\n", benchmark.c_str(), r + 1,
                   rounds);
      out = command_output("'" + self_path() + "' --child figures " + benchmark + " 2>/dev/null");
    }
    for (size_t i = 0; i < np; ++i)
      loom[i].push_back(r == 0 ? value_of(figs, pairs[i].loom_key)
                               : figure_in(out, pairs[i].loom_key));
    for (const Peer& peer : peers()) {
      if (peer.only && benchmark != peer.only) continue;
      std::fprintf(stderr, "loom-bench: %s on %s (round %d of %d)...\n", benchmark.c_str(),
                   peer.name, r + 1, rounds);
      const PeerRun run = run_peer(peer, benchmark);
      auto& v = theirs[peer.name];
      v.resize(np);
      if (!run.why.empty()) why[peer.name] = run.why;
      if (!run.version.empty()) who[peer.name] = std::string(peer.name) + " " + run.version;
      for (size_t i = 0; i < np; ++i)
        v[i].push_back(run.why.empty() ? figure_in(run.output, pairs[i].peer_key) : -1);
    }
  }
  auto measured = [](const std::vector<double>& v) {
    std::vector<double> m;
    for (double x : v)
      if (x > 0) m.push_back(x);
    return m;
  };
  for (size_t i = 0; i < np; ++i) {
    const Pair& p = pairs[i];
    const bool agree = i >= work->pairs.size();
    Row row;
    row.label = benchmark + ": " + p.loom_key +
                (agree ? " (each program)" : " vs " + std::string(p.peer_key));
    row.goal = p.goal;
    row.higher_is_better = p.higher_is_better;
    std::vector<double> lm = measured(loom[i]);
    row.loom = lm.empty() ? -1 : median(lm);
    if (rounds > 1 && !lm.empty())
      figs.push_back({std::string("loom_") + p.loom_key + "_rounds", row.loom, "",
                      "loom's figure, " + range_note(lm)});
    for (int r = 0; r < rounds; ++r) {
      double best = -1;
      for (const Peer& peer : peers()) {
        if (peer.is_loom || !theirs.count(peer.name) || (p.compilers_only && !peer.compiles))
          continue;
        const double v = theirs[peer.name][i][static_cast<size_t>(r)];
        if (v > 0 && (best < 0 || (p.higher_is_better ? v > best : v < best))) best = v;
      }
      const double l = loom[i][static_cast<size_t>(r)];
      if (best > 0 && l > 0) row.vs_best.push_back(l / best);
    }
    for (const Peer& peer : peers()) {
      if (!theirs.count(peer.name)) continue;
      const std::vector<double>& v = theirs[peer.name][i];
      std::vector<double> pm = measured(v), ratios;
      if (pm.empty()) {  // no round measured it: say why once
        if (i == 0 && why.count(peer.name))
          figs.push_back({std::string(peer.id) + "_not_measured", 0, "", why[peer.name]});
        continue;
      }
      row.peer[peer.name] = median(pm);
      const std::string key = std::string(peer.id) + "_" + p.peer_key;
      if (agree) {  // the same run's figure: its relative difference from loom's
        if (row.loom <= 0) continue;
        const double d = std::fabs(median(pm) / row.loom - 1);
        row.max_rel_diff = std::max(row.max_rel_diff, d);
        figs.push_back({key, median(pm), "", "same run: " + who[peer.name]});
        figs.push_back({key + "_rel_diff", d, "", "|peer / loom - 1|: the same curve"});
        continue;
      }
      for (size_t r = 0; r < v.size(); ++r)
        if (v[r] > 0 && loom[i][r] > 0) ratios.push_back(loom[i][r] / v[r]);
      if (value_of(figs, key) < 0)
        figs.push_back({key, median(pm), "", "same run: " + who[peer.name] + " " + range_note(pm)});
      if (!ratios.empty())
        figs.push_back({"ratio_vs_" + key, median(ratios), "x",
                        std::string(p.higher_is_better ? "loom / peer: > 1 = loom faster"
                                                       : "loom / peer: < 1 = loom faster") +
                            (ratios.size() > 1 ? "; " + range_note(ratios) : "")});
    }
    rows().push_back(std::move(row));
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
    const char* format = r.max_rel_diff >= 0 ? " %.7g |" : " %.4g |";
    std::printf("| %s |", r.label.c_str());
    std::printf(format, r.loom);
    for (const Peer& p : peers()) {
      auto it = r.peer.find(p.name);
      if (it == r.peer.end())
        std::printf(" — |");
      else
        std::printf(format, it->second);
    }
    // The median of the rounds' own ratios (each against that round's best peer); figures that
    // must agree: the largest relative difference from loom's.
    if (r.max_rel_diff >= 0)
      std::printf(" max rel. diff %.2g |", r.max_rel_diff);
    else if (!r.vs_best.empty())
      std::printf(" %.3g %s |", median(r.vs_best), range_text(r.vs_best).c_str());
    else
      std::printf(" — |");
    std::printf(" %s |\n", r.goal.c_str());
  }
}

}  // namespace loom::bench
