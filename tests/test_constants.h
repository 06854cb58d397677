// Special values the tests compare against (NaN, infinities, integer extremes), defined once
// for every suite; the suites' namespaces bring in the ones they use.
#pragma once

#include <cstdint>
#include <limits>

namespace loom::testing {

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
inline constexpr double kInf = std::numeric_limits<double>::infinity();
inline constexpr int64_t kI32Min = std::numeric_limits<int32_t>::min();
inline constexpr int64_t kI32Max = std::numeric_limits<int32_t>::max();
inline constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();
inline constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();

}  // namespace loom::testing
