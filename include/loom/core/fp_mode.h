// The floating-point mode compiled code runs in: denormals flushed to zero, or IEEE.
//
// While a compiled graph runs (on any backend, on the calling thread and on every pool
// thread that takes part), float and double denormals read as zero and denormal results are
// written as zero: x86's DAZ and FTZ bits, as TensorFlow and XLA (so JAX) set them in their
// threads. On Intel cores an FMA with a denormal operand takes a microcode assist that costs
// about 100x a plain one: the seed decoder's backward, whose GELU gradients reach the denormal
// range, ran 1313 ms a step in IEEE mode and 641 ms flushed on a Xeon with AVX-512
// (loom-bench decoder_train_step; the same step on a Zen 5 took 428 ms before this mode
// existed, no such stall: AMD's cores take denormals at about full speed). Results differ only
// where a value is below the smallest normal number (1.2e-38 in float32; bfloat16 has the
// same range; float16 values are computed in float32, where they are normal).
//
//   bool was = loom::set_flush_denormal(false);  // IEEE gradual underflow from now on
//
// The default is on; LOOM_FLUSH_DENORMAL=0 makes it off. The setting is the process's (read
// at the start of every run); host code outside loom's runs keeps the thread's own mode.
// Thread-safe. On CPUs without these bits (not x86-64) the mode is always IEEE.
#pragma once

#include <cstdint>

namespace loom {

// Sets whether runs flush denormals to zero; returns the previous setting (torch's name).
bool set_flush_denormal(bool on);
bool flush_denormal();

namespace detail {
// The calling thread's floating-point control bits (x86: MXCSR's rounding, masks, DAZ and FTZ,
// not its exception flags; 0 elsewhere) and their setter.
uint32_t fp_control();
void set_fp_control(uint32_t word);
// Puts the calling thread in the process's flush mode for a run; restores the word at exit.
class FpModeScope {
 public:
  FpModeScope();
  ~FpModeScope();
  FpModeScope(const FpModeScope&) = delete;
  FpModeScope& operator=(const FpModeScope&) = delete;

 private:
  uint32_t saved_;
  bool changed_;
};
}  // namespace detail

}  // namespace loom
