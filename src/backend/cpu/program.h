// A graph compiled for the CPU (its plan, kernels and loops) and the pieces that run its
// steps on a table of raw pointers, one per plan buffer. The top-level executable
// (cpu_backend.cpp) fills the table from pooled Buffers; a region (scan or while body, while
// cond, call body) runs on a *frame*: one block holding its pointer table, its temporaries
// and the scratch of the loops nested in it, set up once per loop run. An iteration then
// rebinds the pointers of the parameters (carry, slice of xs, index) and outputs (next carry,
// slice of ys) and calls the compiled steps: no allocation and no lookups per iteration.
//
// Immutable after compile_program; several threads may run one Program at once (per-run state
// lives in the caller's pointer table and frames).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/codegen.h"
#include "backend/cpu/plan.h"

namespace loom::cpu {

struct LoopProgram;
struct OnednnProduct;  // onednn.h

struct Program {
  ir::Graph graph;  // split_results of the source graph
  Plan plan;
  std::vector<CompiledKernel> kernels;
  std::vector<std::unique_ptr<LoopProgram>> loops;  // per step: its loop (Loop steps only)
  // Per step: its oneDNN primitives (MatMul steps on Library::Onednn only).
  std::vector<std::shared_ptr<const OnednnProduct>> onednn;
  // Frame layout (regions): the pointer table at 0, then each Temp buffer at temp_offset[b]
  // (-1 for parameters and outputs, which the loop binds), then each loop's scratch.
  std::vector<int64_t> temp_offset;
  std::vector<int64_t> loop_offset;  // per step
  int64_t frame_bytes = 0;
  std::vector<int> param_bufs;  // per graph parameter: its buffer

  Program();
  Program(Program&&) noexcept;
  ~Program();
};

// A control-flow node: its regions compiled once, and where its operands and results live in
// the enclosing plan. Scratch (one block per run): the scan's second carry buffers or the
// while's second state, then each region's frame.
struct LoopProgram {
  ir::OpKind op = ir::OpKind::Call;
  std::vector<int> operands, results;  // buffers of the enclosing plan
  std::vector<int64_t> result_bytes;
  std::vector<Program> regions;     // call, scan: body; while: cond, body
  int64_t carries = 0, length = 0;  // scan: carries; while: carried state
  bool reverse = false;
  std::vector<int64_t> slice_bytes;    // scan: per xs, the bytes of one slice
  std::vector<int64_t> y_bytes;        // scan: per ys, the bytes of one step's y
  std::vector<int64_t> carry_offset;   // scratch offset of each carry's second buffer
  std::vector<int64_t> region_offset;  // scratch offset of each region's frame
  int64_t scratch_bytes = 0;
  // A native loop (native_loop.cpp): one generated function runs every trip, its regions'
  // kernels inlined (the regions are planned, not compiled). Called as native(args, 0, length),
  // args = the operands' pointers, the results', then the scratch block.
  KernelFn native = nullptr;
};

// Native loops: a scan or while whose regions are only fused kernels on small data runs as one
// generated function (see can_go_native in loops.cpp for the bound). On unless the
// environment sets LOOM_NATIVE_LOOPS=0; tests switch it with set_native_loops (it affects
// compiles that start later). loop_stats counts the scan and while loops compiled each way.
bool native_loops_enabled();
void set_native_loops(bool on);
struct LoopStats {
  int64_t native = 0, general = 0;
};
LoopStats loop_stats();

// The generated function of a native loop (l's regions planned, l's layout set): from the
// kernel cache, or compiled (native_loop.cpp).
KernelFn compile_native_loop(const LoopProgram& l);

// Splits, plans and compiles g (and, recursively, the regions of its control-flow nodes).
// `region`: lay out a frame for g (a region run by a loop).
Program compile_program(const ir::Graph& g, bool region);
// compile_program in two halves: split and plan (the frame laid out for the temporaries),
// then compile the kernels and nested loops. A native loop (loops.cpp) only plans its regions.
Program plan_program(const ir::Graph& g, bool region);
void compile_steps(Program& p, bool region);

// The loop of Loop step `si` of p (p's plan and kernels are ready); in loops.cpp.
std::unique_ptr<LoopProgram> compile_loop(const Program& p, size_t si);

// Runs kernel k on the buffers `ptr` points to, across the thread pool when it is big.
void run_kernel(const CompiledKernel& k, void* const* ptr);
// Runs a MatMul step of p.
void run_matmul(const Program& p, const Step& st, void* const* ptr);
// Runs a Loop step's loop; `scratch` holds l.scratch_bytes (64-byte aligned).
void run_loop(const LoopProgram& l, void* const* ptr, char* scratch);
// Runs a Native step of p: an indexing op (run_index), attention (run_attention) or a host
// callback (run_callback), across
// the pool when `parallel`, else on this thread.
void run_native(const Program& p, const Step& st, void* const* ptr, bool parallel);
// A Native step as tasks 0..n-1 of the step graph (an indexing op is one task).
int64_t native_tasks(const Program& p, const Step& st);
void run_native_task(const Program& p, const Step& st, void* const* ptr, int64_t t, int64_t tasks);
// An indexing step (index.cpp): across the pool when `parallel` and it is big, else on this
// thread. Throws the reference's ExecError for an index out of range, before writing.
void run_index(const Program& p, const Step& st, void* const* ptr, bool parallel);
// An attention or attention_grad step (attention.cpp) as task t of `tasks` (any order, any
// thread), or across the pool when tasks is 0. attention_tasks: the step graph's split.
void run_attention(const Program& p, const Step& st, void* const* ptr, int64_t t, int64_t tasks);
int64_t attention_tasks(const Program& p, const Step& st);
// A pure_callback step (callback.cpp): the host function on this thread, which is the thread
// that runs the program (step_graph.cpp keeps such programs off the step graph).
void run_callback(const Program& p, const Step& st, void* const* ptr);

// A kernel or MatMul step as tasks 0..n-1 that may run in any order on any threads (the step
// graph (step_graph.h, run by cpu_backend.cpp) schedules them itself; they never use the pool). n
// is fixed by the plan and the pool's size, the same split run_kernel and run_matmul make.
int64_t kernel_tasks(const CompiledKernel& k);
// The same split from `min_work` outer points times work per point (run_kernel: 2^15), and
// task t of `tasks`; a kernel's rows are independent, so any split computes the same values.
int64_t kernel_tasks(const CompiledKernel& k, int64_t min_work);
void run_kernel_task(const CompiledKernel& k, void* const* ptr, int64_t t, int64_t tasks);
int64_t matmul_tasks(const Program& p, const Step& st);
void run_matmul_task(const Program& p, const Step& st, void* const* ptr, int64_t t);
// The step's name in profiles ("k3", "onednn [64,784]x[784,256]", "gather", "ref pow").
std::string step_name(const Program& p, const Step& st);

// The step graph (step_graph.cpp): a small program's steps run as a dependency graph on the
// pool's threads. Auto unless the environment sets LOOM_STEP_GRAPH=0 (Off); Always also takes
// programs none of whose steps would split across the pool (for tests). set_step_graph affects
// executables compiled later; step_graph_runs counts the runs that took the graph.
enum class StepGraphMode { Off, Auto, Always };
StepGraphMode step_graph_mode();
void set_step_graph(StepGraphMode mode);
int64_t step_graph_runs();

// Row runs (cpu_backend.cpp): consecutive products in the same row parts, each reading the
// earlier ones' results only at its own rows (a stack of layers), run step by step as one
// job: thread t runs part t of each in turn, with no join between them. On unless the
// environment sets LOOM_ROW_RUNS=0; set_row_runs affects executables compiled later;
// row_runs_taken counts the runs.
bool row_runs();
void set_row_runs(bool on);
int64_t row_runs_taken();

}  // namespace loom::cpu
