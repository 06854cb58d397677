// Reference kernels of the random ops. Element e of rand_uniform / rand_normal with key
// {seed, offset} is philox_uniform / philox_normal(seed, offset, e) from core/philox.h,
// rounded once to the result dtype, so results do not depend on how a backend splits work.
#include "backend/ref/ref_impl.h"
#include "loom/core/error.h"
#include "loom/core/philox.h"

namespace loom::detail::ref {

namespace {

using ir::OpKind;

void random_kernel(const ir::Node& node, std::span<const Array> in, Array& out) {
  const Array& key = in[0];
  LOOM_ASSERT(key.numel() == 2);
  const uint64_t seed = static_cast<uint64_t>(key.get_i(0));
  const uint64_t offset = static_cast<uint64_t>(key.get_i(1));
  const bool normal = node.op == OpKind::RandNormal;
  for (int64_t e = 0; e < out.numel(); ++e) {
    const uint64_t ue = static_cast<uint64_t>(e);
    out.set_f(e, normal ? philox_normal(seed, offset, ue) : philox_uniform(seed, offset, ue));
  }
}

}  // namespace

void register_random_kernels(KernelTable& t) {
  t.set(OpKind::RandUniform, random_kernel);
  t.set(OpKind::RandNormal, random_kernel);
}

}  // namespace loom::detail::ref
