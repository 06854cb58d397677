// The CPU backend's Executable: runs the plan's steps over pooled buffers.
#include "loom/backend/cpu_backend.h"

#include <cblas.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>

#include "backend/cpu/codegen.h"
#include "backend/cpu/plan.h"
#include "backend/cpu/thread_pool.h"
#include "loom/backend/ref_backend.h"
#include "loom/core/config.h"
#include "loom/core/error.h"

namespace loom::backend {

namespace {

using cpu::Plan;
using cpu::Step;

// Outer points below which a kernel runs on one thread: splitting costs a wake-up.
constexpr int64_t kParallelWork = 1 << 15;

class CpuExecutable final : public Executable {
 public:
  explicit CpuExecutable(const ir::Graph& g) {
    std::vector<std::vector<ir::NodeId>> results;
    graph_ = cpu::split_results(g, &results);
    plan_ = cpu::make_plan(graph_, results);
    kernels_ = cpu::compile_kernels(graph_, plan_);
    compile_region_fallbacks();
    if (config().debug >= 2) {
      std::fprintf(stderr, "[loom] cpu plan: %zu steps, %zu kernels, %lld products\n",
                   plan_.steps.size(), plan_.kernels.size(), static_cast<long long>(plan_.blas_calls));
      for (const auto& k : plan_.kernels)
        std::fprintf(stderr, "[loom]   %s outer%s chunk %lld, %zu stages\n", k.name.c_str(),
                     k.outer.str().c_str(), static_cast<long long>(k.chunk), k.stages.size());
    }
    first_use_.assign(plan_.steps.size(), {});
    std::vector<bool> seen(plan_.bufs.size(), false);
    auto touch = [&](size_t step, int b) {
      if (b < 0 || seen[b] || plan_.bufs[b].kind == cpu::BufferInfo::Input) return;
      seen[b] = true;
      first_use_[step].push_back(b);
    };
    for (size_t si = 0; si < plan_.steps.size(); ++si) {
      const Step& st = plan_.steps[si];
      if (st.kind == Step::Kernel) {
        for (int b : kernels_[st.kernel].bufs) touch(si, b);
      } else if (st.kind == Step::Ref) {
        for (int b : st.outs) seen[b] = true;  // the reference kernel returns fresh buffers
      } else {
        touch(si, plan_.buf_of[st.node]);
      }
    }
    for (size_t b = 0; b < plan_.bufs.size(); ++b)  // outputs nobody writes (0-size): allocate
      if (!seen[b] && plan_.bufs[b].kind == cpu::BufferInfo::Output) unwritten_.push_back(b);
  }

  std::vector<Buffer> run(std::span<const Buffer> inputs) const override { return run(inputs, {}); }

  std::vector<Buffer> run(std::span<const Buffer> inputs,
                          std::span<const uint8_t> donated) const override {
    check_inputs("cpu", graph_, inputs);
    std::vector<uint8_t> free_donor(inputs.size(), 0);
    for (size_t i = 0; i < donated.size() && i < inputs.size(); ++i) free_donor[i] = donated[i];
    std::vector<Buffer> bufs(plan_.bufs.size());
    for (size_t b = 0; b < plan_.bufs.size(); ++b)
      if (plan_.bufs[b].kind == cpu::BufferInfo::Input) bufs[b] = inputs[plan_.bufs[b].index];
    for (size_t b : unwritten_) bufs[b] = Buffer::allocate(plan_.bufs[b].type.nbytes());
    for (size_t si = 0; si < plan_.steps.size(); ++si) {
      for (int b : first_use_[si]) bufs[b] = fresh_or_donated(b, inputs, free_donor);
      const Step& st = plan_.steps[si];
      switch (st.kind) {
        case Step::Kernel: run_kernel(kernels_[st.kernel], bufs); break;
        case Step::MatMul: run_matmul(st, bufs); break;
        case Step::Ref: run_ref(st, bufs); break;
      }
      for (int b : st.release) bufs[b] = Buffer();  // back to the pool for later steps
    }
    std::vector<Buffer> out;
    for (int b : plan_.output_bufs) out.push_back(bufs[b]);
    return out;
  }

  int64_t num_kernels() const override {
    return static_cast<int64_t>(plan_.steps.size()) - plan_.blas_calls;
  }
  int64_t num_library_calls() const override { return plan_.blas_calls; }

 private:
  // An output takes a donated input's memory when the plan allows it; else pooled memory.
  Buffer fresh_or_donated(int b, std::span<const Buffer> inputs,
                          std::vector<uint8_t>& free_donor) const {
    for (int i : plan_.donors[b]) {
      if (free_donor[i] && inputs[i].nbytes() == static_cast<size_t>(plan_.bufs[b].type.nbytes())) {
        free_donor[i] = 0;
        return inputs[i];
      }
    }
    return Buffer::allocate_uninitialized(static_cast<size_t>(plan_.bufs[b].type.nbytes()));
  }

  void run_kernel(const cpu::CompiledKernel& k, std::vector<Buffer>& bufs) const {
    if (k.outer == 0) return;
    std::vector<void*> args(k.bufs.size());
    for (size_t j = 0; j < k.bufs.size(); ++j) args[j] = bufs[k.bufs[j]].data();
    auto& pool = cpu::ThreadPool::instance();
    int64_t tasks = std::min<int64_t>(pool.size(), k.outer);
    if (tasks < 2 || k.outer * k.work < kParallelWork) {
      k.fn(args.data(), 0, k.outer);
      return;
    }
    pool.run(static_cast<int>(tasks), [&](int t) {
      int64_t lo = k.outer * t / tasks, hi = k.outer * (t + 1) / tasks;
      if (lo < hi) k.fn(args.data(), lo, hi);
    });
  }

  // The reference fallback: gather and index_select, and (until loops are lowered natively)
  // every control-flow node, which runs its regions through its ref executable.
  void run_ref(const Step& st, std::vector<Buffer>& bufs) const {
    const ir::NodeId id = st.node;
    std::vector<Buffer> operands;
    for (const ir::Value& v : graph_.node(id).operands)
      operands.push_back(bufs[plan_.buf_of[v.node]]);
    auto region = region_fallbacks_.find(id);
    std::vector<Buffer> r = region != region_fallbacks_.end()
                                ? region->second->run(operands)
                                : std::vector<Buffer>{ref_eval_node(graph_, id, operands)};
    LOOM_ASSERT(r.size() == st.outs.size());
    for (size_t k = 0; k < r.size(); ++k) bufs[st.outs[k]] = std::move(r[k]);  // fresh buffers
  }

  // Control-flow nodes compile to one-node reference executables, once per executable.
  void compile_region_fallbacks() {
    for (const Step& st : plan_.steps) {
      if (st.kind == Step::Ref && ir::has_trait(graph_.node(st.node).op, ir::kRegion))
        region_fallbacks_.emplace(st.node, ref_compile_node(graph_, st.node));
    }
  }

  void run_matmul(const Step& st, std::vector<Buffer>& bufs) const;

  ir::Graph graph_;
  Plan plan_;
  std::vector<cpu::CompiledKernel> kernels_;
  std::map<ir::NodeId, std::shared_ptr<const Executable>> region_fallbacks_;
  std::vector<std::vector<int>> first_use_;
  std::vector<size_t> unwritten_;
};

// One operand of a product: base pointer, batch strides aligned to the output's batch dims,
// and BLAS layout of its matrix.
struct GemmOperand {
  const char* base = nullptr;
  std::vector<int64_t> batch_strides;
  bool trans = false;
  int64_t ld = 1;
};

GemmOperand gemm_operand(const ir::Graph& g, const Plan& plan, const std::vector<Buffer>& bufs,
                         ir::NodeId operand, const cpu::BlasView& v, size_t out_batch_rank,
                         int64_t elem) {
  const Shape& s = g.node(operand).type.shape;
  size_t r = s.size();
  GemmOperand o;
  o.base = static_cast<const char*>(bufs[plan.buf_of[v.base]].data()) + v.offset * elem;
  o.batch_strides.assign(out_batch_rank, 0);
  for (size_t d = 0; d + 2 < r; ++d) {
    size_t od = out_batch_rank - (r - 2) + d;
    o.batch_strides[od] = s[d] == 1 ? 0 : v.strides[d];
  }
  o.trans = v.trans;
  o.ld = v.ld;
  return o;
}

void CpuExecutable::run_matmul(const Step& st, std::vector<Buffer>& bufs) const {
  const ir::NodeId id = st.node;
  const ir::Node& n = graph_.node(id);
  const Shape& os = n.type.shape;
  size_t br = os.size() - 2;
  int64_t m = os[br], nn = os[br + 1];
  int64_t k = graph_.type(n.operands[0]).shape.back();
  bool f64 = n.type.dtype == DType::Float64;
  int64_t elem = f64 ? 8 : 4;
  char* c = static_cast<char*>(bufs[plan_.buf_of[id]].data());
  if (m == 0 || nn == 0) return;
  if (k == 0) {
    std::memset(c, 0, static_cast<size_t>(n.type.nbytes()));
    return;
  }
  GemmOperand a = gemm_operand(graph_, plan_, bufs, n.operands[0].node, st.views[0], br, elem);
  GemmOperand b = gemm_operand(graph_, plan_, bufs, n.operands[1].node, st.views[1], br, elem);
  Shape batch(os.begin(), os.begin() + static_cast<long>(br));
  int64_t nb = batch.numel();
  // A batch of products that share B, with A's rows evenly spaced across batches, is one
  // tall product: B is packed once and the row split has more rows to share.
  bool b_shared = std::all_of(b.batch_strides.begin(), b.batch_strides.end(),
                              [](int64_t s) { return s == 0; });
  bool a_even = !a.trans;
  for (size_t d = br, span = 1; a_even && d-- > 0;) {
    a_even = batch[d] == 1 || a.batch_strides[d] == static_cast<int64_t>(span) * m * a.ld;
    span *= static_cast<size_t>(batch[d]);
  }
  if (nb > 1 && b_shared && a_even) {
    m *= nb;
    nb = 1;
    batch = Shape{};
    br = 0;
    a.batch_strides.clear();
    b.batch_strides.clear();
  }
  auto& pool = cpu::ThreadPool::instance();
  // Split batches across threads, or the rows of each product when there are few batches.
  // Two parts per thread: the pool hands them out as threads free up, which evens out a
  // core slowed by a neighbour (a fixed half each waits for the slower one).
  int64_t row_parts = nb >= 2 * pool.size()
                          ? 1
                          : std::min<int64_t>(2 * pool.size(), std::max<int64_t>(1, m / 64));
  int64_t tasks = nb * row_parts;
  auto task = [&](int t) {
    int64_t bi = t / row_parts, part = t % row_parts;
    int64_t r0 = m * part / row_parts, r1 = m * (part + 1) / row_parts;
    if (r0 == r1) return;
    int64_t oa = 0, ob = 0, rest = bi;
    for (size_t d = br; d-- > 0;) {
      int64_t coord = rest % batch[d];
      rest /= batch[d];
      oa += coord * a.batch_strides[d];
      ob += coord * b.batch_strides[d];
    }
    int64_t a_row = a.trans ? 1 : a.ld;  // elements between consecutive rows of A
    const char* pa = a.base + (oa + r0 * a_row) * elem;
    const char* pb = b.base + ob * elem;
    char* pc = c + (bi * m * nn + r0 * nn) * elem;
    auto ta = a.trans ? CblasTrans : CblasNoTrans, tb = b.trans ? CblasTrans : CblasNoTrans;
    if (f64) {
      cblas_dgemm(CblasRowMajor, ta, tb, r1 - r0, nn, k, 1.0, reinterpret_cast<const double*>(pa),
                  a.ld, reinterpret_cast<const double*>(pb), b.ld, 0.0,
                  reinterpret_cast<double*>(pc), nn);
    } else {
      cblas_sgemm(CblasRowMajor, ta, tb, r1 - r0, nn, k, 1.0f, reinterpret_cast<const float*>(pa),
                  a.ld, reinterpret_cast<const float*>(pb), b.ld, 0.0f,
                  reinterpret_cast<float*>(pc), nn);
    }
  };
  if (tasks == 1) task(0);
  else pool.run(static_cast<int>(tasks), task);
}

class CpuBackend final : public Backend {
 public:
  CpuBackend() {
    // Products are split across loom's own pool; OpenBLAS threads would compete with it.
    openblas_set_num_threads(1);
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
