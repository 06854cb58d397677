// The op table of the harness (tests/ops/op_harness_test.cpp): one row per public op of
// loom/trace/ops.h (and the factories of loom/trace/tensor.h). A row gives the op as a
// function of tensors, its cases (input shapes, dtypes and domains), the closed form written
// in double in tests/ops/op_rows.cpp (index math for the structural ops), the IR ops its
// traced graph holds, and whether it is differentiable. The harness checks every row and case
// for: the result's dtype and shape, the IR text round trip and the fingerprint of the parsed
// graph against the graph the tracer built, the closed form on ref, cpu against ref, and the
// VJP against float64 central differences; a row's wide cases (big and vector-width shapes,
// non-contiguous operands, special values) run ref against cpu only.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "loom/loom.h"

namespace loom::optest {

// One input of a case. Values are drawn (seeded, exactly representable in the dtype) from
// [lo, hi], or given.
struct Arg {
  Shape shape;
  std::optional<DType> dtype;  // nullopt: the dtype the row is run at
  double lo = -2, hi = 2;
  std::vector<double> values;  // given values (nan and inf allowed), else drawn
  bool diff = true;            // an input the VJP check differentiates (not indices, targets)
  // A non-contiguous operand: the op sees permute(base, perm) (perm non-empty), or every
  // `step`-th element along dim `step_dim` of a wider base, or dim 0 expanded from size 1 (the
  // values repeat along dim 0). The layout ops stay in the traced graph (no sync in between).
  std::vector<int64_t> perm;
  int64_t step = 1, step_dim = -1;
  bool expand0 = false;
};

// A case: the inputs of one call of the op.
struct Case {
  std::string label;
  std::vector<Arg> args;
  bool floats_only = false;  // given NaN/Inf or fractional values: run at floating dtypes only
  bool fd = false;           // also the case of the VJP check (run at float64)
  std::vector<DType> only;   // non-empty: run at these dtypes only
  double mult = 1;           // wide cases: tolerance multiplier on top of the row's (drift of
                             // reordered sums over many terms)
};

// An input as the closed form sees it: the exact values the tensor holds.
struct HostArg {
  DType dtype;
  Shape shape;
  std::vector<double> v;
};

// The closed form's answer. `scale` (optional, per element) is the magnitude the rounding
// error grows with (sum of |terms| of a reduction); empty: max(1, |want|).
struct Expected {
  DType dtype;
  Shape shape;
  std::vector<double> v;
  std::vector<double> scale;
};

using OpFn = std::function<Tensor(const std::vector<Tensor>&)>;
using ClosedForm = std::function<Expected(const std::vector<HostArg>&)>;
// For ops whose values have no closed form (random draws): checks properties of `got` and
// returns "" or what is wrong.
using Property = std::function<std::string(const std::vector<HostArg>&, const Expected& type,
                                           const std::vector<double>& got)>;

// How ref, cpu and the closed form may differ: Exact (bitwise, NaN meets NaN), or within
// tol(dtype) * mult * max(1, scale) with tol f64 1e-12, f32 2e-6, f16 2e-3, bf16 1.6e-2
// (one rounding of the result); `mult` covers composites and sums of many rounded terms.
struct Row {
  std::string name;                 // the public op, as named in ops.h ("sum", "operator+")
  std::string variant;              // "" or what distinguishes rows of one op ("dims")
  std::vector<std::string> ir_ops;  // ops.def tokens of the traced graph (without parameter)
  OpFn op;
  std::vector<DType> dtypes;
  std::vector<Case> cases;
  // Wide cases: vector-width and large shapes, non-contiguous operands. They run only ref
  // against cpu (and the closed form's type rule); no closed-form values, IR or VJP check.
  std::vector<Case> wide;
  ClosedForm closed;  // type and values (values empty when `property` checks)
  Property property;  // optional
  bool exact = false;
  double mult = 1;
  bool differentiable = false;
  double fd_tol = 1e-6;  // VJP vs central differences (relative, max(1, |fd|))
  std::string label() const { return variant.empty() ? name : name + " " + variant; }
};

const std::vector<Row>& op_rows();

// dtype sets of the rows
extern const std::vector<DType> kFloats, kNumeric, kAll, kF32F64;

}  // namespace loom::optest
