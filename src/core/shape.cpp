// loom's limits on shapes, checked wherever a shape comes from the user or a file.
#include "loom/core/shape.h"

#include "loom/core/error.h"

namespace loom {

void check_shape(const char* op, const Shape& s) {
  constexpr int64_t kMaxElems = int64_t{1} << 48;
  LOOM_CHECK_T(ShapeError, s.size() <= 16, "[", op, "] rank ", s.size(),
               " exceeds the supported maximum of 16");
  int64_t n = 1;
  for (int64_t d : s) {
    LOOM_CHECK_T(ShapeError, d >= 0, "[", op, "] shape ", s, " has a negative extent");
    if (d != 0 && n > kMaxElems / d) {
      n = kMaxElems + 1;
    } else {
      n *= d;
    }
  }
  LOOM_CHECK_T(ShapeError, n <= kMaxElems, "[", op, "] shape ", s,
               " has too many elements (limit 2^48)");
}

}  // namespace loom
