// Reference kernels of the reductions: reduce_sum, reduce_max, reduce_min over a set of axes,
// and argmax along one axis. Accumulation runs in input order, in double for floats and in
// wrapping int64 for integers and bool.
#include <cmath>
#include <limits>
#include <vector>

#include "backend/ref/ref_impl.h"
#include "loom/core/error.h"

namespace loom::detail::ref {

namespace {

using ir::OpKind;

// For each element of x, the linear index of the output element it reduces into. The output
// is laid out like x with the reduced axes set to extent 1, with or without keepdim.
std::vector<int64_t> output_indices(const Shape& x, std::span<const int64_t> axes) {
  Shape kept = x;
  for (int64_t a : axes) {
    LOOM_ASSERT(a >= 0 && a < x.rank());
    kept[static_cast<size_t>(a)] = 1;
  }
  std::vector<int64_t> map(static_cast<size_t>(x.numel()));
  for (int64_t e = 0; e < x.numel(); ++e) {
    std::vector<int64_t> c = unravel(e, x);
    for (int64_t a : axes) c[static_cast<size_t>(a)] = 0;
    map[static_cast<size_t>(e)] = ravel(c, kept);
  }
  return map;
}

void reduce_float(OpKind op, const Array& x, std::span<const int64_t> map, Array& out) {
  const double init = op == OpKind::ReduceSum   ? 0.0
                      : op == OpKind::ReduceMax ? -std::numeric_limits<double>::infinity()
                                                : std::numeric_limits<double>::infinity();
  std::vector<double> acc(static_cast<size_t>(out.numel()), init);
  for (int64_t e = 0; e < x.numel(); ++e) {
    double& a = acc[static_cast<size_t>(map[static_cast<size_t>(e)])];
    const double v = x.get_f(e);
    if (op == OpKind::ReduceSum) {
      a += v;
    } else if (std::isnan(a)) {
      continue;  // NaN is sticky: max/min propagate it
    } else if (std::isnan(v) || (op == OpKind::ReduceMax ? v > a : v < a)) {
      a = v;
    }
  }
  for (int64_t o = 0; o < out.numel(); ++o) out.set_f(o, acc[static_cast<size_t>(o)]);
}

void reduce_int(OpKind op, const Array& x, std::span<const int64_t> map, Array& out) {
  const int64_t init = op == OpKind::ReduceSum   ? 0
                       : op == OpKind::ReduceMax ? dtype_lowest(x.dtype())
                                                 : dtype_highest(x.dtype());
  std::vector<int64_t> acc(static_cast<size_t>(out.numel()), init);
  for (int64_t e = 0; e < x.numel(); ++e) {
    int64_t& a = acc[static_cast<size_t>(map[static_cast<size_t>(e)])];
    const int64_t v = x.get_i(e);
    if (op == OpKind::ReduceSum) {
      a = static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(v));
    } else if (op == OpKind::ReduceMax ? v > a : v < a) {
      a = v;
    }
  }
  for (int64_t o = 0; o < out.numel(); ++o) out.set_i(o, acc[static_cast<size_t>(o)]);
}

// An empty axis gives 0 for sum, -inf/+inf (floats) or lowest/highest (ints) for max/min.
void reduce_kernel(const ir::Node& node, std::span<const Array> in, Array& out) {
  const Array& x = in[0];
  const std::span<const int64_t> axes(node.attrs.ints.begin(), node.attrs.ints.end());
  const std::vector<int64_t> map = output_indices(x.shape(), axes);
  if (is_floating(x.dtype())) {
    reduce_float(node.op, x, map, out);
  } else {
    reduce_int(node.op, x, map, out);
  }
}

// Is v a strictly better argmax candidate than best? NaN counts as maximal and the first NaN
// wins, so nothing beats a NaN.
bool beats(const Array& x, int64_t v, int64_t best) {
  if (is_floating(x.dtype())) {
    const double fv = x.get_f(v), fb = x.get_f(best);
    if (std::isnan(fb)) return false;
    return std::isnan(fv) || fv > fb;
  }
  return x.get_i(v) > x.get_i(best);
}

void argmax_kernel(const ir::Node& node, std::span<const Array> in, Array& out) {
  const Array& x = in[0];
  const Shape& s = x.shape();
  if (s.empty()) {  // a 0-d tensor is its own maximum, at index 0
    out.set_i(0, 0);
    return;
  }
  const int64_t axis = node_axis(node, s.rank());
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= s[d];
  for (int64_t d = axis + 1; d < s.rank(); ++d) inner *= s[d];
  const int64_t n = s[axis];
  if (n == 0 && outer * inner != 0)
    throw ExecError("argmax",
                    detail::str_cat("[argmax] cannot take the argmax of ", x.type, " over axis ",
                                    axis, ": expected a non-empty axis, got extent 0"));
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      int64_t best = 0;
      for (int64_t k = 1; k < n; ++k) {
        if (beats(x, (o * n + k) * inner + i, (o * n + best) * inner + i)) best = k;
      }
      out.set_i(o * inner + i, best);
    }
  }
}

}  // namespace

void register_reduce_kernels(KernelTable& t) {
  t.set(OpKind::ReduceSum, reduce_kernel);
  t.set(OpKind::ReduceMax, reduce_kernel);
  t.set(OpKind::ReduceMin, reduce_kernel);
  t.set(OpKind::ArgMax, argmax_kernel);
}

}  // namespace loom::detail::ref
