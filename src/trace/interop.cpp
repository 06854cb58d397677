// Foreign memory in and out of tensors (loom/trace/interop.h).
#include "loom/trace/interop.h"

#include "context.h"
#include "loom/runtime/sync.h"
#include "loom/trace/sharding.h"
#include "ops_impl.h"

namespace loom {

Tensor tensor_from_buffer(Buffer buffer, Shape shape, DType dtype) {
  size_t need = static_cast<size_t>(shape.numel() * itemsize(dtype));
  LOOM_CHECK_T(ShapeError, buffer.nbytes() >= need, "[tensor_from_buffer] a ", name(dtype),
               " tensor of shape ", shape, " needs ", need, " bytes, the buffer holds ",
               buffer.nbytes());
  return detail::from_buffer(std::move(buffer), TensorType{dtype, std::move(shape)});
}

Buffer tensor_buffer(const Tensor& t, std::source_location loc) {
  LOOM_CHECK(t.defined(), "[tensor_buffer] called on an undefined (default-constructed) Tensor");
  detail::TensorImpl& impl = *t.impl();
  auto& ctx = detail::TraceContext::get();
  ctx.check_readable("tensor_buffer");
  if (impl.error) [[unlikely]]
    std::rethrow_exception(impl.error);  // its run failed: the error again, not a zero buffer
  if (impl.pending() && !impl.buffer.defined()) {
    runtime::SyncSite site(detail::user_site(loc));
    ctx.materialize({&impl});
  }
  if (impl.sharding) [[unlikely]]
    return dist::full(t).impl()->buffer;  // this rank holds a block: the whole value
  return impl.buffer;
}

}  // namespace loom
