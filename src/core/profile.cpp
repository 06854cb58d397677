// Profile: per-thread event buffers, the Chrome trace writer (nlohmann/json, so names and
// arguments are escaped and invalid UTF-8 replaced), LOOM_PROFILE at start-up.
#include "loom/core/profile.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <vector>

#include "loom/core/error.h"

namespace loom::profile {

namespace detail {
std::atomic<bool> g_enabled{false};
}

namespace {

// Bounds the memory a long profiled run takes (an event is ~80 bytes).
constexpr int64_t kMaxEvents = 4 << 20;

struct Event {
  const char* cat;
  std::string name, args;
  double ts, dur;
};

// One thread's events. The owner appends under `mu` (uncontended except during a flush).
struct ThreadEvents {
  std::mutex mu;
  int tid = 0;
  std::string name;
  std::vector<Event> events;
};

struct Registry {
  std::mutex mu;
  std::vector<std::shared_ptr<ThreadEvents>> threads;
  std::string path;
  std::atomic<int64_t> count{0}, dropped{0};
  bool atexit_registered = false;
  const std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
};

// Never destroyed: threads still running at exit (the CPU backend's pool workers, a user's
// detached threads) may register or record after static destruction began.
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

ThreadEvents& this_thread_events() {
  thread_local std::shared_ptr<ThreadEvents> mine = [] {
    auto t = std::make_shared<ThreadEvents>();
    Registry& r = registry();
    std::lock_guard lock(r.mu);
    t->tid = static_cast<int>(r.threads.size()) + 1;
    t->name = t->tid == 1 ? "main" : "thread " + std::to_string(t->tid);
    r.threads.push_back(t);
    return t;
  }();
  return *mine;
}

using Json = nlohmann::json;

// Compact, with bytes that are not UTF-8 replaced (U+FFFD): the file always parses.
std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

// An event's arguments: the recorded JSON object's inside, or the text as one string when it
// does not parse.
Json args_of(const std::string& args) {
  Json j = Json::parse("{" + args + "}", nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Json{{"args", args}};
  return j;
}

void append_event(std::string& out, const Event& e, int tid) {
  Json j = {{"ph", "X"},    {"pid", 1},     {"tid", tid},    {"ts", e.ts},
            {"dur", e.dur}, {"cat", e.cat}, {"name", e.name}};
  if (!e.args.empty()) j["args"] = args_of(e.args);
  out += ",\n";
  out += dump(j);
}

void at_exit() { flush(); }

// LOOM_PROFILE=path starts recording before main (this file is linked whenever anything
// checks enabled(), which reads g_enabled defined here).
const bool g_from_env = [] {
  const char* p = std::getenv("LOOM_PROFILE");
  if (p && *p) start(p);
  return true;
}();

}  // namespace

double now_us() {
  using namespace std::chrono;
  return duration<double, std::micro>(steady_clock::now() - registry().t0).count();
}

void record(const char* cat, std::string name, double start_us, double end_us, std::string args) {
  if (!enabled()) return;
  Registry& r = registry();
  if (r.count.fetch_add(1, std::memory_order_relaxed) >= kMaxEvents) {
    r.count.fetch_sub(1, std::memory_order_relaxed);
    r.dropped.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  ThreadEvents& t = this_thread_events();
  std::lock_guard lock(t.mu);
  t.events.push_back(Event{cat, std::move(name), std::move(args), start_us, end_us - start_us});
}

void name_thread(std::string name) {
  ThreadEvents& t = this_thread_events();
  std::lock_guard lock(t.mu);
  t.name = std::move(name);
}

void start(const std::string& p) {
  LOOM_CHECK(!p.empty(), "[profile] start: expected a file path, got an empty string");
  Registry& r = registry();
  {
    std::lock_guard lock(r.mu);
    r.path = p;
    if (!r.atexit_registered) {
      r.atexit_registered = true;
      std::atexit(at_exit);
    }
  }
  detail::g_enabled.store(true, std::memory_order_release);
}

bool flush() {
  Registry& r = registry();
  std::string file;
  std::vector<std::shared_ptr<ThreadEvents>> threads;
  {
    std::lock_guard lock(r.mu);
    file = r.path;
    threads = r.threads;
  }
  if (file.empty()) return false;
  // One event per line, written as it goes (a trace can hold millions of events).
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  out += dump({{"ph", "M"},
               {"pid", 1},
               {"tid", 0},
               {"name", "process_name"},
               {"args", {{"name", "loom"}}}});
  for (const auto& t : threads) {
    std::lock_guard lock(t->mu);
    out += ",\n";
    out += dump({{"ph", "M"},
                 {"pid", 1},
                 {"tid", t->tid},
                 {"name", "thread_name"},
                 {"args", {{"name", t->name}}}});
    for (const Event& e : t->events) append_event(out, e, t->tid);
  }
  out += "\n],\"otherData\":{\"dropped_events\":" + std::to_string(r.dropped.load()) + "}}\n";
  std::string tmp = file + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  bool ok = f && std::fwrite(out.data(), 1, out.size(), f) == out.size();
  if (f) ok = (std::fclose(f) == 0) && ok;
  ok = ok && std::rename(tmp.c_str(), file.c_str()) == 0;
  if (!ok) {
    std::remove(tmp.c_str());
    std::fprintf(stderr, "loom: cannot write the profile %s\n", file.c_str());
  }
  return ok;
}

void stop() {
  flush();
  detail::g_enabled.store(false, std::memory_order_release);
  Registry& r = registry();
  std::vector<std::shared_ptr<ThreadEvents>> threads;
  {
    std::lock_guard lock(r.mu);
    r.path.clear();
    threads = r.threads;
  }
  for (const auto& t : threads) {
    std::lock_guard lock(t->mu);
    t->events.clear();
  }
  r.count = 0;
  r.dropped = 0;
}

std::string path() {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  return r.path;
}

int64_t event_count() { return registry().count.load(); }

void Scope::begin(const char* cat, std::string name) {
  cat_ = cat;
  name_ = std::move(name);
  start_ = now_us();
}

void Scope::end() { record(cat_, std::move(name_), start_, now_us(), std::move(args_)); }

std::string json_quote(std::string_view s) { return dump(Json(std::string(s))); }

}  // namespace loom::profile
