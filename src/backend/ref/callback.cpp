// The reference kernel of pure_callback: the host function called on the operands' arrays.
#include <vector>

#include "backend/ref/ref_impl.h"
#include "loom/core/host_callback.h"

namespace loom::detail::ref {

namespace {

void pure_callback_kernel(const ir::Node& n, std::span<const backend::Executable* const>,
                          std::span<const Array> in, std::span<Array> out) {
  std::vector<HostArray> args;
  args.reserve(in.size());
  for (const Array& a : in) args.push_back(HostArray{a.type, a.buf});
  std::vector<TensorType> want;
  std::vector<void*> ptrs;
  for (Array& o : out) {
    want.push_back(o.type);
    ptrs.push_back(o.buf.data());
  }
  call_host_callback(n.attrs.i, args, want, ptrs);
}

}  // namespace

void register_callback_kernels(KernelTable& t) {
  t.set(ir::OpKind::PureCallback, pure_callback_kernel);
}

}  // namespace loom::detail::ref
