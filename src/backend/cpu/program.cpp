// Compiling a graph into a Program, and the steps every program shares: kernels and BLAS
// products on raw buffer pointers.
#include "backend/cpu/program.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <thread>

#include "backend/cpu/onednn.h"
#include "backend/cpu/thread_pool.h"
#include "loom/core/error.h"
#include "loom/core/profile.h"

namespace loom::cpu {

Program::Program() = default;
Program::Program(Program&&) noexcept = default;
Program::~Program() = default;

namespace {

// Outer points below which a kernel runs on one thread: splitting costs a wake-up.
constexpr int64_t kParallelWork = 1 << 15;
// Kernels with up to this many buffers build their argument table on the stack.
constexpr size_t kInlineArgs = 16;

int64_t align64(int64_t n) { return (n + 63) / 64 * 64; }

void lay_out_frame(Program& p) {
  const size_t nb = p.plan.bufs.size();
  int64_t at = align64(static_cast<int64_t>(nb * sizeof(void*)));
  p.temp_offset.assign(nb, -1);
  for (size_t b = 0; b < nb; ++b) {
    if (p.plan.bufs[b].kind != BufferInfo::Temp) continue;
    p.temp_offset[b] = at;
    at += align64(p.plan.bufs[b].type.nbytes());
  }
  for (size_t si = 0; si < p.loops.size(); ++si) {
    if (!p.loops[si]) continue;
    p.loop_offset[si] = at;
    at += align64(p.loops[si]->scratch_bytes);
  }
  p.frame_bytes = at;
}

}  // namespace

Program plan_program(const ir::Graph& g, bool region) {
  Program p;
  std::vector<std::vector<ir::NodeId>> results;
  {
    profile::Scope ps("compile", "plan");
    p.graph = split_results(g, &results);
    p.plan = make_plan(p.graph, results, /*allow_views=*/!region);
  }
  p.loops.resize(p.plan.steps.size());
  p.onednn.resize(p.plan.steps.size());
  p.loop_offset.assign(p.plan.steps.size(), -1);
  for (ir::NodeId id : p.graph.params()) p.param_bufs.push_back(p.plan.buf_of[id]);
  if (region) lay_out_frame(p);
  return p;
}

void compile_steps(Program& p, bool region) {
  std::vector<size_t> loops;
  for (size_t si = 0; si < p.plan.steps.size(); ++si)
    if (p.plan.steps[si].kind == Step::Loop) loops.push_back(si);
  bool products = false;
  for (const Step& st : p.plan.steps)
    products = products || (st.kind == Step::MatMul && st.lib == Library::Onednn);
  // Loop regions and oneDNN products (primitives, epilogues) compile on another thread beside the
  // kernels, two modules at once a side (docs/architecture.md, "Measurements": compile_others); it
  // writes only p.loops, p.onednn and its own module counts; a jthread, so errors join it.
  auto compile_others = [&] {
    for (size_t si : loops) p.loops[si] = compile_loop(p, si);
    for (size_t si = 0; si < p.plan.steps.size(); ++si) {
      const Step& st = p.plan.steps[si];
      if (st.kind == Step::MatMul && st.lib == Library::Onednn) {
        profile::Scope ps("compile", "onednn");
        p.onednn[si] = make_onednn_product(p.graph, p.plan, st);
      }
    }
  };
  std::exception_ptr other_error;
  backend::CodeInfo other_info;
  std::jthread other;
  if ((!loops.empty() || products) && ThreadPool::instance().size() > 1) {
    other = std::jthread([&, info = t_code_info ? &other_info : nullptr] {
      t_code_info = info;
      try {
        compile_others();
      } catch (...) {
        other_error = std::current_exception();
      }
    });
  }
  p.kernels = compile_kernels(p.graph, p.plan);
  if (other.joinable()) {
    other.join();
    if (other_error) std::rethrow_exception(other_error);
    if (t_code_info) {
      t_code_info->modules_compiled += other_info.modules_compiled;
      t_code_info->modules_loaded += other_info.modules_loaded;
    }
  } else {
    compile_others();
  }
  if (region) lay_out_frame(p);  // again: now with the nested loops' scratch
}

Program compile_program(const ir::Graph& g, bool region) {
  Program p = plan_program(g, region);
  compile_steps(p, region);
  return p;
}

namespace {

struct KernelJob {
  const CompiledKernel* k;
  void* const* args;
  int64_t tasks;
  void operator()(int t) const {
    int64_t lo = k->outer * t / tasks, hi = k->outer * (t + 1) / tasks;
    if (lo < hi) k->code->get()(args, lo, hi);
  }
};

}  // namespace

namespace {

// The profiled path of run_kernel and run_matmul: one event per task, on the thread that
// runs it.
template <class Job>
void run_profiled(const char* cat, const std::string& name, int64_t tasks, const Job& job) {
  auto one = [&](int t) {
    double t0 = profile::now_us();
    job(t);
    profile::record(cat, name, t0, profile::now_us(),
                    "\"task\": " + std::to_string(t) + ", \"tasks\": " + std::to_string(tasks));
  };
  if (tasks == 1)
    one(0);
  else
    ThreadPool::instance().run(static_cast<int>(tasks), one);
}

}  // namespace

namespace {

// A kernel's argument table, on the stack up to kInlineArgs buffers.
class KernelArgs {
 public:
  KernelArgs(const CompiledKernel& k, void* const* ptr) {
    const size_t n = k.bufs.size();
    if (n > kInlineArgs) {
      heap_.resize(n);
      args_ = heap_.data();
    }
    for (size_t j = 0; j < n; ++j) args_[j] = ptr[k.bufs[j]];
    if (k.out_arg >= 0) args_[k.out_arg] = static_cast<char*>(args_[k.out_arg]) + k.out_shift_bytes;
  }
  KernelArgs(const KernelArgs&) = delete;  // args_ may point into inline_
  KernelArgs& operator=(const KernelArgs&) = delete;
  void* const* get() const { return args_; }

 private:
  void* inline_[kInlineArgs];
  std::vector<void*> heap_;
  void** args_ = inline_;
};

}  // namespace

int64_t kernel_tasks(const CompiledKernel& k, int64_t min_work) {
  if (k.outer == 0) return 0;
  int64_t tasks = std::min<int64_t>(ThreadPool::instance().size(), k.outer);
  return tasks < 2 || k.outer * k.work < min_work ? 1 : tasks;
}
int64_t kernel_tasks(const CompiledKernel& k) { return kernel_tasks(k, kParallelWork); }

// Times the kernel's runs toward its tier-up while it has not tiered up (codegen.h).
class TierUpClock {
 public:
  explicit TierUpClock(const CompiledKernel& k) : code_(k.code), tier_(k.code->tiering()) {
    if (tier_) t0_ = std::chrono::steady_clock::now();
  }
  ~TierUpClock() {
    if (tier_)
      code_->ran(tier_, std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::steady_clock::now() - t0_)
                            .count());
  }
  TierUpClock(const TierUpClock&) = delete;
  TierUpClock& operator=(const TierUpClock&) = delete;

 private:
  KernelCode* code_;
  TierUp* tier_;
  std::chrono::steady_clock::time_point t0_;
};

void run_kernel_task(const CompiledKernel& k, void* const* ptr, int64_t t, int64_t tasks) {
  TierUpClock clock(k);
  KernelArgs args(k, ptr);
  KernelJob{&k, args.get(), tasks}(static_cast<int>(t));
}

void run_kernel(const CompiledKernel& k, void* const* ptr) {
  if (k.outer == 0) return;
  TierUpClock clock(k);
  KernelArgs held(k, ptr);
  void* const* args = held.get();
  auto& pool = ThreadPool::instance();
  const int64_t tasks = kernel_tasks(k);
  KernelJob job{&k, args, tasks};
  if (profile::enabled()) [[unlikely]] {
    run_profiled("kernel", k.name, tasks, job);
    return;
  }
  if (tasks == 1) {
    k.code->get()(args, 0, k.outer);
    return;
  }
  // One captured pointer: std::function keeps it inline (no allocation in a loop body).
  pool.run(static_cast<int>(tasks), [j = &job](int t) { (*j)(t); });
}

namespace {

// One operand of a product: base pointer, batch strides aligned to the output's batch dims,
// and BLAS layout of its matrix.
struct GemmOperand {
  const char* base = nullptr;
  SmallVector<int64_t, 8> batch_strides;  // inline up to rank 10: no allocation
  bool trans = false;
  int64_t ld = 1;
};

GemmOperand gemm_operand(const Program& p, void* const* ptr, ir::NodeId operand, const BlasView& v,
                         size_t out_batch_rank, int64_t elem) {
  const Shape& s = p.graph.node(operand).type.shape;
  size_t r = s.size();
  GemmOperand o;
  if (ptr) o.base = static_cast<const char*>(ptr[p.plan.buf_of[v.base]]) + v.offset * elem;
  o.batch_strides.resize(out_batch_rank, 0);
  for (size_t d = 0; d + 2 < r; ++d) {
    size_t od = out_batch_rank - (r - 2) + d;
    o.batch_strides[od] = s[d] == 1 ? 0 : v.strides[d];
  }
  o.trans = v.trans;
  o.ld = v.ld;
  return o;
}

// The products of one MatMul step, split into tasks over batches and row ranges.
struct GemmJob {
  GemmOperand a, b;
  char* c;
  const int64_t* batch;
  size_t br;
  int64_t m, nn, k, elem, row_parts;
  bool f64;
  int64_t col_parts = 1;  // > 1: one product split by columns (few rows, one batch)
  size_t zero_bytes = 0;  // > 0: k = 0, the one task zeroes C

  void columns(int t) const {
    int64_t c0 = nn * t / col_parts, c1 = nn * (t + 1) / col_parts;
    if (c0 == c1) return;
    const char* pb = b.base + (b.trans ? c0 * b.ld : c0) * elem;  // column c0 of B
    auto ta = a.trans ? CblasTrans : CblasNoTrans, tb = b.trans ? CblasTrans : CblasNoTrans;
    if (f64) {
      cblas_dgemm(
          CblasRowMajor, ta, tb, m, c1 - c0, k, 1.0, reinterpret_cast<const double*>(a.base), a.ld,
          reinterpret_cast<const double*>(pb), b.ld, 0.0, reinterpret_cast<double*>(c) + c0, nn);
    } else {
      cblas_sgemm(CblasRowMajor, ta, tb, m, c1 - c0, k, 1.0f,
                  reinterpret_cast<const float*>(a.base), a.ld, reinterpret_cast<const float*>(pb),
                  b.ld, 0.0f, reinterpret_cast<float*>(c) + c0, nn);
    }
  }

  void operator()(int t) const {
    if (zero_bytes > 0) {
      std::memset(c, 0, zero_bytes);
      return;
    }
    if (col_parts > 1) return columns(t);
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
  }
};

}  // namespace

namespace {

// An OpenBLAS MatMul step as its tasks; `ptr` may be null (the count only). 0 tasks: nothing to
// compute (an empty output).
GemmJob gemm_job(const Program& p, const Step& st, void* const* ptr, int64_t* tasks) {
  const ir::NodeId id = st.node;
  const ir::Node& n = p.graph.node(id);
  const Shape& os = n.type.shape;
  size_t br = os.size() - 2;
  int64_t m = os[br], nn = os[br + 1];
  int64_t k = p.graph.type(n.operands[0]).shape.back();
  bool f64 = n.type.dtype == DType::Float64;
  int64_t elem = f64 ? 8 : 4;
  char* c = ptr ? static_cast<char*>(ptr[p.plan.buf_of[id]]) : nullptr;
  GemmJob job{{}, {}, c, os.data(), br, m, nn, k, elem, 1, f64};
  *tasks = os.numel() == 0 ? 0 : 1;  // any zero extent, batch dims included
  if (*tasks == 0) return job;
  if (k == 0) {
    job.zero_bytes = static_cast<size_t>(n.type.nbytes());
    return job;
  }
  GemmOperand a = gemm_operand(p, ptr, n.operands[0].node, st.views[0], br, elem);
  GemmOperand b = gemm_operand(p, ptr, n.operands[1].node, st.views[1], br, elem);
  int64_t nb = 1;
  for (size_t d = 0; d < br; ++d) nb *= os[d];
  // A batch of products that share B, with A's rows evenly spaced across batches, is one
  // tall product: B is packed once and the row split has more rows to share.
  bool b_shared =
      std::all_of(b.batch_strides.begin(), b.batch_strides.end(), [](int64_t s) { return s == 0; });
  bool a_even = !a.trans;
  for (size_t d = br, span = 1; a_even && d-- > 0;) {
    a_even = os[d] == 1 || a.batch_strides[d] == static_cast<int64_t>(span) * m * a.ld;
    span *= static_cast<size_t>(os[d]);
  }
  if (nb > 1 && b_shared && a_even) {
    m *= nb;
    nb = 1;
    br = 0;
  }
  const int64_t pool = ThreadPool::instance().size();
  // Split batches across threads, or the rows of each product when there are few batches.
  // Two parts per thread: the pool hands them out as threads free up, which evens out a
  // core slowed by a neighbour (a fixed half each waits for the slower one).
  // Small products (an MLP's) get one part per thread: every part packs its own operands.
  const int64_t per_thread = m * nn * k < (int64_t{1} << 26) ? 1 : 2;
  // Parts of 64 rows, or of 32 from 2^17 multiply-adds: the MLP's [64,256]x[256,10] logits as
  // two halves took 3.4-3.9 us a half against 6.2 us whole (LOOM_PROFILE medians, Zen 5).
  const int64_t min_rows = m * nn * k >= (int64_t{1} << 17) ? 32 : 64;
  const int64_t row_parts =
      nb >= 2 * pool ? 1 : std::min<int64_t>(per_thread * pool, std::max<int64_t>(1, m / min_rows));
  job = GemmJob{a, b, c, os.data(), br, m, nn, k, elem, row_parts, f64};
  *tasks = nb * row_parts;
  // Few rows (a small batch against a weight): split the columns instead, when the product is
  // big enough to pay for waking the pool.
  if (nb == 1 && row_parts == 1 && nn >= 128 && m * nn * k >= (int64_t{1} << 20)) {
    job.col_parts = std::min<int64_t>(per_thread * pool, nn / 64);
    *tasks = job.col_parts;
  }
  return job;
}

std::string gemm_name(const Program& p, const Step& st) {
  const ir::Node& n = p.graph.node(st.node);
  const Shape& os = n.type.shape;
  const size_t br = os.size() - 2;
  int64_t nb = 1;
  for (size_t d = 0; d < br; ++d) nb *= os[d];
  const int64_t k = p.graph.type(n.operands[0]).shape.back();
  return detail::str_cat(n.type.dtype == DType::Float64 ? "dgemm " : "sgemm ", nb, "x[", os[br],
                         ",", k, "]x[", k, ",", os[br + 1], "]");
}

const OnednnProduct& onednn_of(const Program& p, const Step& st) {
  const size_t si = static_cast<size_t>(&st - p.plan.steps.data());
  LOOM_ASSERT(si < p.onednn.size() && p.onednn[si]);
  return *p.onednn[si];
}

}  // namespace

int64_t matmul_tasks(const Program& p, const Step& st) {
  if (st.lib == Library::Onednn) return onednn_tasks(onednn_of(p, st));
  int64_t tasks = 0;
  gemm_job(p, st, nullptr, &tasks);
  return tasks;
}

void run_matmul_task(const Program& p, const Step& st, void* const* ptr, int64_t t) {
  if (st.lib == Library::Onednn) return run_onednn_task(onednn_of(p, st), ptr, t);
  int64_t tasks = 0;
  gemm_job(p, st, ptr, &tasks)(static_cast<int>(t));
}

namespace {
bool attention_step(const Program& p, const Step& st) {
  const ir::OpKind op = p.graph.node(st.node).op;
  return op == ir::OpKind::Attention || op == ir::OpKind::AttentionGrad;
}
}  // namespace

void run_native(const Program& p, const Step& st, void* const* ptr, bool parallel) {
  if (p.graph.node(st.node).op == ir::OpKind::PureCallback) return run_callback(p, st, ptr);
  if (!attention_step(p, st)) return run_index(p, st, ptr, parallel);
  if (parallel) return run_attention(p, st, ptr, 0, 0);
  run_attention(p, st, ptr, 0, 1);
}
int64_t native_tasks(const Program& p, const Step& st) {
  return attention_step(p, st) ? attention_tasks(p, st) : 1;
}
void run_native_task(const Program& p, const Step& st, void* const* ptr, int64_t t, int64_t tasks) {
  if (p.graph.node(st.node).op == ir::OpKind::PureCallback) return run_callback(p, st, ptr);
  if (!attention_step(p, st)) return run_index(p, st, ptr, /*parallel=*/false);
  run_attention(p, st, ptr, t, tasks);
}

std::string step_name(const Program& p, const Step& st) {
  switch (st.kind) {
    case Step::Kernel: return p.kernels[st.kernel].name;
    case Step::MatMul:
      return st.lib == Library::Onednn ? onednn_name(onednn_of(p, st)) : gemm_name(p, st);
    case Step::Ref: return "ref " + std::string(ir::op_name(p.graph.node(st.node).op));
    case Step::Native: return std::string(ir::op_name(p.graph.node(st.node).op));
    case Step::Loop: break;
  }
  return std::string(ir::op_name(p.graph.node(st.node).op)) + " loop";
}

void run_matmul(const Program& p, const Step& st, void* const* ptr) {
  if (st.lib == Library::Onednn) {
    run_onednn(onednn_of(p, st), ptr);
    return;
  }
  int64_t tasks = 0;
  GemmJob job = gemm_job(p, st, ptr, &tasks);
  if (tasks == 0) return;
  if (profile::enabled()) [[unlikely]] {
    run_profiled("matmul", gemm_name(p, st), tasks, job);
    return;
  }
  if (tasks == 1)
    job(0);
  else
    ThreadPool::instance().run(static_cast<int>(tasks), [j = &job](int t) { (*j)(t); });
}

}  // namespace loom::cpu
