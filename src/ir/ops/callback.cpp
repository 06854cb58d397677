// The type rule of pure_callback: its results are the types its attribute declares.
#include "infer_impl.h"
#include "loom/core/host_callback.h"

namespace loom::ir::detail {

std::vector<TensorType> infer_pure_callback(const Graph& g, std::span<const Value> xs,
                                            const Attrs& a) {
  (void)g;
  (void)xs;
  LOOM_CHECK(loom::detail::host_callback_exists(a.i), "[pure_callback] no host callback #", a.i,
             " is registered in this process");
  std::vector<TensorType> out;
  const auto& t = a.ints;
  for (size_t k = 0; k < t.size();) {
    LOOM_CHECK(k + 2 <= t.size() && t[k] >= 0 && t[k] < kNumDTypes && t[k + 1] >= 0 &&
                   t[k + 1] <= 16 && t[k + 1] <= static_cast<int64_t>(t.size() - k - 2),
               "[pure_callback] types must be [dtype, rank, extents...] per result, got a "
               "malformed entry at ",
               k);
    const auto rank = static_cast<size_t>(t[k + 1]);
    TensorType type{static_cast<DType>(t[k]),
                    Shape(t.begin() + static_cast<std::ptrdiff_t>(k + 2),
                          t.begin() + static_cast<std::ptrdiff_t>(k + 2 + rank))};
    check_shape("pure_callback", type.shape);
    out.push_back(std::move(type));
    k += 2 + rank;
  }
  LOOM_CHECK(!out.empty(), "[pure_callback] declares no results; a callback returns at least one");
  return out;
}

}  // namespace loom::ir::detail
