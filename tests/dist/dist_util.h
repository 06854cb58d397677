// Helpers of the dist tests: ranks as threads (run_in_process) or as processes (this test
// binary re-executed with LOOM_RANK set and the current test as its filter).
//
//   DIST_RANKS(2, [](int rank) { ... });   // rank 0 in this process, rank 1 a child process
//
// The child runs the same test body with its rank; its failures make it exit non-zero, which
// the parent asserts. Every child is waited for (killed past a deadline): no process is left.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "loom/dist/dist.h"

namespace loom::testing {

// The rank this process plays in a multi-process test: -1 in the parent.
inline int child_rank() {
  const char* s = std::getenv("LOOM_TEST_CHILD_RANK");
  return s ? std::atoi(s) : -1;
}

// A fresh store directory for one multi-process test.
inline std::string fresh_store() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "loom-dist-XXXXXX").string();
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back(0);
  const char* d = ::mkdtemp(buf.data());
  EXPECT_NE(d, nullptr);
  return d ? d : "";
}

// 127.0.0.1:port as a socket address (port 0: any free port).
inline sockaddr_in loopback(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

// "127.0.0.1:PORT" with a port that was free a moment ago, for a TCP store.
inline std::string free_tcp_store() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = loopback(0);
  socklen_t len = sizeof a;
  int port = 0;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0) ::close(fd);
  EXPECT_NE(port, 0);
  return "127.0.0.1:" + std::to_string(port);
}

struct Child {
  pid_t pid = -1;
  int status = -1;
};

// Starts ranks 1..n-1 of the current test as processes; `skip` ranks are not started.
inline std::vector<Child> spawn_ranks(int n, const std::string& store, double timeout_s,
                                      std::vector<int> skip = {}) {
  const ::testing::TestInfo* t = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string filter = std::string("--gtest_filter=") + t->test_suite_name() + "." + t->name();
  std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();
  std::vector<Child> kids;
  for (int r = 1; r < n; ++r) {
    if (std::find(skip.begin(), skip.end(), r) != skip.end()) continue;
    pid_t pid = ::fork();
    if (pid == 0) {
      ::setenv("LOOM_TEST_CHILD_RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOOM_RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOOM_WORLD_SIZE", std::to_string(n).c_str(), 1);
      ::setenv("LOOM_STORE", store.c_str(), 1);
      ::setenv("LOOM_DIST_TIMEOUT", std::to_string(timeout_s).c_str(), 1);
      ::execl(exe.c_str(), exe.c_str(), filter.c_str(), "--gtest_brief=1", (char*)nullptr);
      ::_exit(127);
    }
    kids.push_back({pid, -1});
  }
  return kids;
}

// Waits for every child until `deadline_s`, then kills the rest; returns their statuses.
inline void reap(std::vector<Child>& kids, double deadline_s) {
  const auto end = std::chrono::steady_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(deadline_s * 1000));
  for (Child& k : kids) {
    for (;;) {
      int st = 0;
      pid_t r = ::waitpid(k.pid, &st, WNOHANG);
      if (r == k.pid) {
        k.status = st;
        break;
      }
      if (std::chrono::steady_clock::now() > end) {
        ::kill(k.pid, SIGKILL);
        ::waitpid(k.pid, &st, 0);
        k.status = -1;
        ADD_FAILURE() << "rank process " << k.pid << " did not end in time; killed";
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

// Sets an environment variable for the life of the object (the rank processes inherit it),
// then puts back what was there.
struct ScopedEnv {
  std::string name;
  std::optional<std::string> before;
  ScopedEnv(const char* n, const char* v) : name(n) {
    if (const char* b = std::getenv(n)) before = b;
    ::setenv(n, v, 1);
  }
  ~ScopedEnv() {
    if (before)
      ::setenv(name.c_str(), before->c_str(), 1);
    else
      ::unsetenv(name.c_str());
  }
};

// Runs body(rank) as rank 0 here and ranks 1..n-1 in child processes over Gloo (127.0.0.1),
// with the given collective timeout, meeting through `store` (default: a fresh directory).
// In a child: runs its rank and exits with the test's verdict.
inline void gloo_ranks(int n, double timeout_s, const std::function<void(int)>& body,
                       double deadline_s = 60, std::string store = "") {
  const int me = child_rank();
  if (me >= 0) {
    try {
      loom::dist::init();  // from the environment spawn_ranks set
      body(me);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << me << " threw: " << e.what();
    }
    loom::dist::finalize();
    const bool ok = !::testing::Test::HasFailure();
    std::fflush(stdout);
    ::_exit(ok ? 0 : 1);
  }
  const bool own_store = store.empty();
  if (own_store) store = fresh_store();
  std::vector<Child> kids = spawn_ranks(n, store, timeout_s);
  try {  // whatever happens here, the children are reaped below
    loom::dist::InitOptions o;
    o.rank = 0;
    o.world_size = n;
    o.store = store;
    o.timeout_s = timeout_s;
    loom::dist::set_communicator(loom::dist::make_gloo_communicator(o));
    body(0);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "rank 0 threw: " << e.what();
  }
  loom::dist::finalize();
  reap(kids, deadline_s);
  for (size_t k = 0; k < kids.size(); ++k)
    EXPECT_TRUE(WIFEXITED(kids[k].status) && WEXITSTATUS(kids[k].status) == 0)
        << "rank " << k + 1 << " failed (status " << kids[k].status << ")";
  std::error_code ec;
  if (own_store) std::filesystem::remove_all(store, ec);
}

// Runs body(rank) on n threads of an in-process group; rethrows nothing: each rank's
// exception fails the test.
inline void thread_ranks(int n, const std::function<void(int)>& body,
                         std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  std::vector<std::exception_ptr> errs = loom::dist::run_in_process(n, body, timeout);
  for (size_t r = 0; r < errs.size(); ++r) {
    if (!errs[r]) continue;
    try {
      std::rethrow_exception(errs[r]);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << " threw: " << e.what();
    }
  }
}

// A deterministic float32 tensor of shape s: scale * sin(seed + 0.37 i).
inline Tensor host(Shape s, double seed, double scale = 0.5) {
  std::vector<float> v;
  for (int64_t i = 0; i < s.numel(); ++i)
    v.push_back(static_cast<float>(scale * std::sin(seed + 0.37 * i)));
  return tensor(v, s);
}

// Norm-wise: |a - b| <= 2e-5 (1 + max |b|), as sharded sums run in another order (a layer
// norm's weight gradient sums terms far larger than itself).
inline void expect_close(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  std::vector<float> a = got.to_vector<float>(), b = want.to_vector<float>();
  double scale = 1;
  for (float v : b) scale = std::max(scale, 1.0 + std::abs(v));
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_NEAR(a[i], b[i], 2e-5 * scale) << what << "[" << i << "]";
}

}  // namespace loom::testing
