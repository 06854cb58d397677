// Layout, indexing and matrix-product ops of the public API (torch semantics on top of the
// IR's reshape, permute, expand, slice, concat, gather, index_select, index_add and matmul).
#include <algorithm>
#include <optional>

#include "loom/trace/ops.h"
#include "trace/ops_impl.h"

namespace loom {

using detail::OpRecord;

namespace {
TensorType type_of(const Tensor& x) { return {x.dtype(), x.shape()}; }

Shape infer_reshape(const char* op, const Tensor& x, const std::vector<int64_t>& shape) {
  Shape s(shape);
  int64_t infer_at = -1, known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      LOOM_CHECK_T(ShapeError, infer_at < 0, "[", op, "] only one dim can be -1, got ",
                   Shape(shape));
      infer_at = static_cast<int64_t>(i);
    } else {
      LOOM_CHECK_T(ShapeError, shape[i] >= 0, "[", op, "] invalid extent ", shape[i], " in ",
                   Shape(shape));
      known *= shape[i];
    }
  }
  if (infer_at >= 0) {
    LOOM_CHECK_T(ShapeError, known != 0 && x.numel() % known == 0, "[", op, "] cannot reshape ",
                 type_of(x), " to ", Shape(shape));
    s[infer_at] = x.numel() / known;
  }
  LOOM_CHECK_T(ShapeError, s.numel() == x.numel(), "[", op, "] cannot reshape ", type_of(x), " (",
               x.numel(), " elements) to ", s, " (", s.numel(), " elements)");
  return s;
}
}  // namespace

Tensor reshape(const Tensor& x, std::vector<int64_t> shape) {
  Shape s = infer_reshape("reshape", x, shape);
  OpRecord rec;
  return rec.ctx.wrap(rec.b().reshape(rec.ctx.value_of(x), s));
}
namespace {

// torch's computeStride: the strides of a view of (shape, strides) as `to`, if one exists.
std::optional<std::vector<int64_t>> view_strides(const Shape& shape,
                                                 const std::vector<int64_t>& strides,
                                                 const Shape& to) {
  if (shape.empty() || shape.numel() == 0) return contiguous_strides(to);
  std::vector<int64_t> out(to.size());
  int64_t view_d = static_cast<int64_t>(to.size()) - 1;
  int64_t chunk = strides.back(), tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= shape[d];
    if (d == 0 || (shape[d - 1] != 1 && strides[d - 1] != tensor_numel * chunk)) {
      while (view_d >= 0 && (view_numel < tensor_numel || to[view_d] == 1)) {
        out[view_d] = view_numel * chunk;
        view_numel *= to[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk = strides[d - 1];
        tensor_numel = view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return out;
}

// The strides torch would give this value: layout ops that are views in torch (permute,
// expand, slice, a reshape that is a view) keep their operand's memory; any other op, and
// data, is contiguous. (torch's elementwise ops follow a permuted input's layout; loom's
// results are contiguous: see docs/pytorch_differences.md.)
std::vector<int64_t> torch_strides(const ir::Graph& g, ir::Value v, int depth = 0) {
  const ir::Node& n = g.node(v.node);
  const Shape& shape = g.type(v).shape;
  if (depth > 64) return contiguous_strides(shape);
  switch (n.op) {
    case ir::OpKind::Permute: {
      std::vector<int64_t> in = torch_strides(g, n.operands[0], depth + 1), out;
      for (int64_t p : n.attrs.ints) out.push_back(in[static_cast<size_t>(p)]);
      return out;
    }
    case ir::OpKind::Expand: {
      const Shape& is = g.type(n.operands[0]).shape;
      // A broadcast 0-d value is how full/zeros/ones are built: a fresh tensor in torch.
      if (is.empty()) return contiguous_strides(shape);
      std::vector<int64_t> in = torch_strides(g, n.operands[0], depth + 1);
      std::vector<int64_t> out(shape.size(), 0);
      const size_t lead = shape.size() - is.size();
      for (size_t i = 0; i < is.size(); ++i) out[lead + i] = is[i] == shape[lead + i] ? in[i] : 0;
      return out;
    }
    case ir::OpKind::Slice: {
      std::vector<int64_t> out = torch_strides(g, n.operands[0], depth + 1);
      out[static_cast<size_t>(n.attrs.i)] *= n.attrs.ints[2];
      return out;
    }
    case ir::OpKind::Reshape: {
      const Shape& is = g.type(n.operands[0]).shape;
      auto st = view_strides(is, torch_strides(g, n.operands[0], depth + 1), shape);
      return st ? *st : contiguous_strides(shape);  // torch's reshape copies here
    }
    default: return contiguous_strides(shape);
  }
}

}  // namespace

// torch's view: refused where the tensor's layout (as torch would hold it: a transpose, an
// expand, a strided slice) cannot be viewed with the new shape; reshape copies instead.
Tensor view(const Tensor& x, std::vector<int64_t> shape) {
  Shape s = infer_reshape("view", x, shape);
  OpRecord rec;
  ir::Value v = rec.ctx.value_of(x);
  const ir::Graph& g = rec.b().graph();
  std::vector<int64_t> st = torch_strides(g, v);
  LOOM_CHECK_T(ShapeError, view_strides(x.shape(), st, s).has_value(), "[view] cannot view ",
               type_of(x), " as ", s, ": its layout (strides ", Shape(st),
               ", from a transpose, permute, expand or strided slice) does not allow it without a "
               "copy, as in torch; use reshape() instead");
  return rec.ctx.wrap(rec.b().reshape(v, s));
}

Tensor contiguous(const Tensor& x) {
  OpRecord rec;
  ir::Value v = rec.ctx.value_of(x);
  if (torch_strides(rec.b().graph(), v) == contiguous_strides(x.shape())) return x;
  // A copy in torch: an identity node, which torch_strides reads as row-major.
  ir::Node n;
  n.op = ir::OpKind::Convert;
  n.operands = {v};
  n.type = rec.b().graph().type(v);
  return rec.ctx.wrap({rec.b().add(std::move(n)), 0});
}

Tensor permute(const Tensor& x, std::vector<int64_t> dims) {
  LOOM_CHECK_T(ShapeError, static_cast<int64_t>(dims.size()) == x.dim(), "[permute] expected ",
               x.dim(), " dims for ", type_of(x), ", got ", Shape(dims));
  for (int64_t& d : dims) d = normalize_axis("permute", d, x.dim());
  std::vector<int64_t> sorted = dims;
  std::sort(sorted.begin(), sorted.end());
  LOOM_CHECK_T(ShapeError, std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(),
               "[permute] dims ", Shape(dims), " repeat a dim of ", type_of(x));
  bool identity = true;
  for (size_t i = 0; i < dims.size(); ++i)
    identity = identity && dims[i] == static_cast<int64_t>(i);
  OpRecord rec;
  ir::Value v = rec.ctx.value_of(x);
  return rec.ctx.wrap(identity ? v : rec.b().permute(v, std::move(dims)));
}

Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  int64_t r = x.dim();
  if (r == 0) {
    normalize_axis("transpose", dim0, 0);
    normalize_axis("transpose", dim1, 0);
    return permute(x, {});
  }
  int64_t a = normalize_axis("transpose", dim0, r), b = normalize_axis("transpose", dim1, r);
  std::vector<int64_t> perm(r);
  for (int64_t i = 0; i < r; ++i) perm[i] = i;
  std::swap(perm[a], perm[b]);
  return permute(x, perm);
}

Tensor unsqueeze(const Tensor& x, int64_t dim) {
  int64_t d = normalize_axis("unsqueeze", dim, x.dim() + 1);
  Shape s = x.shape();
  s.insert(d, 1);
  return reshape(x, s.vec());
}
Tensor squeeze(const Tensor& x) {
  Shape s;
  for (int64_t e : x.shape())
    if (e != 1) s.push_back(e);
  return reshape(x, s.vec());
}
Tensor squeeze(const Tensor& x, int64_t dim) {
  if (x.dim() == 0) return x;
  int64_t d = normalize_axis("squeeze", dim, x.dim());
  if (x.shape()[d] != 1) return x;
  Shape s = x.shape();
  s.erase(d);
  return reshape(x, s.vec());
}
Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  if (x.dim() == 0) return reshape(x, {1});
  int64_t a = normalize_axis("flatten", start_dim, x.dim());
  int64_t b = normalize_axis("flatten", end_dim, x.dim());
  LOOM_CHECK_T(ShapeError, a <= b, "[flatten] start_dim ", start_dim, " comes after end_dim ",
               end_dim, " for ", type_of(x));
  std::vector<int64_t> s;
  for (int64_t i = 0; i < a; ++i) s.push_back(x.shape()[i]);
  int64_t n = 1;
  for (int64_t i = a; i <= b; ++i) n *= x.shape()[i];
  s.push_back(n);
  for (int64_t i = b + 1; i < x.dim(); ++i) s.push_back(x.shape()[i]);
  return reshape(x, s);
}

Tensor expand(const Tensor& x, std::vector<int64_t> shape) {
  size_t off = shape.size() >= static_cast<size_t>(x.dim()) ? shape.size() - x.dim() : 0;
  LOOM_CHECK_T(ShapeError, shape.size() >= static_cast<size_t>(x.dim()), "[expand] target ",
               Shape(shape), " has fewer dims than ", type_of(x));
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      LOOM_CHECK_T(ShapeError, i >= off, "[expand] -1 is not allowed for the new leading dim ", i,
                   " of ", Shape(shape));
      shape[i] = x.shape()[i - off];
    }
  }
  OpRecord rec;
  return rec.ctx.wrap(rec.b().expand(rec.ctx.value_of(x), Shape(shape)));
}

Tensor cat(const std::vector<Tensor>& xs, int64_t dim) {
  LOOM_CHECK_T(ShapeError, !xs.empty(), "[cat] expected a non-empty list of tensors");
  int64_t r = xs[0].dim();
  LOOM_CHECK_T(ShapeError, r > 0, "[cat] zero-dimensional tensors cannot be concatenated");
  int64_t d = normalize_axis("cat", dim, r);
  DType dt = xs[0].dtype();
  for (const Tensor& t : xs) dt = promote_types(dt, t.dtype());
  OpRecord rec;
  std::vector<ir::Value> vs;
  for (const Tensor& t : xs) {
    LOOM_CHECK_T(ShapeError, t.dim() == r, "[cat] expected tensors of rank ", r, ", got ",
                 type_of(t), " beside ", type_of(xs[0]));
    vs.push_back(rec.b().convert(rec.ctx.value_of(t), dt));
  }
  return rec.ctx.wrap(rec.b().concat(vs, d));
}

Tensor stack(const std::vector<Tensor>& xs, int64_t dim) {
  LOOM_CHECK_T(ShapeError, !xs.empty(), "[stack] expected a non-empty list of tensors");
  int64_t d = normalize_axis("stack", dim, xs[0].dim() + 1);
  std::vector<Tensor> us;
  for (const Tensor& t : xs) {
    LOOM_CHECK_T(ShapeError, t.shape() == xs[0].shape(),
                 "[stack] expected tensors of one shape, got ", type_of(t), " beside ",
                 type_of(xs[0]));
    us.push_back(unsqueeze(t, d));
  }
  return cat(us, d);
}

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  int64_t d = normalize_axis("slice", dim, x.dim());
  LOOM_CHECK_T(ShapeError, step >= 1, "[slice] step must be positive, got ", step);
  int64_t n = x.shape()[d];
  auto clampi = [n](int64_t i) { return std::clamp<int64_t>(i < 0 ? i + n : i, 0, n); };
  int64_t s = clampi(start), e = std::max(s, clampi(end));
  OpRecord rec;
  ir::Value v = rec.ctx.value_of(x);
  if (s == 0 && e == n && step == 1) return rec.ctx.wrap(v);
  return rec.ctx.wrap(rec.b().slice(v, d, s, e, step));
}

Tensor select(const Tensor& x, int64_t dim, int64_t index) {
  LOOM_CHECK_T(ShapeError, x.dim() > 0, "[select] cannot index a 0-d tensor ", type_of(x));
  int64_t d = normalize_axis("select", dim, x.dim());
  int64_t n = x.shape()[d];
  LOOM_CHECK_T(ShapeError, index >= -n && index < n, "[select] index ", index,
               " is out of bounds for dim ", d, " with size ", n, " of ", type_of(x));
  if (index < 0) index += n;
  return squeeze(slice(x, d, index, index + 1), d);
}

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index, std::source_location loc) {
  OpRecord rec;
  int64_t d = normalize_axis("index_select", dim, std::max<int64_t>(x.dim(), 1));
  ir::Value v = rec.ctx.value_of(x), i = rec.ctx.value_of(index);
  if (x.dim() == 0) v = rec.b().reshape(v, Shape{1});
  if (index.dim() == 0) i = rec.b().reshape(i, Shape{1});
  ir::Value r = rec.b().index_select(v, d, i);
  rec.ctx.note_site(r, loc);
  if (x.dim() == 0) r = rec.b().reshape(r, Shape{});
  return rec.ctx.wrap(r);
}

Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& source,
                 std::source_location loc) {
  OpRecord rec;
  int64_t d = normalize_axis("index_add", dim, std::max<int64_t>(x.dim(), 1));
  ir::Value v = rec.ctx.value_of(x), i = rec.ctx.value_of(index), s = rec.ctx.value_of(source);
  if (x.dim() == 0) v = rec.b().reshape(v, Shape{1});
  if (index.dim() == 0) i = rec.b().reshape(i, Shape{1});
  if (source.dim() == 0) s = rec.b().reshape(s, Shape{1});
  ir::Value r = rec.b().index_add(v, d, i, s);
  rec.ctx.note_site(r, loc);
  if (x.dim() == 0) r = rec.b().reshape(r, Shape{});
  return rec.ctx.wrap(r);
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index, std::source_location loc) {
  OpRecord rec;
  int64_t d = normalize_axis("gather", dim, std::max<int64_t>(x.dim(), 1));
  LOOM_CHECK_T(ShapeError, x.dim() == index.dim(), "[gather] index ", type_of(index),
               " must have the rank of the input ", type_of(x));
  ir::Value v = rec.ctx.value_of(x), i = rec.ctx.value_of(index);
  if (x.dim() == 0) {
    v = rec.b().reshape(v, Shape{1});
    i = rec.b().reshape(i, Shape{1});
    ir::Value r = rec.b().gather(v, d, i);
    rec.ctx.note_site(r, loc);
    return rec.ctx.wrap(rec.b().reshape(r, Shape{}));
  }
  ir::Value r = rec.b().gather(v, d, i);
  rec.ctx.note_site(r, loc);
  return rec.ctx.wrap(r);
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  LOOM_CHECK_T(ShapeError, a.dim() >= 1 && b.dim() >= 1,
               "[matmul] both operands need at least 1 dim, got ", type_of(a), " and ", type_of(b));
  LOOM_CHECK_T(DTypeError, a.dtype() == b.dtype(), "[matmul] expected operands of one dtype, got ",
               type_of(a), " and ", type_of(b),
               " (torch does not promote in matmul); convert one with to() first");
  DType dt = a.dtype();
  OpRecord rec;
  ir::Value va = rec.b().convert(rec.ctx.value_of(a), dt);
  ir::Value vb = rec.b().convert(rec.ctx.value_of(b), dt);
  if (a.dim() == 1) va = rec.b().reshape(va, Shape{1, a.shape()[0]});
  if (b.dim() == 1) vb = rec.b().reshape(vb, Shape{b.shape()[0], 1});
  ir::Value r = rec.b().matmul(va, vb);
  Shape s = rec.b().type(r).shape;
  if (b.dim() == 1) s.erase(s.size() - 1);
  if (a.dim() == 1) s.erase(s.size() - (b.dim() == 1 ? 1 : 2));
  return rec.ctx.wrap(rec.b().reshape(r, s));
}

}  // namespace loom
