// The CPU backend's plan of one graph: which values get buffers, and the steps that fill
// them (fused loop kernels, BLAS products, reference fallbacks, copies, control-flow loops).
// No LLVM here. The plan of a region (a scan or while body, a call) is made the same way:
// its parameters are its Input buffers and its outputs its Output buffers, which the loop
// binds to the carries, slices and results of each iteration (cpu/program.h).
//
// Fusion model: every value of a kernel is computed at coordinates that are affine functions
// of the kernel's loop variables. Elementwise ops (with broadcasting), converts, permute,
// expand, slice, size-1 reshapes, constants and iota are index arithmetic inside their
// consumer; values that need memory (inputs, outputs, products, reductions, and shared
// subexpressions too costly to recompute) are loaded. A kernel is a loop over an "outer"
// space split across threads, with one or more stages per outer point: a reduction over the
// trailing axes (its result stays in a register for later stages: one kernel for softmax and
// layer_norm) or an elementwise pass over the last axis.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "loom/ir/graph.h"

namespace loom::cpu {

using ir::NodeId;

// c + sum_j a[j] * var_j over the kernel's loop variables.
struct Affine {
  int64_t c = 0;
  std::vector<int64_t> a;
  bool operator==(const Affine&) const = default;
};
using Coords = std::vector<Affine>;

// The coordinates of operand k of node n, given n's coordinates, when n is index arithmetic
// (elementwise, convert, permute, expand, slice, size-1 reshape). Precondition: fusable(n).
Coords operand_coords(const ir::Graph& g, NodeId n, size_t k, const Coords& c);
// Loop variable j of n, as an affine function.
Affine var(size_t j, size_t n);
// The linear element offset offset + sum_d strides[d] * c[d], as an affine function.
Affine linear(const std::vector<int64_t>& strides, const Coords& c, int64_t offset);
// Reshape that only inserts or removes size-1 dims (a pure coordinate map).
bool trivial_reshape(const ir::Graph& g, NodeId n);

struct BufferInfo {
  // View: a contiguous block of another buffer (a slice along a dim with only size-1 dims
  // before it), read through its own pointer: no copy, and kernels reading slices at
  // different offsets share one description (top-level plans only).
  enum Kind { Input, Temp, Output, View };
  Kind kind;
  TensorType type;
  int index = -1;      // parameter position (Input) or output position (Output)
  int base = -1;       // View: the buffer it lies in (never itself a view)
  int64_t offset = 0;  // View: elements from the start of `base`
};

struct Stage {
  bool reduce = false;
  NodeId node = 0;                   // value stored (elementwise) or the reduction node (reduce)
  int out_buf = -1;                  // -1: a reduction kept only in a register (a row scalar)
  int64_t out_offset = 0;            // elements (concat pieces)
  std::vector<int64_t> out_strides;  // of the destination buffer, over the stage's coords
  Shape shape;                   // iteration shape: the value (elementwise) or the reduction input
  std::vector<int64_t> reduced;  // reduce: axes of `shape` reduced (trailing when merged)
  // > 0: a column reduction (the last axis is kept, as in a bias gradient's sum over rows):
  // the kernel's outer space is the other kept dims and blocks of this many columns; each
  // reduced point adds a contiguous block into an accumulator row, so the loop over the
  // columns is innermost and vectorizes (a strided walk per column did not).
  int64_t columns = 0;
};

struct KernelSpec {
  Shape outer;        // the space split across threads
  int64_t chunk = 0;  // > 0: elementwise over a long last axis split in chunks
  std::vector<Stage> stages;
  std::string name;
  // Elements the output pointer moves at run time (a concat piece writes at its offset), so
  // pieces of one shape share one compiled kernel: its description holds no offset.
  int64_t out_shift = 0;
};

// A matmul operand as a strided view of a buffer BLAS can read without a copy.
struct BlasView {
  NodeId base = 0;  // node holding the buffer
  int64_t offset = 0;
  std::vector<int64_t> strides;  // per dim of the operand
  bool trans = false;            // how BLAS reads the matrix (the last two dims)
  int64_t ld = 1;
};

// An elementwise consumer of a product folded into it (a oneDNN post-op): out = f(out) for an
// eltwise kind, out = out (op) operand for a binary kind, the operand read in place through
// `view` (strides over the operand's dims; broadcast dims are size 1).
struct PostOp {
  enum Kind { Relu, Tanh, Sigmoid, Gelu, Linear, Add, Sub, Mul, Div, Max, Min };
  Kind kind = Linear;
  float alpha = 1, beta = 0;  // Linear: alpha * x + beta
  NodeId operand = 0;         // binary kinds
  BlasView view = {};         // binary kinds: how the operand is read (base, offset, strides)
  bool binary() const { return kind >= Add; }
};
const char* post_op_name(PostOp::Kind k);

// The library that runs a product, chosen per shape by choose_library (the table in
// docs/architecture.md, "Products"): oneDNN's matmul primitive (float32 only: Debian's 2.6
// has no f64 matmul, and no bf16 one without AVX512-BF16) or OpenBLAS.
enum class Library { OpenBlas, Onednn };
const char* library_name(Library l);
// m, n, k of one product, `batches` of them; a_trans: A read transposed (a weight gradient's
// dY^T); `epilogue`: elementwise consumers could be folded in as post-ops.
// The table of this CPU (onednn_avx512()), after LOOM_MATMUL / force_library.
Library choose_library(DType dt, int64_t m, int64_t n, int64_t k, int64_t batches, bool a_trans,
                       bool epilogue);
// The table itself, for CPUs where oneDNN runs AVX-512 kernels (avx512) or AVX2 ones.
Library library_table(bool avx512, DType dt, int64_t m, int64_t n, int64_t k, int64_t batches,
                      bool a_trans, bool epilogue);
// Whether oneDNN runs its AVX-512 kernels on this CPU (brgemm; defined in onednn.cpp, one of the
// two files that see oneDNN's headers): the planner's only question to the oneDNN module.
bool onednn_avx512();
// For tests and probes: every float32 product on one library (std::nullopt: the table).
// Also set by LOOM_MATMUL=openblas|onednn, read once. Plans made after the call see it.
void force_library(std::optional<Library> l);

// Kernel: a fused loop kernel. MatMul: a BLAS product. Native: gather, index_select or a
// floating-point index_add (index.cpp), or attention and its gradient (attention.cpp), run
// natively into its planned buffers. Ref: the
// reference kernel of an op the backend lacks (collectives, integer pow and products), which
// returns fresh memory. Loop: a control-flow node (call, scan, while) whose regions are
// compiled as nested plans and run natively (cpu/program.h).
struct Step {
  enum Kind { Kernel, MatMul, Ref, Loop, Native };
  Kind kind;
  int kernel = -1;                   // Kernel
  NodeId node = 0;                   // MatMul, Ref, Loop, Native
  std::vector<int> release;          // temp buffers whose last use is this step
  std::vector<int> outs;             // Ref, Loop, Native: the node's result buffers, in order
  std::vector<BlasView> views = {};  // MatMul: how BLAS reads each operand (no walks at run time)
  Library lib = Library::OpenBlas;   // MatMul
  // MatMul on oneDNN: consumers folded in, in order; the step writes the buffer of the last
  // one, `out` (buf_of[node] is that buffer too), and no kernel computes them.
  std::vector<PostOp> post = {};
  NodeId out = 0;
  // Native attention: views holds how each operand is read, out_views where each result is
  // written (base: the node whose buffer, outs[k], holds it), both strided over its dims.
  std::vector<BlasView> out_views = {};
};

struct Plan {
  std::vector<int> buf_of;  // per node: its buffer, or -1 when it is computed inline
  std::vector<BufferInfo> bufs;
  std::vector<KernelSpec> kernels;
  std::vector<Step> steps;
  std::vector<int> output_bufs;  // per graph output
  int64_t blas_calls = 0;        // MatMul steps
  // Per buffer: the parameter positions whose donated memory may hold this output (its one
  // writer runs after the input's last read, or reads the input in place, element for
  // element, at the addresses it writes).
  std::vector<std::vector<int>> donors;
};

// One line per MatMul step of the plan: shape, library, post-ops (LOOM_DEBUG=2 prints them).
std::string describe_products(const ir::Graph& g, const Plan& plan);

// How the CPU backend runs an op of ops.def with result dtype `dt`: computed inline in a
// fused loop kernel, a BLAS product, a native loop (regions), a native step (indexing,
// attention), or the
// reference kernel as a declared fallback. Every op must be listed (library_choice.cpp's switch has
// no default and builds with -Werror=switch, so a new op in ops.def does not build until it is
// declared here).
enum class Lowering { Fused, Blas, Loop, Native, Fallback };
Lowering lowering(ir::OpKind op, DType dt);
// Whether index.cpp runs indexing op `op` with result dtype dt (gather and index_select of
// any dtype, index_add of float32 and float64).
bool native_index(ir::OpKind op, DType dt);
// Ops the code generator computes inline (the rest run as Native, Loop or reference steps).
bool codegen_supports(const ir::Graph& g, NodeId n);
// Fills v when BLAS can read `operand` in place (a transposed matrix is a transpose flag).
bool blas_view(const ir::Graph& g, const std::vector<bool>& has_buf, NodeId operand, BlasView* v);

// Control-flow nodes (regions, several results) run as one Loop step that fills every
// result (its buffers are allocated like any other output). The planner and the code
// generator name values by node id, so split_results rewrites a graph first: each result
// k >= 1 of a multi-result node R gets a stand-in node right after R (R's op, result k's
// type, no operands, never run), and every use of R#k becomes a use of the stand-in.
// results[R] lists the nodes holding R's results in order (R first); it is empty for
// single-result nodes. It also widens half-precision products (bfloat16, float16) to
// float32 ones between Convert nodes, which the planner fuses like any other elementwise op.
ir::Graph split_results(const ir::Graph& g, std::vector<std::vector<NodeId>>* results);

// `results` as split_results gives it (empty: no multi-result nodes). `allow_views`: slices
// that are contiguous blocks of a buffer become View buffers.
Plan make_plan(const ir::Graph& g, const std::vector<std::vector<NodeId>>& results = {},
               bool allow_views = false);

}  // namespace loom::cpu
