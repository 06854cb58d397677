// Implementations of the core vocabulary: dtype names and promotion, shapes, buffers,
// hashing output, configuration, and the internal-assertion handler.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <limits>
#include <ostream>
#include <sstream>

#include "loom/core/buffer.h"
#include "loom/core/config.h"
#include "loom/core/error.h"
#include "loom/core/hash.h"
#include "loom/core/shape.h"

namespace loom {

namespace {
constexpr std::string_view kShortNames[kNumDTypes] = {"bool", "i32", "i64", "bf16",
                                                      "f16",  "f32", "f64"};
constexpr std::string_view kLongNames[kNumDTypes] = {"bool",    "int32",   "int64",  "bfloat16",
                                                     "float16", "float32", "float64"};
}  // namespace

std::string_view short_name(DType t) { return kShortNames[static_cast<int>(t)]; }
std::string_view name(DType t) { return kLongNames[static_cast<int>(t)]; }
bool parse_dtype(std::string_view text, DType* out) {
  for (int i = 0; i < kNumDTypes; ++i) {
    if (kShortNames[i] == text) {
      *out = static_cast<DType>(i);
      return true;
    }
  }
  return false;
}
DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if ((a == DType::BFloat16 && b == DType::Float16) || (a == DType::Float16 && b == DType::BFloat16))
    return DType::Float32;
  return a > b ? a : b;  // enum order is bool < i32 < i64 < bf16 < f16 < f32 < f64
}
std::ostream& operator<<(std::ostream& os, DType t) { return os << name(t); }

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int64_t d : dims_) n *= d;
  return n;
}
std::string Shape::str() const {
  std::string s = "[";
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(dims_[i]);
  }
  return s + "]";
}
std::vector<int64_t> contiguous_strides(const Shape& s) {
  std::vector<int64_t> st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}
int64_t normalize_axis(const char* op, int64_t axis, int64_t rank) {
  int64_t lo = rank == 0 ? -1 : -rank, hi = rank == 0 ? 0 : rank - 1;
  LOOM_CHECK_T(ShapeError, axis >= lo && axis <= hi, "[", op, "] axis ", axis,
               " is out of range for a tensor of rank ", rank, ": expected an axis in [", lo,
               ", ", hi, "]");
  return axis < 0 ? axis + (rank == 0 ? 1 : rank) : axis;
}
std::string TensorType::str() const { return std::string(short_name(dtype)) + shape.str(); }
std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << s.str(); }
std::ostream& operator<<(std::ostream& os, const TensorType& t) { return os << t.str(); }

Buffer::Storage::~Storage() { std::free(ptr); }
Buffer Buffer::allocate(size_t nbytes) {
  Buffer b;
  b.storage_ = std::make_shared<Storage>();
  size_t rounded = (nbytes + kAlignment - 1) / kAlignment * kAlignment;
  if (rounded == 0) rounded = kAlignment;
  b.storage_->ptr = std::aligned_alloc(kAlignment, rounded);
  if (!b.storage_->ptr) throw ExecError(detail::str_cat("[buffer] cannot allocate ", nbytes, " bytes"));
  std::memset(b.storage_->ptr, 0, rounded);
  b.storage_->nbytes = nbytes;
  return b;
}

std::string Hash128::hex() const {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(hi),
                static_cast<unsigned long long>(lo));
  return buf;
}

namespace {
int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 10);
  return (end && *end == 0) ? x : fallback;
}
std::string env_str(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}
}  // namespace

const Config& config() {
  static const Config cfg = [] {
    Config c;
    c.debug = static_cast<int>(env_int("LOOM_DEBUG", 0));
    c.dump_ir_dir = env_str("LOOM_DUMP_IR");
    c.backend = env_str("LOOM_BACKEND");
    c.cache_size = std::max<int64_t>(1, env_int("LOOM_CACHE_SIZE", 1024));
    c.cache_dir = env_str("LOOM_CACHE_DIR");
    return c;
  }();
  return cfg;
}

namespace detail {
void assert_fail(const char* cond, const char* file, int line) {
  std::fprintf(stderr, "loom internal error: %s:%d: assertion failed: %s\n", file, line, cond);
  std::abort();
}
}  // namespace detail

}  // namespace loom
