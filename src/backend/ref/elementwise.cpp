// Reference kernels of the elementwise ops: unary math, convert, binary arithmetic (with
// numpy broadcasting), logic, comparisons and where. Each element is computed by the ops'
// one scalar definition (loom/ir/scalar.h): floats in double, integers in wrapping int64.
#include <cmath>
#include <limits>

#include "backend/ref/ref_impl.h"
#include "loom/core/error.h"
#include "loom/ir/scalar.h"

namespace loom::detail::ref {

namespace {

using ir::OpKind;

void unary_kernel(const ir::Node& node, std::span<const Array> in, Array& out) {
  const Array& x = in[0];
  const bool floating = is_floating(x.dtype());
  for (int64_t e = 0; e < out.numel(); ++e) {
    if (floating) {
      out.set_f(e, ir::scalar_float(node.op, x.get_f(e)));
    } else {
      out.set_i(e, ir::scalar_int(node.op, x.get_i(e)));
    }
  }
}

// Floats go through set_f (truncate / saturate / != 0 / round); ints and bool through set_i
// (wrap / != 0 / round), which is the whole conversion table of docs/ir.md.
void convert_kernel(const ir::Node&, std::span<const Array> in, Array& out) {
  const Array& x = in[0];
  const bool floating = is_floating(x.dtype());
  for (int64_t e = 0; e < out.numel(); ++e) {
    if (floating) {
      out.set_f(e, x.get_f(e));
    } else {
      out.set_i(e, x.get_i(e));
    }
  }
}

void binary_kernel(const ir::Node& node, std::span<const Array> in, Array& out) {
  const Array &a = in[0], &b = in[1];
  const BroadcastIndex ia(out.shape(), a.shape()), ib(out.shape(), b.shape());
  const bool floating = is_floating(a.dtype());
  for (int64_t e = 0; e < out.numel(); ++e) {
    if (floating) {
      out.set_f(e, ir::scalar_float(node.op, a.get_f(ia(e)), b.get_f(ib(e))));
    } else {
      out.set_i(e, ir::scalar_int(node.op, a.get_i(ia(e)), b.get_i(ib(e))));
    }
  }
}

void compare_kernel(const ir::Node& node, std::span<const Array> in, Array& out) {
  const Array &a = in[0], &b = in[1];
  const BroadcastIndex ia(out.shape(), a.shape()), ib(out.shape(), b.shape());
  const bool floating = is_floating(a.dtype());
  for (int64_t e = 0; e < out.numel(); ++e) {
    const bool r = floating ? ir::scalar_compare(node.op, a.get_f(ia(e)), b.get_f(ib(e)))
                            : ir::scalar_compare(node.op, a.get_i(ia(e)), b.get_i(ib(e)));
    out.set_i(e, r);
  }
}

void where_kernel(const ir::Node&, std::span<const Array> in, Array& out) {
  const Array &cond = in[0], &a = in[1], &b = in[2];
  const BroadcastIndex ic(out.shape(), cond.shape()), ia(out.shape(), a.shape()),
      ib(out.shape(), b.shape());
  for (int64_t e = 0; e < out.numel(); ++e) {
    if (cond.get_i(ic(e)) != 0) {
      out.copy_from(e, a, ia(e));
    } else {
      out.copy_from(e, b, ib(e));
    }
  }
}

}  // namespace

// Every elementwise op of ops.def, by its traits: a new op needs a scalar definition, not an
// entry here.
void register_elementwise_kernels(KernelTable& t) {
  for (int k = 0; k < ir::kNumOps; ++k) {
    const auto op = static_cast<OpKind>(k);
    if (!ir::has_trait(op, ir::kElementwise)) continue;
    if (op == OpKind::Convert) {
      t.set(op, convert_kernel);
    } else if (op == OpKind::Where) {
      t.set(op, where_kernel);
    } else if (ir::info(op).arity == 1) {
      t.set(op, unary_kernel);
    } else if (ir::has_trait(op, ir::kCompare)) {
      t.set(op, compare_kernel);
    } else {
      t.set(op, binary_kernel);
    }
  }
}

}  // namespace loom::detail::ref
