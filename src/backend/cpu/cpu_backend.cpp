// The CPU backend's Executable: runs the program's steps over pooled buffers. Control-flow
// nodes are Loop steps whose regions were compiled with the plan (cpu/program.h, loops.cpp).
#include "loom/backend/cpu_backend.h"

#include <cblas.h>

#include <cstdio>

#include "backend/cpu/jit.h"
#include "backend/cpu/onednn.h"
#include "backend/cpu/program.h"
#include "loom/backend/ref_backend.h"
#include "loom/core/config.h"
#include "loom/core/error.h"
#include "loom/core/profile.h"

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
    for (size_t si = 0; si < plan.steps.size(); ++si) {
      for (int b : first_use_[si]) bind(b, fresh_or_donated(b, inputs, free_donor));
      const Step& st = plan.steps[si];
      switch (st.kind) {
        case Step::Kernel: cpu::run_kernel(prog_.kernels[st.kernel], ptr.data()); break;
        case Step::MatMul: cpu::run_matmul(prog_, st, ptr.data()); break;
        case Step::Ref: {
          profile::Scope ps("kernel", [&] {
            return "ref " + std::string(ir::op_name(prog_.graph.node(st.node).op));
          });
          Buffer r = run_ref(st, bufs);
          bind(st.outs[0], std::move(r));
          break;
        }
        case Step::Loop: {
          const cpu::LoopProgram& loop = *prog_.loops[si];
          profile::Scope ps("kernel", [&] { return std::string(ir::op_name(loop.op)) + " loop"; });
          Buffer scratch = Buffer::allocate_uninitialized(static_cast<size_t>(loop.scratch_bytes));
          cpu::run_loop(loop, ptr.data(), static_cast<char*>(scratch.data()));
          break;
        }
      }
      for (int b : st.release) {  // back to the pool for later steps
        bufs[b] = Buffer();
        ptr[b] = nullptr;
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

  // The reference fallback (gather, index_select): hands back the kernel's fresh buffer.
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
