// View algebra: the affine coordinates at which a fused kernel reads each operand.
#include <algorithm>

#include "backend/cpu/plan.h"

namespace loom::cpu {

namespace {

using ir::OpKind;

Affine zero() { return {}; }
Affine scaled_plus(const Affine& x, int64_t scale, int64_t add) {
  Affine r{x.c * scale + add, x.a};
  for (int64_t& v : r.a) v *= scale;
  return r;
}

// Broadcast map from an output of shape `out` to an operand of shape `in`.
Coords broadcast(const Shape& out, const Shape& in, const Coords& c) {
  Coords r(in.size());
  size_t off = out.size() - in.size();
  for (size_t d = 0; d < in.size(); ++d)
    r[d] = (in[d] == 1 && out[d + off] != 1) ? zero() : c[d + off];
  return r;
}

}  // namespace

Affine var(size_t j, size_t n) {
  Affine a;
  a.a.assign(n, 0);
  a.a[j] = 1;
  return a;
}

Affine linear(const std::vector<int64_t>& strides, const Coords& c, int64_t offset) {
  Affine r;
  r.c = offset;
  for (size_t d = 0; d < c.size(); ++d) {
    r.c += c[d].c * strides[d];
    if (r.a.size() < c[d].a.size()) r.a.resize(c[d].a.size(), 0);
    for (size_t j = 0; j < c[d].a.size(); ++j) r.a[j] += c[d].a[j] * strides[d];
  }
  while (!r.a.empty() && r.a.back() == 0) r.a.pop_back();
  return r;
}

bool trivial_reshape(const ir::Graph& g, NodeId n) {
  const ir::Node& node = g.node(n);
  const Shape& in = g.type(node.operands[0]).shape;
  std::vector<int64_t> a, b;
  for (int64_t d : in)
    if (d != 1) a.push_back(d);
  for (int64_t d : node.type.shape)
    if (d != 1) b.push_back(d);
  return a == b;
}

Coords operand_coords(const ir::Graph& g, NodeId n, size_t k, const Coords& c) {
  const ir::Node& node = g.node(n);
  const Shape& out = node.type.shape;
  const Shape& in = g.type(node.operands[k]).shape;
  switch (node.op) {
    case OpKind::RandUniform:
    case OpKind::RandNormal:  // the key i64[2] is read whole, at constant coordinates
      return Coords(in.size(), Affine{});
    case OpKind::Permute: {
      Coords r(in.size());
      for (size_t i = 0; i < node.attrs.ints.size(); ++i) r[node.attrs.ints[i]] = c[i];
      return r;
    }
    case OpKind::Slice: {
      Coords r = c;
      r[node.attrs.i] = scaled_plus(c[node.attrs.i], node.attrs.ints[2], node.attrs.ints[0]);
      return r;
    }
    case OpKind::Reshape: {  // trivial: the non-1 dims correspond in order
      Coords r(in.size());
      size_t j = 0;
      for (size_t d = 0; d < in.size(); ++d) {
        if (in[d] == 1) continue;
        while (out[j] == 1) ++j;
        r[d] = c[j++];
      }
      return r;
    }
    default: return broadcast(out, in, c);  // elementwise and expand
  }
}

}  // namespace loom::cpu
