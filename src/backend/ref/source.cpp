// Reference kernels of the source ops (no operands): parameter, constant, iota.
#include <cmath>

#include "backend/ref/ref_impl.h"
#include "loom/core/error.h"

namespace loom::detail::ref {

namespace {

// Parameters are bound to the caller's buffers by the executable, never computed.
void parameter_kernel(const ir::Node&, std::span<const Array>, Array&) { LOOM_ASSERT(false); }

// Every element is attrs.f. Integral dtypes take it rounded to the nearest integer (a
// Constant's value is an integral double there) and saturated, so no value is UB.
void constant_kernel(const ir::Node& node, std::span<const Array>, Array& out) {
  const double v = node.attrs.f;
  const DType t = out.dtype();
  const bool integral = is_integral(t);
  const int64_t iv = integral ? float_to_int(std::round(v), dtype_lowest(t), dtype_highest(t)) : 0;
  for (int64_t e = 0; e < out.numel(); ++e) {
    if (integral) {
      out.set_i(e, iv);
    } else {
      out.set_f(e, v);
    }
  }
}

// Element = its coordinate along attrs.i (negative axes count from the back).
void iota_kernel(const ir::Node& node, std::span<const Array>, Array& out) {
  const Shape& s = out.shape();
  if (s.empty()) {
    if (out.numel() == 1) out.set_i(0, 0);
    return;
  }
  const int64_t axis = node_axis(node, s.rank());
  int64_t inner = 1;
  for (int64_t d = axis + 1; d < s.rank(); ++d) inner *= s[d];
  for (int64_t e = 0; e < out.numel(); ++e) out.set_i(e, (e / inner) % s[axis]);
}

}  // namespace

void register_source_kernels(KernelTable& t) {
  t.set(ir::OpKind::Parameter, parameter_kernel);
  t.set(ir::OpKind::Constant, constant_kernel);
  t.set(ir::OpKind::Iota, iota_kernel);
}

}  // namespace loom::detail::ref
