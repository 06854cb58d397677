// loom-launch: starts N local ranks of a loom program with their environment.
//
//   loom-launch -n N [--store DIR|HOST:PORT] [--rank-offset K] [--world-size W] [--timeout S]
//               PROGRAM ARGS...
//
// Each rank gets LOOM_RANK (K + i), LOOM_LOCAL_RANK (i), LOOM_WORLD_SIZE (W, default K + N)
// and LOOM_STORE (DIR or HOST:PORT; default a fresh temporary directory, removed at the end;
// with HOST:PORT rank 0 serves a TCP store bound to HOST). Every line a rank prints is
// prefixed with "[rank R] " (stdout to stdout, stderr to stderr). When a rank fails (non-zero
// exit or a signal) every other rank is ended (SIGTERM, then SIGKILL after 3 s) and
// loom-launch returns the failing rank's status (128 + signal for a signal).
//
// Multi-host: run the same command on every host with the same store (a directory all hosts
// see, or HOSTA:PORT, HOSTA the address of the host that runs rank 0), the total
// --world-size, --rank-offset = the ranks started before this host, and LOOM_DIST_ADDR set to
// this host's address (Gloo binds it; 127.0.0.1 alone reaches only local ranks):
//   host A: LOOM_DIST_ADDR=10.0.0.1 loom-launch -n 2 --world-size 4 --store /shared/job1 prog
//   host B: LOOM_DIST_ADDR=10.0.0.2 loom-launch -n 2 --world-size 4 --rank-offset 2
//               --store /shared/job1 prog   (one command line)
// or, without a shared file system, --store 10.0.0.1:29500 on both hosts.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  int out = -1, err = -1;  // read ends of the rank's stdout and stderr pipes
  std::string out_buf, err_buf;
  bool done = false;
  int status = 0;
};

volatile sig_atomic_t g_signal = 0;
void on_signal(int s) { g_signal = s; }

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "loom-launch: %s\nusage: loom-launch -n N [--store DIR|HOST:PORT] [--rank-offset K] "
               "[--world-size W] [--timeout SECONDS] PROGRAM ARGS...\n",
               why);
  std::exit(2);
}

int to_int(const char* flag, const char* s) {
  char* end = nullptr;
  long v = std::strtol(s, &end, 10);
  if (!end || *end || v < 0) usage((std::string(flag) + " needs a non-negative integer").c_str());
  return static_cast<int>(v);
}

// Writes each complete line of buf with the rank's prefix; keeps the incomplete tail.
void flush_lines(std::string& buf, int rank, FILE* to, bool all) {
  size_t start = 0;
  for (;;) {
    size_t nl = buf.find('\n', start);
    if (nl == std::string::npos) break;
    std::fprintf(to, "[rank %d] %.*s\n", rank, static_cast<int>(nl - start), buf.data() + start);
    start = nl + 1;
  }
  buf.erase(0, start);
  if (all && !buf.empty()) {
    std::fprintf(to, "[rank %d] %s\n", rank, buf.c_str());
    buf.clear();
  }
  std::fflush(to);
}

int exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

struct Options {
  int n = -1, offset = 0, world = -1;
  std::string store, timeout;
  int program = 0;  // argv index of PROGRAM
};

Options parse_args(int argc, char** argv) {
  Options o;
  int i = 1;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage((a + " needs a value").c_str());
      return argv[++i];
    };
    if (a == "-n")
      o.n = to_int("-n", value());
    else if (a == "--store")
      o.store = value();
    else if (a == "--rank-offset")
      o.offset = to_int("--rank-offset", value());
    else if (a == "--world-size")
      o.world = to_int("--world-size", value());
    else if (a == "--timeout")
      o.timeout = value();
    else if (a == "-h" || a == "--help")
      usage("help");
    else if (!a.empty() && a[0] == '-')
      usage(("unknown option " + a).c_str());
    else
      break;
  }
  if (o.n < 1) usage("-n N (at least 1) is required");
  if (i >= argc) usage("no PROGRAM given");
  if (o.world < 0) o.world = o.offset + o.n;
  if (o.offset + o.n > o.world) usage("--rank-offset + -n exceeds --world-size");
  o.program = i;
  return o;
}

std::string make_temporary_store() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "loom-launch-XXXXXX").string();
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back(0);
  if (!::mkdtemp(buf.data())) usage("cannot create a temporary store directory");
  return buf.data();
}

// Forks the ranks, each with its environment and its stdout and stderr piped back.
std::vector<Rank> spawn_ranks(const Options& o, char** argv) {
  std::vector<Rank> ranks(static_cast<size_t>(o.n));
  for (int k = 0; k < o.n; ++k) {
    Rank& r = ranks[static_cast<size_t>(k)];
    r.rank = o.offset + k;
    int po[2], pe[2];
    if (::pipe(po) != 0 || ::pipe(pe) != 0) usage("pipe failed");
    r.pid = ::fork();
    if (r.pid == 0) {
      ::dup2(po[1], 1);
      ::dup2(pe[1], 2);
      ::close(po[0]), ::close(po[1]), ::close(pe[0]), ::close(pe[1]);
      ::setenv("LOOM_RANK", std::to_string(r.rank).c_str(), 1);
      ::setenv("LOOM_LOCAL_RANK", std::to_string(k).c_str(), 1);
      ::setenv("LOOM_WORLD_SIZE", std::to_string(o.world).c_str(), 1);
      ::setenv("LOOM_STORE", o.store.c_str(), 1);
      if (!o.timeout.empty()) ::setenv("LOOM_DIST_TIMEOUT", o.timeout.c_str(), 1);
      ::execvp(argv[o.program], argv + o.program);
      std::fprintf(stderr, "loom-launch: cannot run %s: %s\n", argv[o.program],
                   std::strerror(errno));
      ::_exit(127);
    }
    ::close(po[1]), ::close(pe[1]);
    r.out = po[0], r.err = pe[0];
  }
  return ranks;
}

bool pipes_open(const std::vector<Rank>& ranks) {
  for (const Rank& r : ranks)
    if (r.out >= 0 || r.err >= 0) return true;
  return false;
}

// Waits up to 50 ms for output and forwards every complete line with its rank's prefix.
void forward_output(std::vector<Rank>& ranks) {
  std::vector<pollfd> fds;
  std::vector<std::pair<size_t, bool>> who;
  for (size_t k = 0; k < ranks.size(); ++k) {
    if (ranks[k].out >= 0) fds.push_back({ranks[k].out, POLLIN, 0}), who.push_back({k, false});
    if (ranks[k].err >= 0) fds.push_back({ranks[k].err, POLLIN, 0}), who.push_back({k, true});
  }
  if (!fds.empty())
    ::poll(fds.data(), fds.size(), 50);
  else
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  for (size_t f = 0; f < fds.size(); ++f) {
    if (!(fds[f].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    Rank& r = ranks[who[f].first];
    char buf[65536];
    ssize_t got = ::read(fds[f].fd, buf, sizeof buf);
    std::string& acc = who[f].second ? r.err_buf : r.out_buf;
    FILE* to = who[f].second ? stderr : stdout;
    if (got > 0) {
      acc.append(buf, static_cast<size_t>(got));
      flush_lines(acc, r.rank, to, false);
    } else {
      flush_lines(acc, r.rank, to, true);
      ::close(fds[f].fd);
      (who[f].second ? r.err : r.out) = -1;
    }
  }
}

// Runs until every rank has exited and its pipes are read to the end; ends the others when
// one fails or a signal arrives. Returns loom-launch's exit code.
int supervise(std::vector<Rank>& ranks) {
  using Clock = std::chrono::steady_clock;
  int failed = -1, code = 0;
  auto end_all = [&](int sig) {
    for (Rank& r : ranks)
      if (!r.done) ::kill(r.pid, sig);
  };
  Clock::time_point kill_at{}, drain_until{};
  size_t alive = ranks.size();
  // A rank's last lines may still sit in its pipe when it is reaped; a pipe a rank's own child
  // keeps open is given up 2 s after the last rank exits.
  while (alive > 0 || (pipes_open(ranks) && Clock::now() < drain_until)) {
    forward_output(ranks);
    for (Rank& r : ranks) {
      if (r.done) continue;
      int st = 0;
      if (::waitpid(r.pid, &st, WNOHANG) != r.pid) continue;
      r.done = true;
      r.status = st;
      if (--alive == 0) drain_until = Clock::now() + std::chrono::seconds(2);
      if (exit_code(st) != 0 && failed < 0) {
        failed = r.rank;
        code = exit_code(st);
        if (WIFSIGNALED(st))
          std::fprintf(stderr, "loom-launch: rank %d failed (signal %d); ending the others\n",
                       r.rank, WTERMSIG(st));
        else
          std::fprintf(stderr, "loom-launch: rank %d failed (exit %d); ending the others\n", r.rank,
                       code);
        end_all(SIGTERM);
        kill_at = Clock::now() + std::chrono::seconds(3);
      }
    }
    if (g_signal && failed < 0) {
      failed = -2;
      code = 128 + g_signal;
      end_all(g_signal);
      kill_at = Clock::now() + std::chrono::seconds(3);
    }
    if (kill_at.time_since_epoch().count() && Clock::now() > kill_at) end_all(SIGKILL);
  }
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse_args(argc, argv);
  const bool own_store = o.store.empty();
  if (own_store) o.store = make_temporary_store();
  struct sigaction sa{};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  std::vector<Rank> ranks = spawn_ranks(o, argv);
  const int code = supervise(ranks);
  for (Rank& r : ranks) {
    flush_lines(r.out_buf, r.rank, stdout, true);
    flush_lines(r.err_buf, r.rank, stderr, true);
    if (r.out >= 0) ::close(r.out);
    if (r.err >= 0) ::close(r.err);
  }
  if (own_store) {
    std::error_code ec;
    std::filesystem::remove_all(o.store, ec);
  }
  return code;
}
