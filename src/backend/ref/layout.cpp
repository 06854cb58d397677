// Reference kernels of the layout ops: reshape, permute, expand, slice, concat. They move
// elements bit for bit (no conversion), so NaN payloads and -0.0 survive.
#include <cstring>
#include <vector>

#include "backend/ref/ref_impl.h"
#include "loom/core/error.h"

namespace loom::detail::ref {

namespace {

using ir::OpKind;

// Row-major data of the same numel is already reshaped.
void reshape_kernel(const ir::Node&, std::span<const Array> in, Array& out) {
  LOOM_ASSERT(in[0].numel() == out.numel());
  if (out.type.nbytes() > 0) {
    std::memcpy(out.buf.data(), in[0].buf.data(), static_cast<size_t>(out.type.nbytes()));
  }
}

// out.shape[i] = x.shape[perm[i]], so output coordinate i steps x's axis perm[i].
void permute_kernel(const ir::Node& node, std::span<const Array> in, Array& out) {
  const Array& x = in[0];
  const std::vector<int64_t> x_strides = contiguous_strides(x.shape());
  const auto& perm = node.attrs.ints;
  LOOM_ASSERT(perm.size() == out.shape().size());
  for (int64_t e = 0; e < out.numel(); ++e) {
    const std::vector<int64_t> c = unravel(e, out.shape());
    int64_t xi = 0;
    for (size_t i = 0; i < c.size(); ++i) xi += c[i] * x_strides[static_cast<size_t>(perm[i])];
    out.copy_from(e, x, xi);
  }
}

void expand_kernel(const ir::Node&, std::span<const Array> in, Array& out) {
  const BroadcastIndex ix(out.shape(), in[0].shape());
  for (int64_t e = 0; e < out.numel(); ++e) out.copy_from(e, in[0], ix(e));
}

// attrs.ints = [start, end, step] along axis attrs.i: output coordinate c reads start + c*step.
void slice_kernel(const ir::Node& node, std::span<const Array> in, Array& out) {
  const Array& x = in[0];
  const size_t axis = static_cast<size_t>(node_axis(node, x.shape().rank()));
  LOOM_ASSERT(node.attrs.ints.size() == 3);
  const int64_t start = node.attrs.ints[0], step = node.attrs.ints[2];
  for (int64_t e = 0; e < out.numel(); ++e) {
    std::vector<int64_t> c = unravel(e, out.shape());
    c[axis] = start + c[axis] * step;
    out.copy_from(e, x, ravel(c, x.shape()));
  }
}

// Viewed as [outer, extent, inner], each operand fills a band [offset, offset + extent) of the
// output's middle axis.
void concat_kernel(const ir::Node& node, std::span<const Array> in, Array& out) {
  const Shape& s = out.shape();
  const int64_t axis = node_axis(node, s.rank());
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= s[d];
  for (int64_t d = axis + 1; d < s.rank(); ++d) inner *= s[d];
  int64_t offset = 0;
  for (const Array& x : in) {
    const int64_t extent = x.shape()[static_cast<size_t>(axis)];
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t k = 0; k < extent * inner; ++k) {
        out.copy_from((o * s[axis] + offset) * inner + k, x, o * extent * inner + k);
      }
    }
    offset += extent;
  }
  LOOM_ASSERT(offset == s[axis]);
}

}  // namespace

void register_layout_kernels(KernelTable& t) {
  t.set(OpKind::Reshape, reshape_kernel);
  t.set(OpKind::Permute, permute_kernel);
  t.set(OpKind::Expand, expand_kernel);
  t.set(OpKind::Slice, slice_kernel);
  t.set(OpKind::Concat, concat_kernel);
}

}  // namespace loom::detail::ref
