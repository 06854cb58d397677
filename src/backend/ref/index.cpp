// Reference kernels of the indexing ops: gather (torch.gather), index_select, index_add and
// argsort. Indices are data, so a bad one is a run-time ExecError, never an out-of-bounds read.
// Negative indices are out of range (as in torch), not counted from the back.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/ref/ref_impl.h"
#include "loom/backend/ref_backend.h"
#include "loom/core/error.h"

namespace loom::detail::ref {

namespace {

using ir::OpKind;

int64_t checked_index(const char* op, const Array& idx, int64_t i, int64_t axis, int64_t extent) {
  const int64_t k = idx.get_i(i);
  if (k < 0 || k >= extent) backend::throw_index_out_of_range(op, k, axis, extent);
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

// What index_select and index_add walk: x viewed as [outer, extent, inner] along the node's
// axis, and the 1-d index's entries, every one checked up front (the output may be empty
// while an index is still bad).
struct RowBlocks {
  int64_t outer = 1, extent = 0, inner = 1;
  std::vector<int64_t> rows;
  // f(x_at, y_at) per (outer, j), in order of j: the element offsets of the block of
  // `inner` elements in x and in y = [outer, rows, inner].
  template <class F>
  void each(F f) const {
    const int64_t m = static_cast<int64_t>(rows.size());
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t j = 0; j < m; ++j)
        f((o * extent + rows[static_cast<size_t>(j)]) * inner, (o * m + j) * inner);
  }
};

RowBlocks row_blocks(const char* op, const ir::Node& node, const Array& x, const Array& idx) {
  const size_t axis = static_cast<size_t>(node_axis(node, x.shape().rank()));
  RowBlocks r;
  r.extent = x.shape()[axis];
  for (size_t d = 0; d < axis; ++d) r.outer *= x.shape()[d];
  for (size_t d = axis + 1; d < x.shape().size(); ++d) r.inner *= x.shape()[d];
  r.rows.resize(static_cast<size_t>(idx.numel()));
  for (int64_t j = 0; j < idx.numel(); ++j)
    r.rows[static_cast<size_t>(j)] =
        checked_index(op, idx, j, static_cast<int64_t>(axis), r.extent);
  return r;
}

// out[.., j, ..] = x[.., idx[j], ..] along axis, idx rank 1: one block copy per (outer, j).
void index_select_kernel(const ir::Node& node, std::span<const Array> in, Array& out) {
  const Array &x = in[0], &idx = in[1];
  const RowBlocks r = row_blocks("index_select", node, x, idx);
  if (out.numel() == 0) return;
  const int64_t item = itemsize(x.dtype());
  const char* src = static_cast<const char*>(x.buf.data());
  char* dst = static_cast<char*>(out.buf.data());
  r.each([&](int64_t x_at, int64_t y_at) {
    std::memcpy(dst + y_at * item, src + x_at * item, static_cast<size_t>(r.inner * item));
  });
}

// out = base; out[o, idx[j], i] += src[o, j, i], in order of j (repeated indices accumulate,
// each addition rounded to the dtype).
void index_add_kernel(const ir::Node& node, std::span<const Array> in, Array& out) {
  const Array &base = in[0], &idx = in[1], &src = in[2];
  const RowBlocks r = row_blocks("index_add", node, base, idx);
  if (out.numel() == 0) return;
  std::memcpy(out.buf.data(), base.buf.data(), static_cast<size_t>(base.type.nbytes()));
  auto add = [&](auto* o_p, const auto* s_p) {
    r.each([&](int64_t at, int64_t from) {
      for (int64_t i = 0; i < r.inner; ++i) o_p[at + i] += s_p[from + i];
    });
  };
  switch (base.dtype()) {
    case DType::Float32:
      return add(static_cast<float*>(out.buf.data()), static_cast<const float*>(src.buf.data()));
    case DType::Float64:
      return add(static_cast<double*>(out.buf.data()), static_cast<const double*>(src.buf.data()));
    default: break;
  }
  const bool floating = is_floating(base.dtype());
  r.each([&](int64_t at, int64_t from) {
    for (int64_t i = 0; i < r.inner; ++i) {
      if (floating)
        out.set_f(at + i, out.get_f(at + i) + src.get_f(from + i));
      else
        out.set_i(at + i, out.get_i(at + i) + src.get_i(from + i));
    }
  });
}

// Each line along the axis: indices in stable order of their values (NaN largest).
void argsort_kernel(const ir::Node& node, std::span<const Array> in, Array& out) {
  const Array& x = in[0];
  const Shape& s = x.shape();
  if (s.empty()) {
    out.set_i(0, 0);
    return;
  }
  const int64_t axis = node_axis(node, s.rank());
  const bool descending = node.attrs.flag, fp = is_floating(x.dtype());
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= s[d];
  for (int64_t d = axis + 1; d < s.rank(); ++d) inner *= s[d];
  const int64_t n = s[axis];
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      const int64_t base = o * n * inner + i;
      auto less = [&](int64_t a, int64_t b) {  // a before b, ascending
        if (fp) {
          const double va = x.get_f(base + a * inner), vb = x.get_f(base + b * inner);
          if (std::isnan(va)) return false;
          return std::isnan(vb) || va < vb;
        }
        return x.get_i(base + a * inner) < x.get_i(base + b * inner);
      };
      for (int64_t k = 0; k < n; ++k) order[static_cast<size_t>(k)] = k;
      if (descending)
        std::stable_sort(order.begin(), order.end(),
                         [&](int64_t a, int64_t b) { return less(b, a); });
      else
        std::stable_sort(order.begin(), order.end(), less);
      for (int64_t k = 0; k < n; ++k) out.set_i(base + k * inner, order[static_cast<size_t>(k)]);
    }
}

}  // namespace

void register_index_kernels(KernelTable& t) {
  t.set(OpKind::Gather, gather_kernel);
  t.set(OpKind::IndexSelect, index_select_kernel);
  t.set(OpKind::IndexAdd, index_add_kernel);
  t.set(OpKind::ArgSort, argsort_kernel);
}

}  // namespace loom::detail::ref

namespace loom::backend {

void throw_index_out_of_range(const char* op, int64_t k, int64_t axis, int64_t extent) {
  throw ExecError(
      op, detail::str_cat("[", op, "] index ", k, " is out of range for axis ", axis, " of extent ",
                          extent, ": expected an index in [0, ", extent, ")"));
}

}  // namespace loom::backend
