// The step graph of a program: which steps wait for which, and whether the program qualifies.
#include "backend/cpu/step_graph.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "backend/cpu/thread_pool.h"

namespace loom::cpu {

namespace {

std::atomic<int> g_step_graph{-1};  // a StepGraphMode, or -1: LOOM_STEP_GRAPH not read yet
std::atomic<int64_t> g_step_graph_runs{0};

// The step graph: the pool's threads run a small program's steps as a dependency graph, so a chain
// of small kernels leaves no thread idle and splits cost no fork and join. Programs qualify up to
// this many non-input bytes, among other rules (docs/architecture.md, "The step graph").
constexpr int64_t kStepGraphBytes = 8 << 20;
// In the graph a kernel splits from this much work (outer points times work per point; run
// step by step, from 2^15): a task there costs no fork and join, only a claim. The MLP's
// step against the step-by-step run (A/B in one process, 30 rounds of 200 steps): 1.8% faster
// in 27 of 30 rounds splitting from 2^10, 1.3% in 20 from 2^12 (its log-softmax over [64,10]
// splits from 2^10 only).
constexpr int64_t kStepGraphSplitWork = 1 << 10;

// What step si reads and writes, its tasks in the graph, and whether it splits across the pool
// (*pooled); false when the program cannot run as a graph.
bool step_access(const Program& prog, size_t si, std::vector<int>* reads, std::vector<int>* writes,
                 int64_t* tasks, bool* pooled) {
  const Plan& plan = prog.plan;
  const Step& st = plan.steps[si];
  switch (st.kind) {
    case Step::Loop: return false;
    case Step::Kernel: {
      const CompiledKernel& k = prog.kernels[st.kernel];
      for (const Stage& stage : plan.kernels[st.kernel].stages)
        if (stage.out_buf >= 0) writes->push_back(stage.out_buf);
      for (int b : k.bufs)
        if (std::find(writes->begin(), writes->end(), b) == writes->end()) reads->push_back(b);
      *pooled = *pooled || kernel_tasks(k) > 1;
      *tasks = kernel_tasks(k, kStepGraphSplitWork);
      break;
    }
    case Step::MatMul:
      for (const BlasView& v : st.views) reads->push_back(plan.buf_of[v.base]);
      for (const PostOp& po : st.post)
        if (po.binary()) reads->push_back(plan.buf_of[po.view.base]);
      writes->push_back(plan.buf_of[st.node]);
      *tasks = matmul_tasks(prog, st);
      *pooled = *pooled || *tasks > 1;
      break;
    case Step::Native:
      // A host callback runs on the thread that runs the program (an interpreter's lock may
      // be held around it): such programs run step by step, as collectives do.
      if (prog.graph.node(st.node).op == ir::OpKind::PureCallback) return false;
      if (!st.views.empty()) {  // attention: its operands read in place
        for (const BlasView& v : st.views) reads->push_back(plan.buf_of[v.base]);
      } else {
        for (const ir::Value& v : prog.graph.node(st.node).operands)
          reads->push_back(plan.buf_of[v.node]);
      }
      *writes = st.outs;
      *tasks = native_tasks(prog, st);
      *pooled = *pooled || *tasks > 1;
      break;
    case Step::Ref:
      // A collective talks to the other ranks, which must see the same collectives in the
      // same order on the same thread: such programs run step by step.
      if (ir::has_trait(prog.graph.node(st.node).op, ir::kCollective)) return false;
      for (const ir::Value& v : prog.graph.node(st.node).operands)
        reads->push_back(plan.buf_of[v.node]);
      *writes = st.outs;
      *tasks = 1;
      break;
  }
  return true;
}

}  // namespace

int detail::env_switch(std::atomic<int>& value, const char* name) {
  int v = value.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* e = std::getenv(name);
    v = e && std::string(e) == "0" ? 0 : 1;
    int expected = -1;
    if (!value.compare_exchange_strong(expected, v)) v = expected;
  }
  return v;
}

void detail::count_step_graph_run() { g_step_graph_runs.fetch_add(1, std::memory_order_relaxed); }

StepGraphMode step_graph_mode() {
  static_assert(static_cast<int>(StepGraphMode::Off) == 0 &&
                static_cast<int>(StepGraphMode::Auto) == 1);
  return static_cast<StepGraphMode>(detail::env_switch(g_step_graph, "LOOM_STEP_GRAPH"));
}
void set_step_graph(StepGraphMode mode) { g_step_graph.store(static_cast<int>(mode)); }
int64_t step_graph_runs() { return g_step_graph_runs.load(); }

StepGraph StepGraph::make(const Program& prog) {
  const Plan& plan = prog.plan;
  StepGraph g;
  const size_t n = plan.steps.size();
  const StepGraphMode mode = step_graph_mode();
  if (n < 3 || mode == StepGraphMode::Off || ThreadPool::instance().size() < 2) return g;
  int64_t bytes = 0;
  for (const BufferInfo& b : plan.bufs)
    if (b.kind == BufferInfo::Temp || b.kind == BufferInfo::Output) bytes += b.type.nbytes();
  if (bytes > kStepGraphBytes) return g;
  auto root = [&](int b) { return plan.bufs[b].kind == BufferInfo::View ? plan.bufs[b].base : b; };
  std::vector<int> input_buf(plan.bufs.size(), -1);  // parameter position -> buffer
  for (size_t b = 0; b < plan.bufs.size(); ++b)
    if (plan.bufs[b].kind == BufferInfo::Input && plan.bufs[b].index >= 0) {
      if (static_cast<size_t>(plan.bufs[b].index) >= input_buf.size())
        input_buf.resize(plan.bufs[b].index + 1, -1);
      input_buf[plan.bufs[b].index] = static_cast<int>(b);
    }
  std::vector<int> last_writer(plan.bufs.size(), -1);
  std::vector<std::vector<int>> readers(plan.bufs.size());
  std::vector<int> level(n, 0);
  g.succ.assign(n, {});
  g.preds.assign(n, 0);
  g.tasks.assign(n, 0);
  bool wide = false, pooled = false;
  for (size_t si = 0; si < n; ++si) {
    std::vector<int> reads, writes;
    if (!step_access(prog, si, &reads, &writes, &g.tasks[si], &pooled)) return StepGraph{};
    const size_t own = writes.size();
    for (size_t w = 0; w < own; ++w)
      for (int i : plan.donors[writes[w]])
        if (static_cast<size_t>(i) < input_buf.size() && input_buf[i] >= 0)
          writes.push_back(input_buf[i]);
    // Edges: a step follows its reads' last writers and every earlier access to what it writes.
    std::vector<int> before;
    for (int& b : reads) {
      b = root(b);
      if (last_writer[b] >= 0) before.push_back(last_writer[b]);
    }
    for (int& b : writes) {
      b = root(b);
      if (last_writer[b] >= 0) before.push_back(last_writer[b]);
      before.insert(before.end(), readers[b].begin(), readers[b].end());
    }
    std::sort(before.begin(), before.end());
    before.erase(std::unique(before.begin(), before.end()), before.end());
    before.erase(std::remove(before.begin(), before.end(), static_cast<int>(si)), before.end());
    for (int p : before) {
      g.succ[p].push_back(static_cast<int>(si));
      level[si] = std::max(level[si], level[p] + 1);
    }
    g.preds[si] = static_cast<int>(before.size());
    for (int b : reads) readers[b].push_back(static_cast<int>(si));
    for (int b : writes) {
      last_writer[b] = static_cast<int>(si);
      readers[b].clear();
    }
  }
  std::vector<int> per_level(n, 0);
  for (size_t si = 0; si < n; ++si) wide = wide || ++per_level[level[si]] > 1;
  if (!wide || (!pooled && mode != StepGraphMode::Always)) return StepGraph{};
  return g;
}

}  // namespace loom::cpu
