// Internals of the reference backend: the Array value (a typed view of one Buffer), element
// loads and stores with loom's conversion rules, index arithmetic for broadcasting, and the
// kernel table keyed by OpKind that each op family fills in.
//
// Every element is loaded as double (floating dtypes) or int64 (integers and bool), computed
// on, and stored rounded once to the result dtype. Stateless apart from the const kernel
// table; thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "loom/backend/backend.h"
#include "loom/core/buffer.h"
#include "loom/core/shape.h"
#include "loom/ir/graph.h"

namespace loom::detail::ref {

// A contiguous row-major tensor: its type and the Buffer holding it. Cheap to copy (a handle).
struct Array {
  TensorType type;
  Buffer buf;

  int64_t numel() const { return type.numel(); }
  const Shape& shape() const { return type.shape; }
  DType dtype() const { return type.dtype; }

  // Element i as double; integers and bool convert exactly (int64 beyond 2^53 rounds).
  double get_f(int64_t i) const;
  // Element i as int64; floats convert like `convert` (truncate, NaN -> 0, saturate).
  int64_t get_i(int64_t i) const;
  // Stores v rounded to the dtype: floats round to nearest even, ints truncate toward zero
  // with NaN -> 0 and saturation, bool is v != 0.
  void set_f(int64_t i, double v);
  // Stores v: ints wrap (two's complement), floats round to nearest even, bool is v != 0.
  void set_i(int64_t i, int64_t v);
  // Copies element si of src (same dtype) into element di, bit for bit.
  void copy_from(int64_t di, const Array& src, int64_t si);
};

// A zero-filled Array of type t.
Array make_array(const TensorType& t);

// Conversions with loom's documented rules (see docs/ir.md and ref_backend.h).
// float -> int64: truncation toward zero, NaN -> 0, saturation at [lo, hi].
int64_t float_to_int(double v, int64_t lo, int64_t hi);
// The representable range of an integral or bool dtype.
int64_t dtype_lowest(DType t);
int64_t dtype_highest(DType t);
// Wraps v into the range of integral dtype t (two's complement); bool gives v != 0.
int64_t wrap_int(int64_t v, DType t);
// Rounds a double to the nearest-even bfloat16 / float16 in one step. Going through float
// with round-to-nearest would round twice and can miss a tie; round-to-odd in float keeps a
// sticky bit, which makes the second rounding exact.
uint16_t double_to_bf16(double v);
uint16_t double_to_f16(double v);
// Rounds v to the nearest value of floating dtype t and returns it as double.
double round_to_dtype(double v, DType t);

// Maps the linear index of an element of a contiguous tensor of shape `out` to the linear
// index of the element it reads in a tensor of shape `in` that broadcasts to `out` (numpy
// rules: shapes align on the right, an extent of 1 stretches).
class BroadcastIndex {
 public:
  BroadcastIndex(const Shape& out, const Shape& in);
  int64_t operator()(int64_t out_index) const;

 private:
  std::vector<int64_t> out_dims_;    // output extents
  std::vector<int64_t> in_strides_;  // operand strides aligned to out_dims_; 0 where broadcast
};

// The coordinates of linear index `index` in a contiguous tensor of shape s.
std::vector<int64_t> unravel(int64_t index, const Shape& s);
// The linear index of `coords` in a contiguous tensor of shape s.
int64_t ravel(std::span<const int64_t> coords, const Shape& s);
// The node's axis attribute (attrs.i) for an operand of rank `rank`, negative counting from
// the back; the builder has checked it, so a bad axis is an internal error.
int64_t node_axis(const ir::Node& node, int64_t rank);

// A reference kernel: computes `out` (already allocated with the node's type) from the
// operands' values. Throws ExecError for run-time errors (e.g. an index out of range).
using Kernel = void (*)(const ir::Node& node, std::span<const Array> in, Array& out);

// A kernel of an op of several results (ir::several_results: control flow, attention): `regions`
// are the node's regions compiled once by the executable (reference executables, in node.regions
// order); `out` holds one zero-filled array per result, which the kernel fills or replaces by
// another array of the same type.
using RegionKernel = void (*)(const ir::Node& node,
                              std::span<const backend::Executable* const> regions,
                              std::span<const Array> in, std::span<Array> out);

struct KernelTable {
  Kernel kernels[ir::kNumOps] = {};
  RegionKernel region_kernels[ir::kNumOps] = {};
  void set(ir::OpKind op, Kernel k) { kernels[static_cast<int>(op)] = k; }
  void set(ir::OpKind op, RegionKernel k) { region_kernels[static_cast<int>(op)] = k; }
};

// The table, filled once by the family files below; nullptr for an op without a kernel.
const KernelTable& kernel_table();
Kernel find_kernel(ir::OpKind op);
RegionKernel find_region_kernel(ir::OpKind op);

void register_source_kernels(KernelTable& t);        // source.cpp: parameter constant iota
void register_elementwise_kernels(KernelTable& t);   // elementwise.cpp
void register_reduce_kernels(KernelTable& t);        // reduce.cpp
void register_layout_kernels(KernelTable& t);        // layout.cpp
void register_index_kernels(KernelTable& t);         // index.cpp
void register_linalg_kernels(KernelTable& t);        // linalg.cpp
void register_random_kernels(KernelTable& t);        // random.cpp
void register_control_flow_kernels(KernelTable& t);  // control_flow.cpp: call scan while
void register_collective_kernels(KernelTable& t);    // collective.cpp: dist::Communicator
void register_attention_kernels(KernelTable& t);     // attention.cpp: attention, its gradient
void register_callback_kernels(KernelTable& t);      // callback.cpp: pure_callback

}  // namespace loom::detail::ref
