// Threads: compiles on several threads at once with a cold cache (every round asks for kernels
// no earlier round compiled, and the persistent cache is off), assume_pure wrappers and
// compile steps shared by threads from their first call, and every cross-thread misuse of a
// pending tensor (a TraceError naming the rule), and pending tensors whose last handle is
// dropped on a thread other than their owner's (while the owner traces and syncs, on many
// threads at once, after the owner exited). Oracles: the same programs run on one thread
// on the reference backend, and closed forms.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <functional>
#include <latch>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "expect_error.h"
#include "loom/backend/disk_cache.h"
#include "loom/loom.h"
#include "loom/runtime/engine.h"
#include "trace/context.h"  // the owner's pending list, to see a dropped tensor leave it

namespace loom {
namespace {

constexpr int kRounds = 40;
constexpr int kThreads = 4;
constexpr const char* kRule = "pending in the trace of another thread";

// Runs fn(0..n-1) on n threads released together, so that their first compiles overlap.
void on_threads(int n, const std::function<void(int)>& fn) {
  std::latch go(n);
  std::vector<std::thread> ts;
  for (int k = 0; k < n; ++k)
    ts.emplace_back([&, k] {
      go.arrive_and_wait();
      fn(k);
    });
  for (auto& t : ts) t.join();
}

// Cold caches for every test: the persistent cache off (a warm directory would hide the
// race), the backend selected before the test restored after it.
class Threads : public ::testing::Test {
 protected:
  void SetUp() override {
    previous_dir_ = backend::DiskCache::instance().dir();
    backend::DiskCache::instance().set_dir("");
    previous_backend_ = std::string(runtime::current_backend().name());
  }
  void TearDown() override {
    runtime::set_backend(previous_backend_);
    backend::DiskCache::instance().set_dir(previous_dir_);
  }
  std::string previous_dir_, previous_backend_;
};

// Program (round, thread): elementwise math, a reduction, a softmax and a product, over
// extents that no other (round, thread) uses, so each compiles kernels nobody compiled yet.
// `shared`: every thread of the round runs the same program (the same kernels at once).
std::vector<float> program(int round, int thread, bool shared) {
  const int64_t id = shared ? round : kRounds + round * kThreads + thread;
  const int64_t n = 24 + id, m = 3 + id % 5;
  Tensor x = arange(0, static_cast<double>(n * m)) * (1.0 / static_cast<double>(n * m)) - 0.5;
  Tensor a = reshape(x, {n, m});
  Tensor h = tanh(a * 3.0) + exp(a) * 0.25 - sigmoid(a);
  Tensor s = softmax(h, 1);
  Tensor p = matmul(transpose(s, 0, 1), h);  // [m, m]
  Tensor r = sum(h * h, {1}) + max(a, {1});  // [n]
  std::vector<float> out = p.to_vector<float>();
  std::vector<float> rv = r.to_vector<float>();
  out.insert(out.end(), rv.begin(), rv.end());
  out.push_back(sum(gelu(x)).item<float>());
  return out;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t k = 0; k < got.size(); ++k)
    ASSERT_NEAR(got[k], want[k], 1e-4 * (1 + std::abs(want[k]))) << what << " element " << k;
}

// The trial's reproducer: the first compiles of the process (CTest runs each test in a
// process of its own), on two threads at once, same graph and different shapes.
TEST_F(Threads, FirstCompilesOfTheProcessOverlap) {
  runtime::set_backend("cpu");
  std::vector<float> got(4);
  on_threads(4, [&](int t) {
    const int64_t n = t < 2 ? 8 : 8 + t;
    got[t] = sum(tanh(ones({n})) * 2.0).item<float>();
  });
  for (int t = 0; t < 4; ++t) {
    const int64_t n = t < 2 ? 8 : 8 + t;
    EXPECT_NEAR(got[t], 2.0 * std::tanh(1.0) * static_cast<double>(n), 1e-5 * n);
  }
}

// The race above has one window per process (the JIT's first compiles), so the test is
// repeated in fresh processes: this binary, running only that test.
TEST(ThreadsProcesses, FirstCompilesOverlapInFreshProcesses) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::string filter = "--gtest_filter=Threads.FirstCompilesOfTheProcessOverlap";
  int failed = 0;
  std::string how;
  for (int r = 0; r < kRounds; ++r) {
    posix_spawn_file_actions_t io;
    posix_spawn_file_actions_init(&io);
    posix_spawn_file_actions_addopen(&io, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&io, 2, "/dev/null", O_WRONLY, 0);
    char* argv[] = {const_cast<char*>(self.c_str()), filter.data(), nullptr};
    pid_t pid = 0;
    ASSERT_EQ(posix_spawn(&pid, self.c_str(), &io, nullptr, argv, environ), 0);
    posix_spawn_file_actions_destroy(&io);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
    ++failed;
    how += WIFSIGNALED(status) ? " signal " + std::to_string(WTERMSIG(status))
                               : " exit " + std::to_string(WEXITSTATUS(status));
  }
  EXPECT_EQ(failed, 0) << "of " << kRounds << " processes:" << how;
}

TEST_F(Threads, ColdConcurrentCompilesMatchRef) {
  // The oracle: every program on this thread, on the reference interpreter.
  runtime::set_backend("ref");
  std::vector<std::vector<float>> want_own(kRounds * kThreads), want_shared(kRounds);
  for (int r = 0; r < kRounds; ++r) {
    want_shared[r] = program(r, 0, true);
    for (int t = 0; t < kThreads; ++t) want_own[r * kThreads + t] = program(r, t, false);
  }
  runtime::set_backend("cpu");
  for (int r = 0; r < kRounds; ++r) {
    std::vector<std::vector<float>> got_own(kThreads), got_shared(kThreads);
    on_threads(kThreads, [&](int t) {
      // Half the threads compile the shared program first, half their own: both overlap.
      if (t % 2) got_shared[t] = program(r, t, true);
      got_own[t] = program(r, t, false);
      if (t % 2 == 0) got_shared[t] = program(r, t, true);
    });
    for (int t = 0; t < kThreads; ++t) {
      std::string what = "round " + std::to_string(r) + " thread " + std::to_string(t);
      expect_close(got_own[t], want_own[r * kThreads + t], what + " (own program)");
      expect_close(got_shared[t], want_shared[r], what + " (shared program)");
    }
  }
}

// The same with the persistent cache on, in a fresh directory: threads store entries at
// once, the same key among them (the shared program).
TEST_F(Threads, ColdConcurrentCompilesWithPersistentCache) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("loom-threads-" + std::to_string(::getpid())))
          .string();
  std::filesystem::remove_all(dir);
  constexpr int kBase = 1000, kDiskRounds = 10;  // extents no other test uses
  runtime::set_backend("ref");
  std::vector<std::vector<float>> want_own(kDiskRounds * kThreads), want_shared(kDiskRounds);
  for (int r = 0; r < kDiskRounds; ++r) {
    want_shared[r] = program(kBase + r, 0, true);
    for (int t = 0; t < kThreads; ++t) want_own[r * kThreads + t] = program(kBase + r, t, false);
  }
  runtime::set_backend("cpu");
  backend::DiskCache::instance().set_dir(dir);
  const int64_t writes_before = backend::DiskCache::instance().stats().writes;
  for (int r = 0; r < kDiskRounds; ++r) {
    std::vector<std::vector<float>> got_own(kThreads), got_shared(kThreads);
    on_threads(kThreads, [&](int t) {
      got_shared[t] = program(kBase + r, t, true);
      got_own[t] = program(kBase + r, t, false);
    });
    for (int t = 0; t < kThreads; ++t) {
      std::string what = "round " + std::to_string(r) + " thread " + std::to_string(t);
      expect_close(got_own[t], want_own[r * kThreads + t], what + " (own program)");
      expect_close(got_shared[t], want_shared[r], what + " (shared program)");
    }
  }
  EXPECT_GT(backend::DiskCache::instance().stats().writes, writes_before);
  backend::DiskCache::instance().set_dir("");
  std::filesystem::remove_all(dir);
}

TEST_F(Threads, SharedAssumePureWrapperWorksCold) {
  runtime::set_backend("cpu");
  for (int r = 0; r < kRounds; ++r) {
    const double c = 1.0 + 0.01 * r;
    const int64_t n = 40 + r;  // fresh kernels every round
    // Captures c, so each round's wrapper has a cache of its own: its first calls trace cold.
    auto f = assume_pure([c](const Tensor& a) { return tanh(a) * c + a * a; });
    std::vector<std::vector<double>> got(kThreads);
    on_threads(kThreads, [&](int t) {
      for (int i = 0; i < 3; ++i) {
        const double v = 0.1 * (t + 1) + 0.01 * i;
        got[t].push_back(sum(f(full({n}, v))).item<float>());
      }
    });
    for (int t = 0; t < kThreads; ++t)
      for (int i = 0; i < 3; ++i) {
        const double v = 0.1 * (t + 1) + 0.01 * i;
        const double want = static_cast<double>(n) * (std::tanh(v) * c + v * v);
        ASSERT_NEAR(got[t][i], want, 1e-4 * want) << "round " << r << " thread " << t;
      }
  }
}

TEST_F(Threads, SharedCompileStepWorksCold) {
  runtime::set_backend("cpu");
  for (int r = 0; r < kRounds; ++r) {
    const double c = 2.0 + 0.01 * r;
    const int64_t n = 30 + r;
    for (bool trace_once : {false, true}) {
      auto step = compile([c](const Tensor& x) { return sum(tanh(x) * c); },
                          {.name = "shared" + std::to_string(r), .trace_once = trace_once});
      std::vector<std::vector<double>> got(kThreads);
      on_threads(kThreads, [&](int t) {
        for (int i = 0; i < 3; ++i)
          got[t].push_back(step(full({n}, 0.2 * t + 0.05 * i)).item<float>());
      });
      for (int t = 0; t < kThreads; ++t)
        for (int i = 0; i < 3; ++i) {
          const double want = static_cast<double>(n) * std::tanh(0.2 * t + 0.05 * i) * c;
          ASSERT_NEAR(got[t][i], want, 1e-4 * (1 + std::abs(want)))
              << "round " << r << " thread " << t << " trace_once " << trace_once;
        }
    }
  }
}

// ---- cross-thread misuse ----------------------------------------------------------------

// A materialized f32[n] tensor (from host data, not pending anywhere).
Tensor host(int64_t n, float v) {
  return tensor(std::vector<float>(static_cast<size_t>(n), v), {n});
}

// Runs fn on another thread and rethrows nothing: the checks run there.
void on_other_thread(const std::function<void()>& fn) {
  std::thread t(fn);
  t.join();
}

TEST_F(Threads, PendingTensorUsedOnAnotherThreadIsTraceError) {
  auto step =
      compile([](const Tensor& x) { return sum(x * 2.0); }, {.name = "misuse", .trace_once = true});
  EXPECT_FLOAT_EQ(step(host(3, 1)).item<float>(), 6.0f);  // recorded
  Tensor a = ones({3}) * 2.0;                             // pending here
  on_other_thread([&] {
    testing::expect_error<TraceError>([&] { (void)step(a); }, {"[compile]", kRule});
    testing::expect_error<TraceError>([&] { (void)(a + 1.0); },
                                      {kRule, "sync() it on that thread first", "f32[3]"});
    testing::expect_error<TraceError>([&] { (void)exp(a); }, {kRule});
    Tensor m = ones({3});
    testing::expect_error<TraceError>([&] { (void)matmul(reshape(m, {1, 3}), reshape(a, {3, 1})); },
                                      {kRule});
    // As a captured tensor of a body traced on this thread.
    testing::expect_error<TraceError>(
        [&] {
          (void)scan([&](const Tensor& c, const Tensor& x) { return std::pair{c + x * a, c}; },
                     zeros({3}), ones({2, 3}));
        },
        {kRule});
  });
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{2, 2, 2}));  // untouched on its thread
}

TEST_F(Threads, PendingTensorReadOnAnotherThreadIsTraceError) {
  Tensor a = ones({3}) * 2.0;
  Tensor s = sum(a);
  on_other_thread([&] {
    testing::expect_error<TraceError>([&] { (void)s.item<float>(); }, {"[item]", kRule});
    testing::expect_error<TraceError>([&] { (void)a.to_vector<float>(); }, {"[to_vector]", kRule});
    testing::expect_error<TraceError>(
        [&] {
          std::ostringstream os;
          os << a;
        },
        {kRule});
    testing::expect_error<TraceError>([&] { (void)pending_ir({a}); }, {kRule});
    testing::expect_error<TraceError>([&] { (void)a.detach(); }, {kRule});
    sync();  // this thread's own (empty) work: fine, and it leaves a alone
  });
  EXPECT_FLOAT_EQ(s.item<float>(), 6.0f);
}

TEST_F(Threads, PendingTensorOfExitedThreadIsTraceError) {
  Tensor a, b;
  on_other_thread([&] {
    a = ones({3}) * 2.0;
    b = ones({1}) + 1.0;
  });
  testing::expect_error<TraceError>([&] { (void)(a + 1.0); }, {kRule, "exited"});
  testing::expect_error<TraceError>([&] { (void)b.item<float>(); }, {"[item]", kRule, "exited"});
  testing::expect_error<TraceError>([&] { (void)b.to_vector<float>(); }, {kRule});
}

TEST_F(Threads, InPlaceUpdateRecordedOnAnotherThreadIsTraceError) {
  Tensor w = host(3, 5);
  on_other_thread([&] { w.copy_(ones({3}) * 3.0); });  // pending on a thread now gone
  testing::expect_error<TraceError>([&] { (void)w.to_vector<float>(); }, {kRule});
  testing::expect_error<TraceError>([&] { (void)(w * 2.0); }, {kRule});

  // B records copy_ and stays alive while A reads; and A's pending tensor updated on B.
  Tensor v = host(3, 5), p = ones({3}) * 4.0;
  std::latch recorded(1), read(1);
  std::thread t([&] {
    v.copy_(ones({3}) * 3.0);
    testing::expect_error<TraceError>([&] { p.copy_(ones({3})); }, {"[in-place]", kRule});
    testing::expect_error<TraceError>([&] { p.add_(ones({3})); }, {kRule});
    recorded.count_down();
    read.wait();
    EXPECT_EQ(v.to_vector<float>(), (std::vector<float>{3, 3, 3}));  // its own: fine
  });
  recorded.wait();
  testing::expect_error<TraceError>([&] { (void)v.to_vector<float>(); }, {"[to_vector]", kRule});
  read.count_down();
  t.join();
  EXPECT_EQ(v.to_vector<float>(), (std::vector<float>{3, 3, 3}));  // materialized there: fine
  EXPECT_EQ(p.to_vector<float>(), (std::vector<float>{4, 4, 4}));
}

// ---- pending tensors dropped on other threads ---------------------------------------------

// A queue of tensors between threads (nullopt: the sender is done).
class Channel {
 public:
  void push(std::optional<Tensor> t) {
    {
      std::lock_guard lock(mu_);
      q_.push_back(std::move(t));
    }
    cv_.notify_one();
  }
  std::optional<Tensor> pop() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return !q_.empty(); });
    std::optional<Tensor> t = std::move(q_.front());
    q_.pop_front();
    return t;
  }
  // Moves what is queued now into *out without waiting; false when the queue was empty.
  bool pop_all(std::deque<std::optional<Tensor>>* out) {
    std::lock_guard lock(mu_);
    if (q_.empty()) return false;
    for (auto& t : q_) out->push_back(std::move(t));
    q_.clear();
    return true;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::optional<Tensor>> q_;
};

bool in_pending_list(const detail::TensorImpl* impl) {
  for (const detail::TensorImpl* p : detail::TraceContext::get().pending_impls())
    if (p == impl) return true;
  return false;
}

// The Python case: a pending tensor's last reference dropped by another thread (the garbage
// collector, a worker) while its owner keeps tracing, reading and syncing. The owner's pending
// list must stay whole: its results are checked against closed forms after every sync.
TEST_F(Threads, PendingTensorsDroppedOnAnotherThreadWhileOwnerTraces) {
  runtime::set_backend("ref");  // the pending list is under test, not the compiler
  constexpr int kSteps = 4000;
  Channel to_dropper;
  std::thread dropper([&] {
    int64_t own = 0;
    while (std::optional<Tensor> t = to_dropper.pop()) {
      Tensor mine = ones({2}) * 3.0;  // the dropper traces too: its own list alongside
      own += static_cast<int64_t>(sum(mine).item<float>());
      t.reset();  // the last handle of the owner's pending tensor, dropped here
    }
    EXPECT_GT(own, 0);
  });
  Tensor x = host(4, 0.5f);
  Tensor acc = zeros({4});
  for (int i = 0; i < kSteps; ++i) {
    Tensor p = x * static_cast<double>(i) + 1.0;  // pending here, dropped there
    Tensor q = exp(p);
    to_dropper.push(std::move(q));
    acc = acc + x;
    if (i % 7 == 3) to_dropper.push(acc * 2.0);  // a tensor the next step's acc depends on
    if (i % 50 == 49) {
      if (i % 100 == 49) {
        sync();
      } else {
        ASSERT_FLOAT_EQ(sum(acc).item<float>(), 2.0f * static_cast<float>(i + 1)) << i;
      }
      ASSERT_FLOAT_EQ(acc.to_vector<float>()[3], 0.5f * static_cast<float>(i + 1)) << i;
    }
  }
  to_dropper.push(std::nullopt);
  dropper.join();
  sync();
  EXPECT_TRUE(detail::TraceContext::get().pending_impls().empty());
  EXPECT_FLOAT_EQ(sum(acc).item<float>(), 2.0f * kSteps);
}

// A dropped tensor leaves its owner's pending list at the owner's next op, so a sync does not
// compute it; its value is never needed.
TEST_F(Threads, PendingTensorDroppedOnAnotherThreadLeavesTheOwnersList) {
  runtime::set_backend("ref");
  Tensor p = exp(host(3, 1.0f));
  const detail::TensorImpl* impl = p.impl();
  ASSERT_TRUE(in_pending_list(impl));
  std::thread([t = std::move(p)]() mutable { t = Tensor(); }).join();
  EXPECT_TRUE(in_pending_list(impl));  // the other thread left the owner's list alone
  Tensor y = host(3, 2.0f) * 2.0;      // the owner's next op
  EXPECT_FALSE(in_pending_list(impl));
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{4, 4, 4}));
  // And at a sync with no op in between.
  Tensor r = exp(host(2, 0.0f));
  impl = r.impl();
  std::thread([t = std::move(r)]() mutable { t = Tensor(); }).join();
  sync();
  EXPECT_TRUE(detail::TraceContext::get().pending_impls().empty());
}

// Every thread owns tensors, hands them to the next thread, and drops what the previous one
// handed it whenever it finds some, all at once, each checking its own results.
TEST_F(Threads, PendingTensorsDroppedAcrossManyThreads) {
  runtime::set_backend("ref");
  constexpr int kSteps = 3000;
  std::vector<Channel> inbox(kThreads);
  std::vector<float> got(kThreads);
  on_threads(kThreads, [&](int t) {
    Channel& next = inbox[(t + 1) % kThreads];
    Tensor x = host(3, static_cast<float>(t + 1));
    Tensor acc = zeros({3});
    size_t received = 0;
    std::deque<std::optional<Tensor>> in;
    for (int i = 0; i < kSteps; ++i) {
      next.push(x * static_cast<double>(i) - 1.0);
      next.push(tanh(acc + x));
      acc = acc + x;
      if (inbox[t].pop_all(&in)) {  // the previous thread's tensors, dropped here
        received += in.size();
        in.clear();
      }
      if (i % 100 == 99) {
        ASSERT_FLOAT_EQ(acc.to_vector<float>()[0], (t + 1.0f) * (i + 1.0f));
      }
    }
    while (received < 2 * kSteps) {
      in.push_back(inbox[t].pop());
      received += in.size();
      in.clear();
    }
    got[t] = sum(acc).item<float>();
    sync();
    EXPECT_TRUE(detail::TraceContext::get().pending_impls().empty());
  });
  for (int t = 0; t < kThreads; ++t) EXPECT_FLOAT_EQ(got[t], 3.0f * (t + 1) * kSteps);
}

// The owner exits while tensors it traced are held or being dropped elsewhere: those dropped
// while it was alive are destroyed by the time it has exited, the others when their last
// handle goes, and using one is a TraceError. A destroyed tensor releases what it holds (here
// a buffer it was given to watch); the sanitizer builds check that nothing leaks.
TEST_F(Threads, PendingTensorsOfAThreadThatExitsAreDroppedSafely) {
  runtime::set_backend("ref");
  constexpr int kSent = 2000, kHeld = 64;
  std::vector<Tensor> held;
  Buffer watch = Buffer::allocate(16);  // shared by the watched tensors: counts the live ones
  auto watched = [&](Tensor t) {
    Tensor watcher = ones({1}) + 1.0;  // pending, never read: it only holds the buffer
    watcher.impl()->buffer = watch;
    t.impl()->grad = watcher;
    return t;
  };
  Channel to_dropper;
  std::latch made(1), dropped(1);
  std::thread dropper([&] {
    while (std::optional<Tensor> t = to_dropper.pop()) t.reset();
  });
  std::thread owner([&] {
    Tensor acc = zeros({2});
    for (int k = 0; k < kSent; ++k) {  // dropped there while this thread traces on, and exits
      to_dropper.push(watched(exp(host(2, 0.001f * static_cast<float>(k)))));
      acc = acc + 1.0;
      if (k % 100 == 99) {
        EXPECT_FLOAT_EQ(acc.to_vector<float>()[1], k + 1.0f);
      }
    }
    to_dropper.push(std::nullopt);
    for (int k = 0; k < kHeld; ++k) held.push_back(watched(exp(host(2, static_cast<float>(k)))));
    made.count_down();
    dropped.wait();  // alive and idle while half of the held ones are dropped on the main thread
  });
  made.wait();
  held.resize(kHeld / 2);
  dropped.count_down();
  owner.join();
  dropper.join();
  EXPECT_EQ(watch.use_count(), 1 + kHeld / 2);
  testing::expect_error<TraceError>([&] { (void)(held[0] + 1.0); }, {kRule, "exited"});
  std::thread([&] { held.resize(kHeld / 4); }).join();  // dropped on a third thread
  held.clear();                                         // and here
  EXPECT_EQ(watch.use_count(), 1);
}

TEST_F(Threads, MaterializedTensorsWorkAcrossThreads) {
  Tensor w = host(4, 3);
  Tensor y = ones({4}) * 0.5;
  y.to_vector<float>();  // materialized
  on_other_thread([&] {
    EXPECT_EQ((w + y).to_vector<float>(), (std::vector<float>{3.5, 3.5, 3.5, 3.5}));
    w.copy_(w * 2.0);
    sync();
  });
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{6, 6, 6, 6}));

  // A graph input remembered by one thread's graph is not another thread's node: thread A
  // uses w first in its graph (its first node), then a fresh thread B, whose first node is
  // something else, uses w.
  Tensor u = host(4, 7);
  Tensor keep;
  on_other_thread([&] {
    keep = (u * 2.0).detach();
    keep.to_vector<float>();
  });
  for (int k = 0; k < 3; ++k) {
    on_other_thread([&] {
      Tensor other = host(5, 1) * 5.0;  // B's first graph input is not u
      EXPECT_EQ((u + 1.0).to_vector<float>(), (std::vector<float>{8, 8, 8, 8}));
      EXPECT_FLOAT_EQ(sum(other).item<float>(), 25.0f);
    });
    // And the same on this thread while a fresh thread's graph is at the same epoch.
    on_other_thread([&] { (void)(u * 3.0); });
  }

  // Gradients of a leaf made on A, back-propagated on B.
  Tensor leaf = host(3, 2);
  leaf.requires_grad_();
  on_other_thread([&] {
    Tensor loss = sum(leaf * leaf);
    loss.backward();
    sync();
  });
  EXPECT_EQ(leaf.grad().to_vector<float>(), (std::vector<float>{4, 4, 4}));

  // Several threads reading one materialized tensor at once.
  Tensor shared = arange(0, 64) * 0.25;
  shared.to_vector<float>();
  std::vector<float> sums(kThreads);
  on_threads(kThreads, [&](int t) {
    for (int i = 0; i < 20; ++i) sums[t] = sum(shared * static_cast<double>(t + 1)).item<float>();
  });
  for (int t = 0; t < kThreads; ++t) EXPECT_FLOAT_EQ(sums[t], 504.0f * (t + 1));
}

}  // namespace
}  // namespace loom
