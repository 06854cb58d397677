// The CPU backend's Executable: runs the program's steps over pooled buffers. Control-flow
// nodes are Loop steps whose regions were compiled with the plan (cpu/program.h, loops.cpp).
#include "loom/backend/cpu_backend.h"

#include <cblas.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <optional>
#include <string>

#include "backend/cpu/jit.h"
#include "backend/cpu/onednn.h"
#include "backend/cpu/program.h"
#include "backend/cpu/step_graph.h"
#include "backend/cpu/thread_pool.h"
#include "loom/backend/ref_backend.h"
#include "loom/core/config.h"
#include "loom/core/error.h"
#include "loom/core/profile.h"

namespace loom::cpu {

namespace {
std::atomic<int> g_row_runs{-1};  // 0 or 1, or -1: LOOM_ROW_RUNS not read yet
std::atomic<int64_t> g_row_runs_taken{0};
}  // namespace

bool row_runs() { return detail::env_switch(g_row_runs, "LOOM_ROW_RUNS") == 1; }
void set_row_runs(bool on) { g_row_runs.store(on ? 1 : 0); }
int64_t row_runs_taken() { return g_row_runs_taken.load(); }

}  // namespace loom::cpu

namespace loom::backend {

namespace {

using cpu::Plan;
using cpu::Step;

// LOOM_DEBUG=2: the plan's kernels and their stages, then one line per product (library, post-ops,
// oneDNN's implementation and parts).
void log_plan(const cpu::Program& prog) {
  const Plan& plan = prog.plan;
  std::fprintf(stderr, "[loom] cpu plan: %zu steps, %zu kernels, %lld products\n",
               plan.steps.size(), plan.kernels.size(), static_cast<long long>(plan.blas_calls));
  for (const auto& k : plan.kernels) {
    // Each stage: E (elementwise) or R (a reduction, with its column block when it has one),
    // the op and type of the value it computes.
    std::string stages;
    for (const cpu::Stage& s : k.stages) {
      const ir::Node& n = prog.graph.node(s.node);
      stages += s.reduce ? " R " : " E ";
      stages += std::string(ir::op_name(n.op)) + " " + n.type.str();
      if (s.columns > 0) stages += " columns " + std::to_string(s.columns);
      stages += ";";
    }
    std::fprintf(stderr, "[loom]   %s outer%s chunk %lld, %zu stages:%s\n", k.name.c_str(),
                 k.outer.str().c_str(), static_cast<long long>(k.chunk), k.stages.size(),
                 stages.c_str());
  }
  const std::string products = cpu::describe_products(prog.graph, plan);
  size_t at = 0;
  for (size_t si = 0; si < plan.steps.size(); ++si) {
    if (plan.steps[si].kind != Step::MatMul) continue;
    const size_t end = products.find('\n', at);
    std::fprintf(stderr, "[loom]   %.*s", static_cast<int>(end - at), products.data() + at);
    if (prog.onednn[si])
      std::fprintf(stderr, " (%s)", cpu::onednn_describe(*prog.onednn[si]).c_str());
    std::fprintf(stderr, "\n");
    at = end + 1;
  }
}

// Thread-safety: immutable after construction; each run keeps its buffers and pointer table
// (and each loop its scratch) to itself.
class CpuExecutable final : public Executable {
 public:
  explicit CpuExecutable(const ir::Graph& g) : prog_(compile_counted(g, &info_)) {
    const Plan& plan = prog_.plan;
    if (config().debug >= 2) log_plan(prog_);
    first_use_.assign(plan.steps.size(), {});
    std::vector<bool> seen(plan.bufs.size(), false);
    auto touch = [&](size_t step, int b) {
      if (b < 0 || seen[b] || plan.bufs[b].kind == cpu::BufferInfo::Input ||
          plan.bufs[b].kind == cpu::BufferInfo::View)
        return;
      seen[b] = true;
      first_use_[step].push_back(b);
    };
    for (size_t si = 0; si < plan.steps.size(); ++si) {
      const Step& st = plan.steps[si];
      switch (st.kind) {
        case Step::Kernel:
          for (int b : prog_.kernels[st.kernel].bufs) touch(si, b);
          break;
        case Step::Ref:
          for (int b : st.outs) seen[b] = true;  // the reference kernel returns fresh buffers
          break;
        case Step::Loop:
        case Step::Native:
          for (int b : st.outs) touch(si, b);
          break;
        case Step::MatMul: touch(si, plan.buf_of[st.node]); break;
      }
    }
    for (size_t b = 0; b < plan.bufs.size(); ++b)  // outputs nobody writes (0-size): allocate
      if (!seen[b] && plan.bufs[b].kind == cpu::BufferInfo::Output) unwritten_.push_back(b);
    views_of_.assign(plan.bufs.size(), {});
    for (size_t b = 0; b < plan.bufs.size(); ++b)
      if (plan.bufs[b].kind == cpu::BufferInfo::View)
        views_of_[plan.bufs[b].base].push_back(static_cast<int>(b));
    graph_ = cpu::StepGraph::make(prog_);
    if (graph_.empty()) {
      plan_row_runs();
      plan_index_in_place();
    }
  }

  // Step by step, a float index_add whose base is a temporary it reads last (the zeros an
  // embedding's gradient scatters into) takes the base's memory for its result and adds in
  // place, instead of copying the base first (a [50000,512] table: 100 MB read and written).
  // The step graph keeps the copy: there a step's buffers are its ordering.
  void plan_index_in_place() {
    const Plan& plan = prog_.plan;
    index_base_.assign(plan.steps.size(), -1);
    for (size_t si = 0; si < plan.steps.size(); ++si) {
      const Step& st = plan.steps[si];
      if (st.kind != Step::Native || prog_.graph.node(st.node).op != ir::OpKind::IndexAdd) continue;
      const int base = plan.buf_of[prog_.graph.node(st.node).operands[0].node], out = st.outs[0];
      const cpu::BufferInfo::Kind ok = plan.bufs[out].kind;
      if (plan.bufs[base].kind != cpu::BufferInfo::Temp || !views_of_[base].empty() ||
          std::find(st.release.begin(), st.release.end(), base) == st.release.end() ||
          (ok != cpu::BufferInfo::Temp && ok != cpu::BufferInfo::Output))
        continue;
      std::vector<int>& first = first_use_[si];
      const auto at = std::find(first.begin(), first.end(), out);
      if (at == first.end()) continue;
      first.erase(at);
      index_base_[si] = base;
    }
  }

  // Counts the modules compile_program generates or loads into *info.
  static cpu::Program compile_counted(const ir::Graph& g, CodeInfo* info) {
    struct Restore {
      CodeInfo* saved = cpu::t_code_info;
      ~Restore() { cpu::t_code_info = saved; }
    } restore;
    cpu::t_code_info = info;
    return cpu::compile_program(g, /*region=*/false);
  }

  CodeInfo code_info() const override { return info_; }

  std::vector<Buffer> run(std::span<const Buffer> inputs) const override { return run(inputs, {}); }

  std::vector<Buffer> run(std::span<const Buffer> inputs,
                          std::span<const uint8_t> donated) const override {
    std::optional<cpu::FirstRunScope> first;
    if (!ran_.exchange(true, std::memory_order_relaxed)) first.emplace();
    const Plan& plan = prog_.plan;
    check_inputs("cpu", prog_.graph, inputs);
    std::vector<uint8_t> free_donor(inputs.size(), 0);
    for (size_t i = 0; i < donated.size() && i < inputs.size(); ++i) free_donor[i] = donated[i];
    // bufs owns the memory; ptr is the table the steps read (kept in step with bufs).
    std::vector<Buffer> bufs(plan.bufs.size());
    std::vector<void*> ptr(plan.bufs.size(), nullptr);
    auto bind = [&](size_t b, Buffer buf) {
      bufs[b] = std::move(buf);
      ptr[b] = bufs[b].data();
      for (int v : views_of_[b])  // views point into their base once it has memory
        ptr[v] = static_cast<char*>(ptr[b]) +
                 plan.bufs[v].offset * static_cast<int64_t>(itemsize(plan.bufs[v].type.dtype));
    };
    for (size_t b = 0; b < plan.bufs.size(); ++b)
      if (plan.bufs[b].kind == cpu::BufferInfo::Input) bind(b, inputs[plan.bufs[b].index]);
    for (size_t b : unwritten_) bind(b, Buffer::allocate(plan.bufs[b].type.nbytes()));
    if (!graph_.empty()) {
      for (size_t si = 0; si < plan.steps.size(); ++si)
        for (int b : first_use_[si]) bind(b, fresh_or_donated(b, inputs, free_donor));
      run_graph(bufs, ptr, bind);
    } else {
      for (size_t si = 0; si < plan.steps.size(); ++si) {
        if (row_run_end_.size() > si && row_run_end_[si] > si) {
          run_rows(si, row_run_end_[si], bufs, ptr, bind);
          si = row_run_end_[si];
          continue;
        }
        for (int b : first_use_[si]) bind(b, fresh_or_donated(b, inputs, free_donor));
        const Step& st = plan.steps[si];
        switch (st.kind) {
          case Step::Kernel: cpu::run_kernel(prog_.kernels[st.kernel], ptr.data()); break;
          case Step::MatMul: cpu::run_matmul(prog_, st, ptr.data()); break;
          case Step::Ref: {
            profile::Scope ps("kernel", [&] { return cpu::step_name(prog_, st); });
            bind(st.outs[0], run_ref(st, bufs));
            break;
          }
          case Step::Native: {
            profile::Scope ps("kernel", [&] { return cpu::step_name(prog_, st); });
            if (index_base_[si] >= 0) bind(st.outs[0], bufs[index_base_[si]]);
            cpu::run_native(prog_, st, ptr.data(), /*parallel=*/true);
            break;
          }
          case Step::Loop: {
            const cpu::LoopProgram& loop = *prog_.loops[si];
            profile::Scope ps("kernel", [&] { return cpu::step_name(prog_, st); });
            Buffer scratch =
                Buffer::allocate_uninitialized(static_cast<size_t>(loop.scratch_bytes));
            cpu::run_loop(loop, ptr.data(), static_cast<char*>(scratch.data()));
            break;
          }
        }
        for (int b : st.release) {  // back to the pool for later steps
          bufs[b] = Buffer();
          ptr[b] = nullptr;
        }
      }
    }
    std::vector<Buffer> out;
    out.reserve(plan.output_bufs.size());
    for (int b : plan.output_bufs) out.push_back(bufs[b]);
    return out;
  }

  // Top level only: a loop counts as one kernel, whatever its regions run.
  int64_t num_kernels() const override {
    return static_cast<int64_t>(prog_.plan.steps.size()) - prog_.plan.blas_calls;
  }
  int64_t num_library_calls() const override { return prog_.plan.blas_calls; }

 private:
  // An output takes a donated input's memory when the plan allows it; else pooled memory.
  Buffer fresh_or_donated(int b, std::span<const Buffer> inputs,
                          std::vector<uint8_t>& free_donor) const {
    const Plan& plan = prog_.plan;
    for (int i : plan.donors[b]) {
      if (free_donor[i] && inputs[i].nbytes() == static_cast<size_t>(plan.bufs[b].type.nbytes())) {
        free_donor[i] = 0;
        return inputs[i];
      }
    }
    return Buffer::allocate_uninitialized(static_cast<size_t>(plan.bufs[b].type.nbytes()));
  }

  // Runs every step through the step graph (all buffers bound): each pool thread takes the
  // next task of the lowest-numbered ready step until all steps are done or one fails (its
  // exception is rethrown here once every thread has stopped). Over 80 lines: its state as a
  // struct with methods cost 0.6 us of sync_hit's 6.5 (docs/architecture.md, "Measurements").
  template <class Bind>
  void run_graph(const std::vector<Buffer>& bufs, std::vector<void*>& ptr, const Bind& bind) const {
    const Plan& plan = prog_.plan;
    const size_t n = plan.steps.size();
    std::unique_ptr<std::atomic<int>[]> waiting(new std::atomic<int>[n]);
    std::unique_ptr<std::atomic<int64_t>[]> left(new std::atomic<int64_t>[n]);
    std::vector<int64_t> next(n, 0);
    std::vector<uint64_t> claimed(n, 0);  // steps of few tasks: the tasks taken, as bits
    std::vector<int> ready;               // ascending step numbers, under `lock`
    ready.reserve(n);
    std::atomic_flag lock = ATOMIC_FLAG_INIT;
    std::atomic<size_t> done{0};
    std::atomic<bool> failed{false};
    std::atomic<int> queued{0};  // ready.size(): idle threads spin on it, not on the lock
    std::exception_ptr error;
    auto locked = [&](auto&& f) {
      while (lock.test_and_set(std::memory_order_acquire)) _mm_pause();
      f();
      lock.clear(std::memory_order_release);
    };
    // A step whose inputs are all there: queued, or done at once when it has no task.
    auto arrive = [&](int s, std::vector<int>& zero) {
      if (graph_.tasks[s] == 0) {
        zero.push_back(s);
        return;
      }
      locked([&] {
        ready.insert(std::upper_bound(ready.begin(), ready.end(), s), s);
        queued.store(static_cast<int>(ready.size()), std::memory_order_release);
      });
    };
    auto finish = [&](int s0) {  // s0 and any task-less steps it releases
      std::vector<int> zero{s0};
      while (!zero.empty()) {
        const int s = zero.back();
        zero.pop_back();
        for (int u : graph_.succ[s])
          if (waiting[u].fetch_sub(1, std::memory_order_acq_rel) == 1) arrive(u, zero);
        done.fetch_add(1, std::memory_order_acq_rel);
      }
    };
    std::vector<int> zero;
    for (size_t s = 0; s < n; ++s) {
      waiting[s].store(graph_.preds[s], std::memory_order_relaxed);
      left[s].store(graph_.tasks[s], std::memory_order_relaxed);
    }
    for (size_t s = 0; s < n; ++s)
      if (graph_.preds[s] == 0) arrive(static_cast<int>(s), zero);
    for (int s : zero) finish(s);
    const bool profiling = profile::enabled();
    auto run_task = [&](int s, int64_t t) {
      const Step& st = plan.steps[s];
      const double t0 = profiling ? profile::now_us() : 0;
      switch (st.kind) {
        case Step::Kernel:
          cpu::run_kernel_task(prog_.kernels[st.kernel], ptr.data(), t, graph_.tasks[s]);
          break;
        case Step::MatMul: cpu::run_matmul_task(prog_, st, ptr.data(), t); break;
        case Step::Ref: bind(st.outs[0], run_ref(st, bufs)); break;
        case Step::Native: cpu::run_native_task(prog_, st, ptr.data(), t, graph_.tasks[s]); break;
        case Step::Loop: break;  // not in a step graph
      }
      if (profiling)
        profile::record(
            st.kind == Step::MatMul ? "matmul" : "kernel", cpu::step_name(prog_, st), t0,
            profile::now_us(),
            "\"task\": " + std::to_string(t) + ", \"tasks\": " + std::to_string(graph_.tasks[s]));
    };
    // Steps of at most one task per thread take their tasks by thread (below).
    const int64_t by_thread = std::min<int64_t>(cpu::ThreadPool::instance().size(), 64);
    auto participant = [&](int) {
      const int me = cpu::ThreadPool::thread_index();
      while (done.load(std::memory_order_acquire) < n && !failed.load(std::memory_order_acquire)) {
        if (queued.load(std::memory_order_acquire) == 0) {
          _mm_pause();
          continue;
        }
        int s = -1;
        int64_t t = 0;
        locked([&] {
          if (ready.empty()) return;
          s = ready.front();
          const int64_t tasks = graph_.tasks[s];
          if (tasks <= by_thread) {
            // Task i goes to thread i while free, so a product's part i runs on one core step after
            // step and run after run, beside its operands' block in that core's cache (the MLP's
            // weight half i) (docs/architecture.md, "Measurements": task i on thread i).
            const uint64_t all = tasks == 64 ? ~uint64_t{0} : (uint64_t{1} << tasks) - 1;
            const uint64_t free = all & ~claimed[s];
            t = me < tasks && (free >> me & 1) ? me : std::countr_zero(free);
            claimed[s] |= uint64_t{1} << t;
            if (claimed[s] == all) {
              ready.erase(ready.begin());
              queued.store(static_cast<int>(ready.size()), std::memory_order_release);
            }
            return;
          }
          t = next[s]++;
          if (next[s] == tasks) {
            ready.erase(ready.begin());
            queued.store(static_cast<int>(ready.size()), std::memory_order_release);
          }
        });
        if (s < 0) {
          _mm_pause();
          continue;
        }
        try {
          run_task(s, t);
        } catch (...) {
          locked([&] {
            if (!error) error = std::current_exception();
          });
          failed.store(true, std::memory_order_release);
          return;
        }
        if (left[s].fetch_sub(1, std::memory_order_acq_rel) == 1) finish(s);
      }
    };
    cpu::detail::count_step_graph_run();
    cpu::ThreadPool& pool = cpu::ThreadPool::instance();
    pool.run(pool.size(), participant);
    if (error) std::rethrow_exception(error);
  }

  // Row runs: consecutive oneDNN products in the same row parts (one a thread), each reading
  // earlier outputs only at its rows and writing a fresh buffer, run as one job, so the slower part
  // no longer sets each layer's time (docs/architecture.md, "Measurements": row runs).
  void plan_row_runs() {
    const Plan& plan = prog_.plan;
    const size_t n = plan.steps.size();
    const int64_t pool = cpu::ThreadPool::instance().size();
    if (!cpu::row_runs() || pool < 2) return;
    row_run_end_.assign(n, 0);
    auto bounds_of = [&](size_t si) -> std::vector<int64_t> {
      const Step& st = plan.steps[si];
      if (st.kind != Step::MatMul || st.lib != cpu::Library::Onednn || !prog_.onednn[si]) return {};
      const int ob = plan.buf_of[st.node];
      if (plan.bufs[ob].kind == cpu::BufferInfo::View || !views_of_[ob].empty() ||
          !plan.donors[ob].empty())
        return {};
      std::vector<int64_t> b = cpu::onednn_row_bounds(*prog_.onednn[si]);
      return static_cast<int64_t>(b.size()) == pool + 1 ? b : std::vector<int64_t>{};
    };
    for (size_t first = 0; first < n;) {
      const std::vector<int64_t> bounds = bounds_of(first);
      if (bounds.empty()) {
        ++first;
        continue;
      }
      std::vector<int> written = {plan.buf_of[plan.steps[first].node]};
      size_t last = first;
      while (last + 1 < n && bounds_of(last + 1) == bounds) {
        const cpu::OnednnProduct& next = *prog_.onednn[last + 1];
        bool rows = true;
        for (int b : written)
          rows = rows && cpu::onednn_row_read(next, b, plan.bufs[b].type.shape.numel()) !=
                             cpu::RowRead::Other;
        if (!rows) break;
        written.push_back(plan.buf_of[plan.steps[++last].node]);
      }
      if (last > first) row_run_end_[first] = last;
      first = last + 1;
    }
  }

  // Steps [first, last], a row run: pool thread t runs part t of each in turn. The first thread
  // to reach a step binds its fresh buffers; a step's last reader releases the buffers it was
  // the last use of once every part of it is done, so memory a faster thread binds later
  // never holds what a slower one still reads. A thread runs at most kRowRunLead steps ahead
  // of the slowest, which bounds the buffers bound at once when one thread stalls.
  static constexpr size_t kRowRunLead = 4;

  // What the parts of one row run share.
  struct RowRun {
    RowRun(size_t f, size_t l, int n, bool bounded)
        : first(f),
          last(l),
          tasks(n),
          lead(bounded),
          finished(new std::atomic<int>[l - f + 1]),
          bound(f) {
      for (size_t s = 0; s <= l - f; ++s) finished[s].store(0, std::memory_order_relaxed);
    }
    size_t first, last;
    int tasks;
    bool lead;  // the lead is bounded (false when run() runs every part inline, one by one)
    std::unique_ptr<std::atomic<int>[]> finished;  // per step: its parts done
    std::atomic<size_t> bound;                     // steps before this one have their buffers
    std::atomic<bool> failed{false};
    std::mutex mu;             // binds, releases, `error`
    std::exception_ptr error;  // the first part's exception
  };

  template <class Bind>
  void run_rows(size_t first, size_t last, std::vector<Buffer>& bufs, std::vector<void*>& ptr,
                const Bind& bind) const {
    RowRun run(first, last, static_cast<int>(cpu::matmul_tasks(prog_, prog_.plan.steps[first])),
               !cpu::ThreadPool::runs_inline_here());
    cpu::g_row_runs_taken.fetch_add(1, std::memory_order_relaxed);
    cpu::ThreadPool::instance().run(run.tasks, [&](int t) {
      try {
        run_row_part(run, t, bufs, ptr, bind);
      } catch (...) {
        std::lock_guard<std::mutex> lock(run.mu);
        if (!run.error) run.error = std::current_exception();
        run.failed.store(true, std::memory_order_release);
      }
    });
    if (run.error) std::rethrow_exception(run.error);
  }

  // Part t of every step of a row run.
  template <class Bind>
  void run_row_part(RowRun& run, int t, std::vector<Buffer>& bufs, std::vector<void*>& ptr,
                    const Bind& bind) const {
    const Plan& plan = prog_.plan;
    const bool profiling = profile::enabled();
    for (size_t s = run.first; s <= run.last; ++s) {
      const Step& st = plan.steps[s];
      if (run.lead && s >= run.first + kRowRunLead)
        while (run.finished[s - kRowRunLead - run.first].load(std::memory_order_acquire) <
               run.tasks) {
          if (run.failed.load(std::memory_order_acquire)) return;  // the waited-for part threw
          _mm_pause();
        }
      if (run.bound.load(std::memory_order_acquire) <= s) {
        std::lock_guard<std::mutex> lock(run.mu);
        if (run.bound.load(std::memory_order_relaxed) <= s) {
          for (int b : first_use_[s])  // no donors (plan_row_runs): fresh memory
            bind(b,
                 Buffer::allocate_uninitialized(static_cast<size_t>(plan.bufs[b].type.nbytes())));
          run.bound.store(s + 1, std::memory_order_release);
        }
      }
      const double t0 = profiling ? profile::now_us() : 0;
      cpu::run_matmul_task(prog_, st, ptr.data(), t);
      if (profiling)
        profile::record("matmul", cpu::step_name(prog_, st), t0, profile::now_us(),
                        "\"task\": " + std::to_string(t) + ", \"row run\": true");
      if (run.finished[s - run.first].fetch_add(1, std::memory_order_acq_rel) + 1 == run.tasks) {
        std::lock_guard<std::mutex> lock(run.mu);
        for (int b : st.release) {
          bufs[b] = Buffer();
          ptr[b] = nullptr;
        }
      }
    }
  }

  // The reference fallback (a collective, an integer pow): hands back the kernel's fresh buffer.
  Buffer run_ref(const Step& st, const std::vector<Buffer>& bufs) const {
    std::vector<Buffer> operands;
    for (const ir::Value& v : prog_.graph.node(st.node).operands)
      operands.push_back(bufs[prog_.plan.buf_of[v.node]]);
    return ref_eval_node(prog_.graph, st.node, operands);
  }

  CodeInfo info_;  // before prog_: compile_counted fills it while prog_ is built
  cpu::Program prog_;
  std::vector<std::vector<int>> first_use_;
  std::vector<size_t> unwritten_;
  std::vector<std::vector<int>> views_of_;  // per buffer: the View buffers lying in it
  cpu::StepGraph graph_;                    // empty: the steps run one after another
  std::vector<size_t> row_run_end_;  // per step: the last step of the row run it starts (> it)
  std::vector<int> index_base_;      // per step: the base an index_add adds into in place, or -1
  mutable std::atomic<bool> ran_{false};  // a run has started: later ones are not first runs
};

class CpuBackend final : public Backend {
 public:
  CpuBackend() {
    // Products are split across loom's own pool; OpenBLAS threads would compete with it.
    openblas_set_num_threads(1);
    // The JIT's target machines take about 1 ms to build: build them while the program
    // traces its first graph.
    cpu::Jit::start();
  }
  std::string_view name() const override { return "cpu"; }
  std::shared_ptr<const Executable> compile(const ir::Graph& g,
                                            const CompileOptions&) const override {
    return std::make_shared<CpuExecutable>(g);
  }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace loom::backend
