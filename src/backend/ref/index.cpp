// Reference kernels of the indexing ops: gather (torch.gather) and index_select. Indices are
// data, so a bad one is a run-time ExecError, never an out-of-bounds read. Negative indices
// are out of range (as in torch), not counted from the back.
#include <vector>

#include "backend/ref/ref_impl.h"
#include "loom/core/error.h"

namespace loom::detail::ref {

namespace {

using ir::OpKind;

int64_t checked_index(const char* op, const Array& idx, int64_t i, int64_t axis, int64_t extent) {
  const int64_t k = idx.get_i(i);
  LOOM_CHECK_T(ExecError, k >= 0 && k < extent, "[", op, "] index ", k,
               " is out of range for axis ", axis, " of extent ", extent,
               ": expected an index in [0, ", extent, ")");
  return k;
}

// out[c] = x[c with c[axis] replaced by idx[c]]; idx has x's rank and, off the axis, extents
// no larger than x's.
void gather_kernel(const ir::Node& node, std::span<const Array> in, Array& out) {
  const Array &x = in[0], &idx = in[1];
  const size_t axis = static_cast<size_t>(node_axis(node, x.shape().rank()));
  LOOM_CHECK_T(ExecError, idx.shape().size() == x.shape().size(), "[gather] index of type ",
               idx.type, " must have the rank of x: ", x.type);
  for (size_t d = 0; d < x.shape().size(); ++d) {
    LOOM_CHECK_T(ExecError, d == axis || idx.shape()[d] <= x.shape()[d], "[gather] index of type ",
                 idx.type, " is larger than x: ", x.type, " along axis ", d);
  }
  const int64_t extent = x.shape()[axis];
  for (int64_t e = 0; e < out.numel(); ++e) {
    std::vector<int64_t> c = unravel(e, idx.shape());
    c[axis] = checked_index("gather", idx, e, static_cast<int64_t>(axis), extent);
    out.copy_from(e, x, ravel(c, x.shape()));
  }
}

// out[.., j, ..] = x[.., idx[j], ..] along axis, idx rank 1.
void index_select_kernel(const ir::Node& node, std::span<const Array> in, Array& out) {
  const Array &x = in[0], &idx = in[1];
  const size_t axis = static_cast<size_t>(node_axis(node, x.shape().rank()));
  const int64_t extent = x.shape()[axis];
  // Check every index up front: the output may be empty while an index is still bad.
  std::vector<int64_t> rows(static_cast<size_t>(idx.numel()));
  for (int64_t j = 0; j < idx.numel(); ++j) {
    rows[static_cast<size_t>(j)] =
        checked_index("index_select", idx, j, static_cast<int64_t>(axis), extent);
  }
  for (int64_t e = 0; e < out.numel(); ++e) {
    std::vector<int64_t> c = unravel(e, out.shape());
    c[axis] = rows[static_cast<size_t>(c[axis])];
    out.copy_from(e, x, ravel(c, x.shape()));
  }
}

}  // namespace

void register_index_kernels(KernelTable& t) {
  t.set(OpKind::Gather, gather_kernel);
  t.set(OpKind::IndexSelect, index_select_kernel);
}

}  // namespace loom::detail::ref
