// Reference kernels of the indexing ops: gather (torch.gather), index_select and index_add. Indices
// are data, so a bad one is a run-time ExecError, never an out-of-bounds read. Negative indices are
// out of range (as in torch), not counted from the back.
#include <cstring>
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
  const Shape& is = idx.shape();
  const size_t rank = is.size();
  std::vector<int64_t> stride(rank, 1), c(rank, 0);  // x's strides; idx's coordinates
  for (size_t d = rank; d-- > 1;) stride[d - 1] = stride[d] * x.shape()[d];
  int64_t off = 0;  // x's offset of c, the axis coordinate left out
  for (int64_t e = 0; e < out.numel(); ++e) {
    const int64_t k = checked_index("gather", idx, e, static_cast<int64_t>(axis), extent);
    out.copy_from(e, x, off + k * stride[axis]);
    for (size_t d = rank; d-- > 0;) {  // the next coordinate, odometer style
      if (++c[d] < is[d]) {
        if (d != axis) off += stride[d];
        break;
      }
      if (d != axis) off -= (c[d] - 1) * stride[d];
      c[d] = 0;
    }
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
  // x as [outer, extent, inner]: one block copy of `inner` elements per (outer, j).
  if (out.numel() == 0) return;
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < axis; ++d) outer *= x.shape()[d];
  for (size_t d = axis + 1; d < x.shape().size(); ++d) inner *= x.shape()[d];
  const int64_t item = itemsize(x.dtype()), m = idx.numel();
  const size_t block = static_cast<size_t>(inner * item);
  const char* src = static_cast<const char*>(x.buf.data());
  char* dst = static_cast<char*>(out.buf.data());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < m; ++j)
      std::memcpy(dst + (o * m + j) * inner * item,
                  src + (o * extent + rows[static_cast<size_t>(j)]) * inner * item, block);
}

// out = base; out[o, idx[j], i] += src[o, j, i] over base viewed as [outer, extent, inner],
// in order of j (repeated indices accumulate, each addition rounded to the dtype).
void index_add_kernel(const ir::Node& node, std::span<const Array> in, Array& out) {
  const Array &base = in[0], &idx = in[1], &src = in[2];
  const size_t axis = static_cast<size_t>(node_axis(node, base.shape().rank()));
  const int64_t extent = base.shape()[axis], m = idx.numel();
  std::vector<int64_t> rows(static_cast<size_t>(m));
  for (int64_t j = 0; j < m; ++j)
    rows[static_cast<size_t>(j)] =
        checked_index("index_add", idx, j, static_cast<int64_t>(axis), extent);
  if (out.numel() == 0) return;
  std::memcpy(out.buf.data(), base.buf.data(), static_cast<size_t>(base.type.nbytes()));
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < axis; ++d) outer *= base.shape()[d];
  for (size_t d = axis + 1; d < base.shape().size(); ++d) inner *= base.shape()[d];
  auto add_rows = [&](auto* o_p, const auto* s_p) {
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t j = 0; j < m; ++j) {
        auto* dst = o_p + (o * extent + rows[static_cast<size_t>(j)]) * inner;
        const auto* from = s_p + (o * m + j) * inner;
        for (int64_t i = 0; i < inner; ++i) dst[i] += from[i];
      }
  };
  switch (base.dtype()) {
    case DType::Float32:
      add_rows(static_cast<float*>(out.buf.data()), static_cast<const float*>(src.buf.data()));
      return;
    case DType::Float64:
      add_rows(static_cast<double*>(out.buf.data()), static_cast<const double*>(src.buf.data()));
      return;
    default: break;
  }
  const bool floating = is_floating(base.dtype());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < m; ++j)
      for (int64_t i = 0; i < inner; ++i) {
        const int64_t d = (o * extent + rows[static_cast<size_t>(j)]) * inner + i;
        const int64_t f = (o * m + j) * inner + i;
        if (floating)
          out.set_f(d, out.get_f(d) + src.get_f(f));
        else
          out.set_i(d, out.get_i(d) + src.get_i(f));
      }
}

}  // namespace

void register_index_kernels(KernelTable& t) {
  t.set(OpKind::Gather, gather_kernel);
  t.set(OpKind::IndexSelect, index_select_kernel);
  t.set(OpKind::IndexAdd, index_add_kernel);
}

}  // namespace loom::detail::ref
