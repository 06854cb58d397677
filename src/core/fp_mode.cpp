// The run's floating-point mode (loom/core/fp_mode.h): DAZ and FTZ in x86's MXCSR.
#include "loom/core/fp_mode.h"

#include <atomic>

#if defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>
#define LOOM_HAVE_MXCSR 1
#endif

#include "loom/core/config.h"

namespace loom {

namespace {
#ifdef LOOM_HAVE_MXCSR
constexpr uint32_t kFlushBits = 0x8040;    // FTZ (bit 15) | DAZ (bit 6)
constexpr uint32_t kControlBits = 0xffc0;  // bits 0-5 are the sticky exception flags
#else
constexpr uint32_t kFlushBits = 0;
#endif

std::atomic<bool>& flush_setting() {
  static std::atomic<bool> on{config().flush_denormal};
  return on;
}
}  // namespace

bool set_flush_denormal(bool on) { return flush_setting().exchange(on); }
bool flush_denormal() { return flush_setting().load(std::memory_order_relaxed); }

namespace detail {

uint32_t fp_control() {
#ifdef LOOM_HAVE_MXCSR
  return _mm_getcsr() & kControlBits;
#else
  return 0;
#endif
}

void set_fp_control(uint32_t word) {
#ifdef LOOM_HAVE_MXCSR
  _mm_setcsr((_mm_getcsr() & ~kControlBits) | (word & kControlBits));
#else
  (void)word;
#endif
}

FpModeScope::FpModeScope() : saved_(fp_control()) {
  uint32_t want = flush_denormal() ? (saved_ | kFlushBits) : (saved_ & ~kFlushBits);
  changed_ = want != saved_;
  if (changed_) set_fp_control(want);
}

FpModeScope::~FpModeScope() {
  if (changed_) set_fp_control(saved_);
}

}  // namespace detail
}  // namespace loom
