// Tensor handle methods, factories, reading values, printing and sync.
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <ostream>

#include "loom/core/half.h"
#include "loom/ir/builder.h"
#include "loom/runtime/sync.h"
#include "loom/trace/sharding.h"
#include "trace/context.h"
#include "trace/ops_impl.h"

namespace loom {

using detail::TensorImpl;
using detail::TraceContext;

namespace {

TensorImpl& checked(const Tensor& t, const char* what) {
  LOOM_CHECK(t.defined(), "[", what, "] called on an undefined (default-constructed) Tensor");
  return *t.impl();
}

// Element k of a materialized buffer, as double / int64.
double load_f(const Buffer& b, DType dt, int64_t k) {
  switch (dt) {
    case DType::Bool: return b.as<uint8_t>()[k] != 0;
    case DType::Int32: return b.as<int32_t>()[k];
    case DType::Int64: return static_cast<double>(b.as<int64_t>()[k]);
    case DType::BFloat16: return bf16_to_float(b.as<uint16_t>()[k]);
    case DType::Float16: return f16_to_float(b.as<uint16_t>()[k]);
    case DType::Float32: return b.as<float>()[k];
    case DType::Float64: return b.as<double>()[k];
  }
  return 0;
}
int64_t load_i(const Buffer& b, DType dt, int64_t k) {
  switch (dt) {
    case DType::Bool: return b.as<uint8_t>()[k] != 0;
    case DType::Int32: return b.as<int32_t>()[k];
    case DType::Int64: return b.as<int64_t>()[k];
    default: return static_cast<int64_t>(load_f(b, dt, k));
  }
}

Buffer materialized(const Tensor& t, const char* what) {
  TensorImpl& impl = checked(t, what);
  TraceContext::get().check_readable(what);
  TraceContext::get().check_owner(impl, what);
  if (impl.error) [[unlikely]]
    std::rethrow_exception(impl.error);  // its run failed
  // A value autograd may still differentiate stays pending with its buffer once computed.
  if (impl.pending() && !impl.buffer.defined()) TraceContext::get().materialize({&impl});
  if (impl.sharding) [[unlikely]]
    return dist::full(t).impl()->buffer;  // this rank holds a block: the whole value
  return impl.buffer;
}

template <class T>
void store_values(Buffer& b, DType dt, const std::vector<T>& v) {
  for (size_t k = 0; k < v.size(); ++k) {
    if constexpr (std::is_same_v<T, bool>)
      b.as<uint8_t>()[k] = v[k];
    else
      static_cast<T*>(b.data())[k] = v[k];
  }
}

template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>)
    return DType::Float32;
  else if constexpr (std::is_same_v<T, double>)
    return DType::Float64;
  else if constexpr (std::is_same_v<T, int32_t>)
    return DType::Int32;
  else if constexpr (std::is_same_v<T, int64_t>)
    return DType::Int64;
  else
    return DType::Bool;
}

}  // namespace

namespace detail {
Tensor from_buffer(Buffer b, TensorType type) {
  auto impl = detail::new_tensor_impl();
  impl->type = std::move(type);
  impl->buffer = std::move(b);
  return Tensor(std::move(impl));
}
}  // namespace detail

const Shape& Tensor::shape() const { return checked(*this, "shape").type.shape; }
DType Tensor::dtype() const { return checked(*this, "dtype").type.dtype; }
int64_t Tensor::size(int64_t d) const { return shape()[normalize_axis("size", d, dim())]; }
bool Tensor::is_pending() const { return checked(*this, "is_pending").pending(); }

template <class T>
std::vector<T> Tensor::to_vector(std::source_location loc) const {
  runtime::SyncSite site(detail::user_site(loc));  // names the graph this read may run
  const Buffer b = materialized(*this, "to_vector");
  DType dt = dtype();
  int64_t n = numel();
  std::vector<T> out(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) {
    if constexpr (std::is_integral_v<T>)
      out[k] = static_cast<T>(load_i(b, dt, k));
    else
      out[k] = static_cast<T>(load_f(b, dt, k));
  }
  return out;
}

template <class T>
T Tensor::item(std::source_location loc) const {
  TraceContext::get().check_readable("item");
  TraceContext::get().check_owner(checked(*this, "item"), "item");
  LOOM_CHECK_T(ShapeError, numel() == 1, "[item] expected a tensor with one element, got ",
               TensorType{dtype(), shape()});
  return to_vector<T>(loc)[0];
}

#define LOOM_INSTANTIATE_READ(T)                                            \
  template std::vector<T> Tensor::to_vector<T>(std::source_location) const; \
  template T Tensor::item<T>(std::source_location) const;
LOOM_INSTANTIATE_READ(float)
LOOM_INSTANTIATE_READ(double)
LOOM_INSTANTIATE_READ(int32_t)
LOOM_INSTANTIATE_READ(int64_t)
LOOM_INSTANTIATE_READ(bool)
#undef LOOM_INSTANTIATE_READ

Tensor Tensor::operator[](int64_t i) const { return select(*this, 0, i); }

Tensor& Tensor::copy_(const Tensor& src) {
  TensorImpl& self = checked(*this, "copy_");
  TraceContext& ctx = TraceContext::get();
  ir::Value v = ctx.value_of(src);
  const Shape& ss = src.shape();
  bool ok = ss.size() <= self.type.shape.size();
  for (size_t i = 0; ok && i < ss.size(); ++i) {
    int64_t d = self.type.shape[self.type.shape.size() - ss.size() + i];
    ok = ss[i] == d || ss[i] == 1;
  }
  LOOM_CHECK_T(ShapeError, ok, "[copy_] source ", TensorType{src.dtype(), ss},
               " does not broadcast to the destination ", self.type);
  v = ctx.builder().convert(ctx.builder().expand(v, self.type.shape), self.type.dtype);
  ctx.rebind(self, v);
  return *this;
}

Tensor& Tensor::add_(const Tensor& other) {
  TensorImpl& self = checked(*this, "add_");
  Tensor r = add(*this, other);
  LOOM_CHECK_T(ShapeError, r.shape() == self.type.shape, "[add_] result shape ", r.shape(),
               " differs from the destination ", self.type, "; expected ",
               TensorType{other.dtype(), other.shape()}, " to broadcast to it");
  LOOM_CHECK_T(DTypeError, promote_types(r.dtype(), self.type.dtype) == self.type.dtype,
               "[add_] result type ", r.dtype(), " cannot be cast to the destination ", self.type);
  TraceContext& ctx = TraceContext::get();
  ctx.rebind(self, ctx.builder().convert(ctx.value_of(r), self.type.dtype));
  return *this;
}

Tensor& Tensor::zero_() {
  TensorImpl& self = checked(*this, "zero_");
  TraceContext& ctx = TraceContext::get();
  // As add_: a leaf's gradient would refer to its old value (torch refuses it too).
  LOOM_CHECK_T(AutodiffError, !(ctx.grad().enabled() && self.requires_grad),
               "[zero_] a leaf tensor ", self.type,
               " that requires grad cannot be updated in place outside no_grad (its gradient "
               "would refer to the old value); update it under loom::NoGradGuard (Python: "
               "`with loom.no_grad():`)");
  ir::Value z = ctx.builder().constant(0, self.type.dtype);
  ctx.rebind(self, ctx.builder().expand(z, self.type.shape));
  return *this;
}

Tensor& Tensor::requires_grad_(bool on) {
  TensorImpl& self = checked(*this, "requires_grad_");
  LOOM_CHECK_T(DTypeError, !on || is_floating(self.type.dtype),
               "[requires_grad_] only floating-point tensors can require gradients, got ",
               self.type);
  TraceContext& ctx = TraceContext::get();
  ctx.check_owner(self, "requires_grad_");
  LOOM_CHECK_T(
      AutodiffError,
      !(self.pending() && self.scope == 0 && !self.requires_grad && ctx.grad().active(self.value)),
      "[requires_grad_] only leaf tensors can be made to require grad; this ", self.type,
      " is computed from tensors that require grad (detach() it first)");
  if (on && !self.requires_grad && self.pending() && self.scope == 0) ctx.grad().own_node(self);
  self.requires_grad = on;
  return *this;
}
bool Tensor::requires_grad() const {
  TensorImpl& self = checked(*this, "requires_grad");
  if (self.requires_grad) return true;
  TraceContext::get().check_owner(self, "requires_grad");
  return self.pending() && self.scope == 0 && TraceContext::get().grad().active(self.value);
}
Tensor Tensor::grad() const { return checked(*this, "grad").grad; }
void Tensor::reset_grad() {
  TensorImpl& self = checked(*this, "reset_grad");
  if (auto* st = TraceContext::get().step(); st && st->recording) st->touch_grad(self, true);
  self.grad = Tensor();
}
void Tensor::backward() const { TraceContext::get().grad().backward(*this, Tensor()); }
void Tensor::backward(const Tensor& gradient) const {
  LOOM_CHECK(gradient.defined(), "[backward] the gradient is an undefined Tensor");
  TraceContext::get().grad().backward(*this, gradient);
}
Tensor Tensor::detach() const {
  TensorImpl& self = checked(*this, "detach");
  if (self.pending()) {
    TraceContext& ctx = TraceContext::get();
    ctx.check_owner(self, "detach");
    if (self.scope != 0) return ctx.wrap(ctx.value_of(*this));
    return ctx.wrap(ctx.grad().cut_gradient(self.value));
  }
  Tensor d = detail::from_buffer(self.buffer, self.type);
  d.impl()->sharding = self.sharding;  // the same block of the same global value
  return d;
}

// ---- factories -------------------------------------------------------------------------

template <class T>
Tensor tensor(std::vector<T> values, Shape shape) {
  constexpr DType dt = dtype_of<T>();
  ir::check_shape("tensor", shape);
  LOOM_CHECK_T(ShapeError, static_cast<int64_t>(values.size()) == shape.numel(), "[tensor] ",
               values.size(), " values do not fill shape ", shape, " (", shape.numel(),
               " elements)");
  Buffer b = Buffer::allocate(values.size() * itemsize(dt));
  store_values(b, dt, values);
  return detail::from_buffer(std::move(b), TensorType{dt, std::move(shape)});
}
template <class T>
Tensor tensor(T scalar) {
  return tensor(std::vector<T>{scalar}, Shape{});
}
#define LOOM_INSTANTIATE_FACTORY(T)                        \
  template Tensor tensor<T>(std::vector<T> values, Shape); \
  template Tensor tensor<T>(T scalar);
LOOM_INSTANTIATE_FACTORY(float)
LOOM_INSTANTIATE_FACTORY(double)
LOOM_INSTANTIATE_FACTORY(int32_t)
LOOM_INSTANTIATE_FACTORY(int64_t)
LOOM_INSTANTIATE_FACTORY(bool)
#undef LOOM_INSTANTIATE_FACTORY

Tensor full(Shape shape, double value, DType dtype) {
  ir::check_shape("full", shape);
  detail::OpRecord rec;
  Scalar s = is_floating(dtype) ? Scalar(value) : Scalar(static_cast<int64_t>(value));
  if (dtype == DType::Bool) s = Scalar(value != 0);
  ir::Value v = rec.ctx.scalar(s, dtype);
  return rec.ctx.wrap(rec.ctx.builder().expand(v, shape));
}
Tensor zeros(Shape shape, DType dtype) { return full(std::move(shape), 0.0, dtype); }
Tensor ones(Shape shape, DType dtype) { return full(std::move(shape), 1.0, dtype); }

Tensor arange(double start, double end, DType dtype) {
  LOOM_CHECK_T(DTypeError, dtype != DType::Bool, "[arange] expected a numeric dtype, got bool");
  LOOM_CHECK_T(ShapeError, std::isfinite(start) && std::isfinite(end),
               "[arange] expected finite bounds, got [", start, ", ", end, ")");
  LOOM_CHECK_T(ShapeError, end >= start, "[arange] end ", end, " is below start ", start,
               " with step 1: the bounds are inconsistent with the step's sign (as torch)");
  int64_t n = std::max<int64_t>(0, static_cast<int64_t>(std::ceil(end - start)));
  detail::OpRecord rec;
  ir::Builder& b = rec.ctx.builder();
  DType wide = is_floating(dtype) ? DType::Float64 : DType::Int64;
  ir::Value idx = b.iota(TensorType{wide, {n}}, 0);
  Scalar s0 = is_floating(dtype) ? Scalar(start) : Scalar(static_cast<int64_t>(start));
  ir::Value v = b.binary(ir::OpKind::Add, idx, rec.ctx.scalar(s0, wide));
  return rec.ctx.wrap(b.convert(v, dtype));
}

namespace {
Tensor random(ir::OpKind op, const char* name, Shape shape, DType dtype) {
  ir::check_shape(name, shape);
  LOOM_CHECK_T(DTypeError, is_floating(dtype), "[", name, "] expected a floating-point dtype, got ",
               dtype);
  detail::OpRecord rec;
  ir::Value key = rec.ctx.next_rng_key();
  return rec.ctx.wrap(rec.ctx.builder().random(op, key, TensorType{dtype, std::move(shape)}));
}
}  // namespace

Tensor randn(Shape shape, DType dtype) {
  return random(ir::OpKind::RandNormal, "randn", std::move(shape), dtype);
}
Tensor rand(Shape shape, DType dtype) {
  return random(ir::OpKind::RandUniform, "rand", std::move(shape), dtype);
}
void manual_seed(uint64_t seed) { TraceContext::get().manual_seed(seed); }

void sync(CallSite loc) {
  runtime::SyncSite site(loc);  // names the graph: GraphName, else this call site
  TraceContext::get().sync_all();
}
void materialize(const std::vector<Tensor>& tensors, CallSite loc) {
  runtime::SyncSite site(detail::user_site(loc));
  std::vector<TensorImpl*> impls;
  for (const Tensor& t : tensors) {
    TensorImpl& impl = checked(t, "materialize");
    if (impl.pending() && !impl.buffer.defined()) impls.push_back(&impl);
  }
  TraceContext::get().materialize(impls);
}
int64_t pending_graph_size() { return static_cast<int64_t>(TraceContext::get().graph().size()); }
std::string pending_ir(const std::vector<Tensor>& outputs) {
  std::vector<TensorImpl*> impls;
  TraceContext::get().check_readable("pending_ir");
  for (const Tensor& t : outputs) {
    impls.push_back(&checked(t, "pending_ir"));
    TraceContext::get().check_owner(*impls.back(), "pending_ir");
  }
  std::vector<uint32_t> slots;
  return ir::to_text(TraceContext::get().cut(impls, &slots));
}

// ---- printing --------------------------------------------------------------------------

namespace {
struct Format {
  bool integral = true, scientific = false;
};
Format choose_format(const std::vector<double>& v) {
  Format f;
  double max_abs = 0, min_abs = INFINITY;
  for (double x : v) {
    if (!std::isfinite(x)) continue;
    if (x != std::floor(x)) f.integral = false;
    double a = std::fabs(x);
    max_abs = std::max(max_abs, a);
    if (a > 0) min_abs = std::min(min_abs, a);
  }
  f.scientific = max_abs >= 1e8 || (!f.integral && min_abs < 1e-4);
  return f;
}
std::string format_float(double x, const Format& f) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  if (f.scientific)
    std::snprintf(buf, sizeof buf, "%.4e", x);
  else if (f.integral)
    std::snprintf(buf, sizeof buf, "%.0f.", x);
  else
    std::snprintf(buf, sizeof buf, "%.4f", x);
  return buf;
}
void print_nested(std::ostream& os, const Shape& s, size_t d, int64_t& k,
                  const std::vector<std::string>& items) {
  os << "[";
  for (int64_t i = 0; i < s[d]; ++i) {
    if (i) os << ", ";
    if (d + 1 == s.size())
      os << items[k++];
    else
      print_nested(os, s, d + 1, k, items);
  }
  os << "]";
}
}  // namespace

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "tensor(undefined)";
  runtime::SyncSite site("print");  // names the graph printing runs
  DType dt = t.dtype();
  std::vector<std::string> items;
  if (is_floating(dt)) {
    std::vector<double> v = t.to_vector<double>();
    Format f = choose_format(v);
    for (double x : v) items.push_back(format_float(x, f));
  } else if (dt == DType::Bool) {
    for (bool x : t.to_vector<bool>()) items.push_back(x ? "True" : "False");
  } else {
    for (int64_t x : t.to_vector<int64_t>()) items.push_back(std::to_string(x));
  }
  os << "tensor(";
  const Shape& s = t.shape();
  if (s.empty()) {
    os << items[0];
  } else if (t.numel() == 0) {
    os << "[]";
    if (s.size() > 1) {
      os << ", size=(";
      for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
      os << ")";
    }
  } else {
    int64_t k = 0;
    print_nested(os, s, 0, k, items);
  }
  if (dt != DType::Float32 && dt != DType::Int64 && dt != DType::Bool) os << ", dtype=" << dt;
  return os << ")";
}

}  // namespace loom
