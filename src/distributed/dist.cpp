// init from the environment or options, the process's communicator, run_in_process.
#include "loom/dist/dist.h"

#include <cstdlib>
#include <cstring>
#include <thread>

#include "loom/core/error.h"
#include "loom/runtime/dist_check.h"

namespace loom::dist {

namespace {

using loom::detail::str_cat;

int env_int(const char* name, int fallback) {
  const char* s = std::getenv(name);
  if (!s || !*s) return fallback;
  char* end = nullptr;
  long v = std::strtol(s, &end, 10);
  LOOM_CHECK_T(DistError, end && *end == 0 && v >= 0, "[init] ", name, "='", s,
               "' is not a non-negative integer");
  return static_cast<int>(v);
}

// A one-rank world: every collective is the identity.
class SoloCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string_view kind() const override { return "solo"; }
  void all_reduce(void*, int64_t, DType, ReduceOp) override {}
  void all_gather(const void* in, void* out, int64_t bytes) override {
    if (bytes) std::memcpy(out, in, static_cast<size_t>(bytes));
  }
  void broadcast(void*, int64_t, int) override {}
  void barrier() override {}
  std::vector<std::string> exchange(std::string_view mine) override { return {std::string(mine)}; }
};

}  // namespace

void init() { init(InitOptions{}); }

void init(const InitOptions& options) {
  InitOptions o = options;
  if (o.rank < 0) o.rank = env_int("LOOM_RANK", 0);
  if (o.world_size < 0) o.world_size = env_int("LOOM_WORLD_SIZE", 1);
  LOOM_CHECK_T(DistError, o.world_size >= 1 && o.rank < o.world_size, "[init] rank ", o.rank,
               " is not in a world of ", o.world_size);
  if (o.world_size == 1) {
    auto c = std::make_shared<SoloCommunicator>();
    if (o.timeout_s > 0)
      c->set_timeout(std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000)));
    set_communicator(std::move(c));
    return;
  }
  set_communicator(make_gloo_communicator(o));
}

void finalize() { set_communicator(nullptr); }
bool initialized() { return current() != nullptr; }
int rank() {
  Communicator* c = current();
  return c ? c->rank() : 0;
}
int world_size() {
  Communicator* c = current();
  return c ? c->size() : 1;
}

void barrier() {
  Communicator& c = require("barrier");
  runtime::check_sync_point(c, {"barrier", "barrier()", ""});
}

std::vector<std::exception_ptr> run_in_process(int n, const std::function<void(int)>& fn,
                                               std::chrono::milliseconds timeout) {
  std::vector<std::shared_ptr<Communicator>> group = in_process_group(n, timeout);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      ThreadCommunicator scope(group[static_cast<size_t>(r)]);
      try {
        fn(r);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return errors;
}

}  // namespace loom::dist
