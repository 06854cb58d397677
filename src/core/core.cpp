// Implementations of the core vocabulary: dtype names and promotion, shapes, buffers,
// hashing output, configuration, and the internal-assertion handler.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <ostream>
#include <sstream>
#include <unordered_map>
#include <vector>

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
  if ((a == DType::BFloat16 && b == DType::Float16) ||
      (a == DType::Float16 && b == DType::BFloat16))
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
               " is out of range for a tensor of rank ", rank, ": expected an axis in [", lo, ", ",
               hi, "]");
  return axis < 0 ? axis + (rank == 0 ? 1 : rank) : axis;
}
std::string TensorType::str() const { return std::string(short_name(dtype)) + shape.str(); }
std::string type_change(const TensorType& before, const TensorType& after) {
  const char* what = before.dtype != after.dtype
                         ? (before.shape != after.shape ? "shape and dtype" : "dtype")
                         : "shape";
  return std::string("changed ") + what + ": " + before.str() + " -> " + after.str();
}
std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << s.str(); }
std::ostream& operator<<(std::ostream& os, const TensorType& t) { return os << t.str(); }

namespace {
// The caching pool: free blocks by exact size class (4 KiB granules), bounded in bytes. A
// block that does not fit under the bound evicts the free blocks of the least recently used
// classes first, so the pool follows the workload: sizes an earlier phase of the program
// used (another model, another batch) give way instead of keeping every later block out.
class Pool {
 public:
  static constexpr size_t kMinPooled = 64 << 10;
  static Pool& get() {
    static Pool* p = new Pool;  // never destroyed: buffers may be freed during exit
    return *p;
  }
  void* take(size_t cap) {
    std::lock_guard lock(mu_);
    auto it = free_.find(cap);
    if (it == free_.end() || it->second.blocks.empty()) return nullptr;
    void* p = it->second.blocks.back();
    it->second.blocks.pop_back();
    it->second.last_use = ++tick_;
    held_ -= cap;
    ++hits_;
    return p;
  }
  bool give(void* p, size_t cap) {
    std::lock_guard lock(mu_);
    if (cap > limit_ || !evict_locked(limit_ - cap, cap)) return false;
    Class& cls = free_[cap];
    cls.blocks.push_back(p);
    cls.last_use = ++tick_;
    held_ += cap;
    return true;
  }
  size_t held() {
    std::lock_guard lock(mu_);
    return held_;
  }
  size_t limit() {
    std::lock_guard lock(mu_);
    return limit_;
  }
  void set_limit(size_t bytes) {
    std::lock_guard lock(mu_);
    limit_ = bytes;
    evict_locked(limit_, 0);
  }
  size_t hits() {
    std::lock_guard lock(mu_);
    return hits_;
  }

 private:
  // LOOM_POOL_MB, else a quarter of the machine's memory (at least 1 GiB): a training step's
  // working set (the 50-layer decoder's forward and backward: about 2 GiB) must fit, and
  // two models or phases alternating should not evict each other on every step.
  Pool() {
    const char* v = std::getenv("LOOM_POOL_MB");
    if (v && *v) {
      limit_ = static_cast<size_t>(std::strtoull(v, nullptr, 10)) << 20;
    } else {
      const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
      const size_t ram =
          pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : 0;
      limit_ = std::max<size_t>(ram / 4, size_t{1} << 30);
    }
  }
  // Frees blocks of the least recently used classes other than `keep` until at most
  // `target` bytes are held; false when only blocks of `keep` are left above it.
  bool evict_locked(size_t target, size_t keep) {
    while (held_ > target) {
      Class* victim = nullptr;
      size_t victim_cap = 0;
      for (auto& [c, cls] : free_) {
        if (c == keep || cls.blocks.empty()) continue;
        if (!victim || cls.last_use < victim->last_use) victim = &cls, victim_cap = c;
      }
      if (!victim) return false;
      std::free(victim->blocks.back());
      victim->blocks.pop_back();
      held_ -= victim_cap;
    }
    return true;
  }
  struct Class {
    std::vector<void*> blocks;
    uint64_t last_use = 0;  // tick of the latest take or give
  };
  std::mutex mu_;
  std::unordered_map<size_t, Class> free_;
  size_t held_ = 0, hits_ = 0, limit_ = 0;
  uint64_t tick_ = 0;
};

// Small blocks (scalars, a scan's ys, an MLP's logits) stay with the freeing thread, a few per size
// class: reuse costs a few instructions, aligned_alloc and free far more (docs/architecture.md,
// "Measurements": SmallCache). Emptied at thread exit; later frees go to free.
class SmallCache {
 public:
  static constexpr size_t kMax = 16 << 10;
  static constexpr size_t kPerClass = 4;
  static constexpr size_t kMaxBytes = size_t{1} << 20;
  static SmallCache* mine() {
    thread_local bool gone = false;  // trivially destructible: readable during thread exit
    struct Holder {
      SmallCache cache;
      bool* gone;
      ~Holder() {
        *gone = true;
        cache.clear();
      }
    };
    if (gone) return nullptr;
    thread_local Holder h{{}, &gone};
    return &h.cache;
  }
  void* take(size_t cap) {
    Class& c = classes_[index(cap)];
    if (c.n == 0) return nullptr;
    held_ -= cap;
    return c.blocks[--c.n];
  }
  bool give(void* p, size_t cap) {
    Class& c = classes_[index(cap)];
    if (c.n == kPerClass || held_ + cap > kMaxBytes) return false;
    c.blocks[c.n++] = p;
    held_ += cap;
    return true;
  }

 private:
  struct Class {
    void* blocks[kPerClass];
    size_t n = 0;
  };
  static size_t index(size_t cap) { return cap / Buffer::kAlignment - 1; }
  void clear() {
    for (Class& c : classes_)
      while (c.n > 0) std::free(c.blocks[--c.n]);
    held_ = 0;
  }
  Class classes_[kMax / Buffer::kAlignment];
  size_t held_ = 0;
};

size_t size_class(size_t nbytes) {
  size_t granule = nbytes >= Pool::kMinPooled ? 4096 : Buffer::kAlignment;
  size_t r = (nbytes + granule - 1) / granule * granule;
  return r == 0 ? Buffer::kAlignment : r;
}
}  // namespace

namespace {
std::atomic<int64_t> live_bytes_now{0}, live_bytes_peak{0};
void count_live(int64_t delta) {
  int64_t now = live_bytes_now.fetch_add(delta, std::memory_order_relaxed) + delta;
  int64_t peak = live_bytes_peak.load(std::memory_order_relaxed);
  while (now > peak &&
         !live_bytes_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}
}  // namespace

Buffer::Storage::~Storage() {
  if (owner || !ptr) return;  // foreign memory (releasing `owner` frees it), or a failed allocation
  count_live(-static_cast<int64_t>(capacity));
  if (capacity >= Pool::kMinPooled && Pool::get().give(ptr, capacity)) return;
  if (capacity <= SmallCache::kMax)
    if (SmallCache* c = SmallCache::mine(); c && c->give(ptr, capacity)) return;
  std::free(ptr);
}

Buffer Buffer::allocate_uninitialized(size_t nbytes) {
  Buffer b;
  b.storage_ = std::make_shared<Storage>();
  size_t cap = size_class(nbytes);
  void* p = nullptr;
  if (cap >= Pool::kMinPooled) {
    p = Pool::get().take(cap);
  } else if (cap <= SmallCache::kMax) {
    if (SmallCache* c = SmallCache::mine()) p = c->take(cap);
  }
  if (!p) p = std::aligned_alloc(kAlignment, cap);
  if (!p) throw ExecError(detail::str_cat("[buffer] cannot allocate ", nbytes, " bytes"));
  b.storage_->ptr = p;
  b.storage_->nbytes = nbytes;
  b.storage_->capacity = cap;
  count_live(static_cast<int64_t>(cap));
  return b;
}

Buffer Buffer::wrap(void* data, size_t nbytes, std::shared_ptr<void> owner) {
  LOOM_CHECK(owner != nullptr, "[buffer] wrap needs an owner that keeps the memory alive");
  Buffer b;
  b.storage_ = std::make_shared<Storage>();
  b.storage_->ptr = data;
  b.storage_->nbytes = nbytes;
  b.storage_->owner = std::move(owner);
  return b;
}

Buffer Buffer::allocate(size_t nbytes) {
  Buffer b = allocate_uninitialized(nbytes);
  std::memset(b.data(), 0, b.storage_->capacity);
  return b;
}

size_t Buffer::pool_free_bytes() { return Pool::get().held(); }
size_t Buffer::pool_limit() { return Pool::get().limit(); }
void Buffer::set_pool_limit(size_t bytes) { Pool::get().set_limit(bytes); }
size_t Buffer::pool_hits() { return Pool::get().hits(); }
size_t Buffer::live_bytes() { return static_cast<size_t>(live_bytes_now.load()); }
size_t Buffer::peak_bytes() { return static_cast<size_t>(live_bytes_peak.load()); }
void Buffer::reset_peak() { live_bytes_peak.store(live_bytes_now.load()); }

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
    c.flush_denormal = env_int("LOOM_FLUSH_DENORMAL", 1) != 0;
    c.dump_ir_dir = env_str("LOOM_DUMP_IR");
    c.backend = env_str("LOOM_BACKEND");
    c.cache_size = std::max<int64_t>(1, env_int("LOOM_CACHE_SIZE", 1024));
    c.cache_dir = env_str("LOOM_CACHE_DIR");
    c.cache_dir_mb = std::max<int64_t>(1, env_int("LOOM_CACHE_DIR_MB", 1024));
    c.explain_recompiles = env_int("LOOM_EXPLAIN_RECOMPILES", 0) != 0;
    c.check_purity = env_int("LOOM_CHECK_PURITY", 0) != 0;
    return c;
  }();
  return cfg;
}

namespace detail {
std::string file_line(const CallSite& site) {
  std::string_view file = site.file;
  file = file.substr(file.find_last_of('/') + 1);  // npos + 1 == 0: no slash, the whole name
  return std::string(file) + ":" + std::to_string(site.line);
}

namespace {
std::atomic<WarningHandler> warning_handler{nullptr};
}
void set_warning_handler(WarningHandler handler) { warning_handler.store(handler); }
void warn(const std::string& message) {
  if (WarningHandler h = warning_handler.load()) return h(message);
  std::fprintf(stderr, "[loom] warning: %s\n", message.c_str());
}

namespace {
std::atomic<UserSiteHook> user_site_hook{nullptr};
thread_local const CallSite* outermost_site = nullptr;
}  // namespace

void set_user_site_hook(UserSiteHook hook) { user_site_hook.store(hook); }

UserSite::UserSite(const CallSite& loc) {
  if (outermost_site) return;
  outermost_site = &loc;
  set_ = true;
}
UserSite::~UserSite() {
  if (set_) outermost_site = nullptr;
}

CallSite user_site(const CallSite& loc) {
  if (UserSiteHook hook = user_site_hook.load(std::memory_order_relaxed))
    if (std::optional<CallSite> s = hook()) return *s;
  return outermost_site ? *outermost_site : loc;
}

void assert_fail(const char* cond, const char* file, int line) {
  std::fprintf(stderr, "loom internal error: %s:%d: assertion failed: %s\n", file, line, cond);
  std::abort();
}
}  // namespace detail

}  // namespace loom
