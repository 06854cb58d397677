// Profile: a Chrome trace (Perfetto, chrome://tracing) of tracing, compiling, executing and
// every kernel and matrix call, across threads.
//
//   LOOM_PROFILE=run.json ./train       // written at process exit
//   loom::profile::start("run.json"); ...; loom::profile::flush();
//
// Events are "X" (complete) events with the thread that ran them; each thread appends to its
// own buffer, so recording takes no shared lock. When profiling is off, instrumented code
// pays one predictable branch on a relaxed atomic load (`enabled()`), nothing else.
// Thread-safety: every function may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace loom::profile {

namespace detail {
extern std::atomic<bool> g_enabled;
}

inline bool enabled() { return detail::g_enabled.load(std::memory_order_relaxed); }

// Microseconds since the process started (steady clock): the trace's time base.
double now_us();
// Records a complete event [start_us, end_us] on the calling thread. `cat` must be a string
// literal ("kernel", "compile", ...); `args`, when not empty, is a JSON object's inside
// (`"fingerprint": "ab12"`), already escaped.
void record(const char* cat, std::string name, double start_us, double end_us,
            std::string args = {});
// Names the calling thread in the trace ("loom worker 1").
void name_thread(std::string name);

// Starts recording into `path` (written by flush() and at process exit); LOOM_PROFILE=path
// does this at start-up. Throws loom::Error when path is empty.
void start(const std::string& path);
// Writes every event recorded so far to the file (replacing it); returns false (and says why
// on stderr) when the file cannot be written. Recording goes on.
bool flush();
// Flushes, then stops recording and drops the events.
void stop();
// The file being recorded into ("" when off).
std::string path();
// Events recorded so far (all threads) and events dropped because the buffer was full.
int64_t event_count();

// Records the span from construction to destruction when profiling is on.
class Scope {
 public:
  Scope(const char* cat, const char* name) {
    if (enabled()) [[unlikely]]
      begin(cat, name);
  }
  template <class NameFn>
  Scope(const char* cat, NameFn&& name_fn) {
    if (enabled()) [[unlikely]]
      begin(cat, name_fn());
  }
  ~Scope() {
    if (cat_) [[unlikely]]
      end();
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
  // Extra JSON arguments shown with the event (only used when profiling).
  void set_args(std::string args) { args_ = std::move(args); }
  bool active() const { return cat_ != nullptr; }

 private:
  void begin(const char* cat, std::string name);
  void end();
  const char* cat_ = nullptr;
  std::string name_, args_;
  double start_ = 0;
};

// A JSON string literal for `s` (quotes included), for event arguments.
std::string json_quote(std::string_view s);

}  // namespace loom::profile
