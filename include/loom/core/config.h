// Config: environment knobs, read once per process on first use.
//   LOOM_DEBUG=1     log each compile (fingerprint, size, time) to stderr
//   LOOM_DUMP_IR=dir write each compiled graph's IR (before and after the passes, and after
//                    each pass) and a Graphviz picture into dir
//   LOOM_BACKEND=ref select the backend ("ref"; later backends add names)
//   LOOM_CACHE_SIZE  entries of the in-memory compile cache (default 1024)
//   LOOM_CACHE_DIR   directory of the persistent (on-disk) cache of compiled code
//   LOOM_CACHE_DIR_MB  size bound of that directory in MiB (LRU; default 1024)
//   LOOM_EXPLAIN_RECOMPILES=1  print why each graph compiled again to stderr
//   LOOM_PROFILE=file.json  write a Chrome trace at exit (read in loom/core/profile.cpp)
//   LOOM_FLUSH_DENORMAL=0  runs keep IEEE denormals (default: flushed; loom/core/fp_mode.h)
//   LOOM_VECTOR_WIDTH=256|512  vector width of generated loops (default: 512 where the CPU
//                    has AVX-512; read by the CPU backend's Jit, src/backend/cpu/jit.cpp)
//   LOOM_CHECK_PURITY=1  assume_pure re-traces on every cache hit and raises a TraceError
//                    when the function traced differently (slow; for debugging)
// Thread-safe: initialized once, then read-only.
#pragma once

#include <cstdint>
#include <string>

namespace loom {

struct Config {
  int debug = 0;
  std::string dump_ir_dir;
  std::string backend;
  int64_t cache_size = 1024;
  std::string cache_dir;
  int64_t cache_dir_mb = 1024;
  bool explain_recompiles = false;
  bool check_purity = false;
  bool flush_denormal = true;  // the initial set_flush_denormal (loom/core/fp_mode.h)
};

const Config& config();

}  // namespace loom
