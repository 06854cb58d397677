// All_reduce through a shared-memory segment (shm_reduce.h).
#include "distributed/shm_reduce.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>

#include "distributed/reduce_impl.h"
#include "distributed/tcp_store.h"
#include "loom/core/error.h"

namespace loom::dist::detail {

namespace {

using loom::detail::str_cat;

constexpr size_t kLine = 64;  // one counter per cache line
// Words of a rank's first counter line after its counter: its pid and PID namespace, written
// once at create, and its current call (ShmReduce::Call, 5 words).
constexpr size_t kPidWord = 1, kNamespaceWord = 2, kCallWord = 3;

size_t control_bytes(int size) {
  const size_t b = static_cast<size_t>(size) * 2 * kLine;
  return (b + 4095) / 4096 * 4096;
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// What must match for two ranks to share a segment: the host, the boot, the user.
std::string host_identity() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::string boot;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot);
  return str_cat(host, " boot ", boot, " uid ", ::getuid());
}

std::string errno_text(const char* what) { return str_cat(what, ": ", std::strerror(errno)); }

// The inode of this process's PID namespace: pids of two ranks compare only within one.
uint64_t pid_namespace() {
  struct stat st{};
  return ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

// False once the process has exited (gone, or a zombie its parent has not reaped yet).
bool process_alive(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream in(str_cat("/proc/", pid, "/stat"));
  std::string text;
  if (!std::getline(in, text)) return true;  // no /proc: kill's answer stands
  const size_t paren = text.rfind(')');      // "pid (comm) S ...": comm may hold spaces
  return paren == std::string::npos || paren + 2 >= text.size() ||
         (text[paren + 2] != 'Z' && text[paren + 2] != 'X');
}

std::string ranks_text(const std::string& list, bool several) {
  return str_cat(several ? "ranks " : "rank ", list);
}

}  // namespace

std::unique_ptr<ShmReduce> ShmReduce::create(Communicator& c, std::string* why) {
  const int rank = c.rank(), size = c.size();
  if (size < 2) {
    *why = "one rank";
    return nullptr;
  }
  // Every rank sees every rank's answer, so all take the same branch (the environment may
  // differ between ranks).
  const char* on = std::getenv("LOOM_DIST_SHM");
  const bool off = on && std::strcmp(on, "0") == 0;
  const std::vector<std::string> ids = c.exchange(off ? "off" : host_identity());
  for (int r = 0; r < size; ++r)
    if (ids[static_cast<size_t>(r)] == "off") {
      *why = str_cat("LOOM_DIST_SHM=0 on rank ", r);
      return nullptr;
    }
  for (int r = 1; r < size; ++r)
    if (ids[static_cast<size_t>(r)] != ids[0]) {
      *why = str_cat("rank ", r, " is on another host than rank 0");
      return nullptr;
    }
  // Rank 0's slot size holds for all.
  int64_t kib = 4096;
  if (const char* k = std::getenv("LOOM_DIST_SHM_KIB"); k && *k)
    kib = std::clamp<int64_t>(std::atoll(k), 4, int64_t{1} << 20);
  kib = std::atoll(c.exchange(std::to_string(kib))[0].c_str());
  const int64_t slot = kib * 1024;
  const size_t bytes = control_bytes(size) + static_cast<size_t>(size + 1) * slot;
  std::string name, status;
  int fd = -1;
  if (rank == 0) {
    std::random_device rd;
    name = str_cat("/loom-", ::getpid(), "-", rd(), "-", rd());
    fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
      status = errno_text("shm_open");
    } else if (int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
      // Reserved now, so that a full /dev/shm is a fallback here and never a SIGBUS later.
      status = str_cat("reserving ", bytes, " bytes in /dev/shm: ", std::strerror(err));
    }
    if (!status.empty()) {
      if (fd >= 0) ::close(fd);
      fd = -1;
      ::shm_unlink(name.c_str());
    }
  }
  const std::string from0 = c.exchange(rank == 0 ? (status.empty() ? name : "!" + status) : "")[0];
  if (!from0.empty() && from0[0] == '!') {
    *why = str_cat("rank 0: ", from0.substr(1));
    return nullptr;
  }
  name = from0;
  if (rank != 0) {
    fd = ::shm_open(name.c_str(), O_RDWR, 0);
    if (fd < 0) status = errno_text("shm_open");  // another IPC namespace, say
  }
  void* p = MAP_FAILED;
  if (status.empty()) {
    p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) status = errno_text("mmap");
  }
  if (fd >= 0) ::close(fd);
  if (p != MAP_FAILED) {
    // This rank's process, for the others' waits to tell a dead rank from a slow one.
    auto* line = reinterpret_cast<uint64_t*>(static_cast<char*>(p) + rank * 2 * kLine);
    line[kPidWord] = static_cast<uint64_t>(::getpid());
    line[kNamespaceWord] = pid_namespace();
  }
  const std::vector<std::string> all = c.exchange(status);
  // Every rank has mapped the segment or given up: the name goes, the memory stays mapped.
  if (rank == 0) ::shm_unlink(name.c_str());
  for (int r = 0; r < size; ++r)
    if (!all[static_cast<size_t>(r)].empty()) {
      if (p != MAP_FAILED) ::munmap(p, bytes);
      *why = str_cat("rank ", r, ": ", all[static_cast<size_t>(r)]);
      return nullptr;
    }
  return std::unique_ptr<ShmReduce>(new ShmReduce(rank, size, static_cast<char*>(p), bytes, slot));
}

ShmReduce::ShmReduce(int rank, int size, char* base, size_t bytes, int64_t slot_bytes)
    : rank_(rank), size_(size), base_(base), bytes_(bytes), slot_bytes_(slot_bytes) {
  const uint64_t ns = line(rank_)[kNamespaceWord];
  pids_comparable_ = ns != 0;
  for (int q = 0; q < size_; ++q)
    pids_comparable_ = pids_comparable_ && line(q)[kNamespaceWord] == ns;
}

uint64_t* ShmReduce::line(int r) const {
  return reinterpret_cast<uint64_t*>(base_ + static_cast<size_t>(r) * 2 * kLine);
}

ShmReduce::~ShmReduce() { ::munmap(base_, bytes_); }

void ShmReduce::arrive_and_wait(int which, uint64_t seq, const char* op,
                                std::chrono::milliseconds timeout) {
  auto counter = [&](int r) {
    return std::atomic_ref<uint64_t>(
        *reinterpret_cast<uint64_t*>(base_ + (static_cast<size_t>(r) * 2 + which) * kLine));
  };
  counter(rank_).store(seq, std::memory_order_release);
  const auto start = std::chrono::steady_clock::now();
  auto looked = start;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    for (int64_t spin = 0; counter(p).load(std::memory_order_acquire) < seq; ++spin) {
      if (spin < 2048) {
        cpu_relax();
        continue;
      }
      if ((spin & 63) == 0) {
        const auto now = std::chrono::steady_clock::now();
        const auto waited = now - start;
        // After the first millisecond, every 10 ms: has a rank we wait for exited?
        const bool look =
            waited > std::chrono::milliseconds(1) && now - looked > std::chrono::milliseconds(10);
        if (look) looked = now;
        std::string missing, dead;
        int n_missing = 0, n_dead = 0;
        if (look || waited > timeout)
          for (int q = 0; q < size_; ++q) {
            if (q == rank_ || counter(q).load(std::memory_order_acquire) >= seq) continue;
            missing += (n_missing++ ? ", " : "") + std::to_string(q);
            if (look && pids_comparable_ && !process_alive(static_cast<pid_t>(line(q)[kPidWord])))
              dead += (n_dead++ ? ", " : "") + std::to_string(q);
          }
        if (n_dead > 0)
          throw DistError(str_cat("[", op, "] rank ", rank_, " of ", size_,
                                  " (gloo, shared memory): ", ranks_text(dead, n_dead > 1),
                                  " died (the process exited) before reaching the collective"));
        if (waited > timeout)
          throw DistError(str_cat("[", op, "] rank ", rank_, " of ", size_,
                                  " (gloo, shared memory): ", ranks_text(missing, n_missing > 1),
                                  " did not reach the collective within ", seconds(timeout),
                                  " s (the timeout): it died, or it runs other collectives"));
        if (waited > std::chrono::milliseconds(1)) {
          std::this_thread::sleep_for(std::chrono::microseconds(50));
          continue;
        }
      }
      std::this_thread::yield();
    }
  }
}

char* ShmReduce::slot(int r) const {
  return base_ + control_bytes(size_) + static_cast<size_t>(r) * static_cast<size_t>(slot_bytes_);
}

namespace {

enum CallKind : uint64_t { kAllReduce, kBarrier, kAllGather, kBroadcast };

std::string describe(const uint64_t* c) {
  switch (c[0]) {
    case kAllReduce:
      return str_cat("all_reduce(", reduce_op_name(static_cast<ReduceOp>(c[2])), ") of ", c[3], " ",
                     name(static_cast<DType>(c[1])));
    case kBarrier: return "barrier()";
    case kAllGather: return str_cat("all_gather of ", c[3], " bytes");
    default: return str_cat("broadcast of ", c[3], " bytes from rank ", c[4]);
  }
}

}  // namespace

// Another rank rewrites its call words only after every rank has passed the call's second
// wait, so they hold still while this rank compares them.
void ShmReduce::begin(const Call& call) {
  std::memcpy(line(rank_) + kCallWord, &call, sizeof call);
}

void ShmReduce::check_call(const Call& call, const char* op) const {
  auto words = [&](int r) { return line(r) + kCallWord; };
  bool same = true;
  for (int r = 0; r < size_; ++r) same = same && std::memcmp(words(r), &call, sizeof call) == 0;
  if (same) return;
  std::string calls;
  for (int r = 0; r < size_; ++r)
    calls += str_cat(r ? "; " : "", "rank ", r, " ", describe(words(r)));
  throw DistError(str_cat("[", op, "] rank ", rank_, " of ", size_,
                          " (gloo, shared memory): the ranks called different collectives: ", calls,
                          ". Every rank must call the same collectives in the same order"));
}

void ShmReduce::all_reduce(void* data, int64_t n, DType dt, ReduceOp op,
                           std::chrono::milliseconds timeout) {
  reduce(data, n, dt, op, timeout, kAllReduce, "all_reduce");
}

void ShmReduce::barrier(std::chrono::milliseconds timeout) {
  uint8_t one = 1;
  reduce(&one, 1, DType::Bool, ReduceOp::Max, timeout, kBarrier, "barrier");
}

void ShmReduce::reduce(void* data, int64_t n, DType dt, ReduceOp op,
                       std::chrono::milliseconds timeout, uint64_t kind, const char* what) {
  const int64_t item = itemsize(dt);
  const int64_t per = slot_bytes_ / item;
  char* result = slot(size_);
  char* d = static_cast<char*>(data);
  const Call call{kind, static_cast<uint64_t>(dt), static_cast<uint64_t>(op),
                  static_cast<uint64_t>(n), 0};
  begin(call);
  for (int64_t off = 0; off < n; off += per) {
    const int64_t m = std::min(per, n - off);
    char* mine = d + off * item;
    const int64_t b0 = m * rank_ / size_, b1 = m * (rank_ + 1) / size_;
    // 1. The chunk but this rank's own block (which it reads in place) into its slot.
    std::memcpy(slot(rank_), mine, static_cast<size_t>(b0 * item));
    std::memcpy(slot(rank_) + b1 * item, mine + b1 * item, static_cast<size_t>((m - b1) * item));
    ++seq_;
    arrive_and_wait(0, seq_, what, timeout);
    if (off == 0) check_call(call, what);
    // 2. Block rank_ over the ranks in rank order, into the result area.
    if (b1 > b0) {
      char* out = result + b0 * item;
      auto src = [&](int r) { return (r == rank_ ? mine : slot(r)) + b0 * item; };
      std::memcpy(out, src(0), static_cast<size_t>((b1 - b0) * item));
      for (int r = 1; r < size_; ++r) reduce_into(out, src(r), b1 - b0, dt, op);
      if (op == ReduceOp::Mean) divide(out, b1 - b0, dt, size_);
    }
    arrive_and_wait(1, seq_, what, timeout);
    // 3. The whole reduced chunk back.
    std::memcpy(mine, result, static_cast<size_t>(m * item));
  }
}

void ShmReduce::all_gather(const void* in, void* out, int64_t bytes,
                           std::chrono::milliseconds timeout) {
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  const Call call{kAllGather, 0, 0, static_cast<uint64_t>(bytes), 0};
  begin(call);
  for (int64_t off = 0; off < bytes; off += slot_bytes_) {
    const size_t m = static_cast<size_t>(std::min(slot_bytes_, bytes - off));
    std::memcpy(slot(rank_), src + off, m);
    ++seq_;
    arrive_and_wait(0, seq_, "all_gather", timeout);
    if (off == 0) check_call(call, "all_gather");
    for (int r = 0; r < size_; ++r) std::memcpy(dst + r * bytes + off, slot(r), m);
    arrive_and_wait(1, seq_, "all_gather", timeout);
  }
}

void ShmReduce::broadcast(void* data, int64_t bytes, int root, std::chrono::milliseconds timeout) {
  char* d = static_cast<char*>(data);
  const Call call{kBroadcast, 0, 0, static_cast<uint64_t>(bytes), static_cast<uint64_t>(root)};
  begin(call);
  for (int64_t off = 0; off < bytes; off += slot_bytes_) {
    const size_t m = static_cast<size_t>(std::min(slot_bytes_, bytes - off));
    if (rank_ == root) std::memcpy(slot(root), d + off, m);
    ++seq_;
    arrive_and_wait(0, seq_, "broadcast", timeout);
    if (off == 0) check_call(call, "broadcast");
    if (rank_ != root) std::memcpy(d + off, slot(root), m);
    arrive_and_wait(1, seq_, "broadcast", timeout);
  }
}

}  // namespace loom::dist::detail
