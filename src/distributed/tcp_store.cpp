// The rendezvous stores (see tcp_store.h). The TCP store's wire format, one request at a time
// per connection, integers little-endian u32:
//   set: 'S' klen key vlen value   ->  'K'
//   get: 'G' klen key              ->  'Y' vlen value | 'N'
// A malformed request (another op, a key over 64 KiB, a value over 1 GiB) closes that
// connection; the server goes on serving the others.
#include "distributed/tcp_store.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "loom/core/error.h"

namespace loom::dist {

namespace {

using loom::detail::str_cat;
namespace fs = std::filesystem;

class DirStore final : public KeyValueStore {
 public:
  explicit DirStore(std::string dir) : dir_(std::move(dir)) {
    std::error_code ec;
    fs::create_directories(dir_, ec);
    LOOM_CHECK_T(DistError, fs::is_directory(dir_), "[init] the store directory '", dir_,
                 "' cannot be created: ", ec.message());
  }
  void put(const std::string& key, const std::vector<char>& value) override {
    const fs::path tmp = path(key + ".tmp." + std::to_string(::getpid()));
    {
      std::ofstream os(tmp, std::ios::binary);
      os.write(value.data(), static_cast<std::streamsize>(value.size()));
      LOOM_CHECK_T(DistError, os.good(), "[init] cannot write the store file ", tmp.string());
    }
    fs::rename(tmp, path(key));
  }
  std::optional<std::vector<char>> try_get(const std::string& key) override {
    std::ifstream is(path(key), std::ios::binary);
    if (!is) return std::nullopt;
    return std::vector<char>(std::istreambuf_iterator<char>(is), {});
  }
  std::string describe() const override { return str_cat("the store '", dir_, "'"); }

 private:
  fs::path path(const std::string& key) const {
    std::string k = key;
    for (char& ch : k)
      if (ch == '/') ch = '_';
    return fs::path(dir_) / k;
  }
  std::string dir_;
};

struct HostPort {
  std::string host, port;
};

// "host:port" or "[v6 address]:port"; the port a number in 1..65535.
HostPort split_host_port(const std::string& s) {
  const size_t colon = s.rfind(':');
  HostPort hp{s.substr(0, colon), s.substr(colon + 1)};
  if (hp.host.size() >= 2 && hp.host.front() == '[' && hp.host.back() == ']')
    hp.host = hp.host.substr(1, hp.host.size() - 2);
  char* end = nullptr;
  const long port = std::strtol(hp.port.c_str(), &end, 10);
  LOOM_CHECK_T(
      DistError, !hp.host.empty() && !hp.port.empty() && *end == 0 && port >= 1 && port <= 65535,
      "[init] the store '", s, "' is neither a directory nor host:port with a port in 1..65535");
  return hp;
}

struct AddrInfo {
  addrinfo* list = nullptr;
  ~AddrInfo() {
    if (list) ::freeaddrinfo(list);
  }
};

std::string resolve(const HostPort& hp, AddrInfo& out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  const int rc = ::getaddrinfo(hp.host.c_str(), hp.port.c_str(), &hints, &out.list);
  return rc == 0 ? "" : ::gai_strerror(rc);
}

bool send_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k, n -= static_cast<size_t>(k);
  }
  return true;
}

bool recv_all(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k, n -= static_cast<size_t>(k);
  }
  return true;
}

void put_u32(std::string& out, size_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint32_t get_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

constexpr size_t kMaxKey = 64 * 1024, kMaxValue = size_t{1} << 30;

// Rank 0's server: one thread polling the listening socket, its clients and a wake pipe.
class Server {
 public:
  Server(const HostPort& hp, const std::string& who) {
    AddrInfo ai;
    std::string err = resolve(hp, ai);
    for (addrinfo* a = ai.list; a && listen_ < 0; a = a->ai_next) {
      int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      int one = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 1024) == 0) {
        listen_ = fd;
      } else {
        err = std::strerror(errno);
        ::close(fd);
      }
    }
    LOOM_CHECK_T(DistError, listen_ >= 0, "[init] ", who, ": cannot serve the TCP store on ",
                 hp.host, ":", hp.port, ": ", err);
    if (::pipe2(wake_, O_CLOEXEC) != 0) {
      ::close(listen_);
      throw DistError(str_cat("[init] ", who, ": pipe failed: ", std::strerror(errno)));
    }
    thread_ = std::thread([this] { loop(); });
  }
  ~Server() {
    char c = 0;
    (void)!::write(wake_[1], &c, 1);
    thread_.join();
    for (auto& [fd, buf] : clients_) ::close(fd);
    ::close(listen_), ::close(wake_[0]), ::close(wake_[1]);
  }

 private:
  void loop() {
    for (;;) {
      std::vector<pollfd> fds{{wake_[0], POLLIN, 0}, {listen_, POLLIN, 0}};
      for (auto& [fd, buf] : clients_) fds.push_back({fd, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR) return;
      if (fds[0].revents) return;
      if (fds[1].revents & POLLIN) {
        int c = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c >= 0) {
          int one = 1;
          ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          clients_[c];
        }
      }
      for (size_t f = 2; f < fds.size(); ++f) {
        if (!fds[f].revents) continue;
        const int fd = fds[f].fd;
        char buf[65536];
        const ssize_t k = ::recv(fd, buf, sizeof buf, 0);
        if (k < 0 && errno == EINTR) continue;
        std::string& in = clients_[fd];
        if (k > 0) in.append(buf, static_cast<size_t>(k));
        if (k <= 0 || !serve(fd, in)) {
          ::close(fd);
          clients_.erase(fd);
        }
      }
    }
  }

  // Answers every complete request in `in`; false drops the client.
  bool serve(int fd, std::string& in) {
    size_t at = 0;
    for (;;) {
      const size_t left = in.size() - at;
      if (left == 0) break;
      const char op = in[at];
      if (op != 'S' && op != 'G') return false;
      if (left < 5) break;
      const size_t klen = get_u32(in.data() + at + 1);
      if (klen > kMaxKey) return false;
      size_t need = 5 + klen;
      if (left < need) break;
      std::string key = in.substr(at + 5, klen);
      std::string reply;
      if (op == 'S') {
        if (left < need + 4) break;
        const size_t vlen = get_u32(in.data() + at + need);
        if (vlen > kMaxValue) return false;
        if (left < need + 4 + vlen) break;
        const char* v = in.data() + at + need + 4;
        kv_[key].assign(v, v + vlen);
        need += 4 + vlen;
        reply = "K";
      } else {
        auto it = kv_.find(key);
        if (it == kv_.end()) {
          reply = "N";
        } else {
          reply = "Y";
          put_u32(reply, it->second.size());
          reply.append(it->second.data(), it->second.size());
        }
      }
      if (!send_all(fd, reply.data(), reply.size())) return false;
      at += need;
    }
    in.erase(0, at);
    return true;
  }

  int listen_ = -1;
  int wake_[2] = {-1, -1};
  std::map<int, std::string> clients_;  // fd -> bytes received, not yet a whole request
  std::map<std::string, std::vector<char>> kv_;
  std::thread thread_;
};

class TcpStore final : public KeyValueStore {
 public:
  TcpStore(const std::string& s, bool serve, std::chrono::milliseconds timeout, std::string who)
      : hp_(split_host_port(s)), who_(std::move(who)) {
    if (serve) server_ = std::make_unique<Server>(hp_, who_);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::string err;
    while (fd_ < 0) {
      AddrInfo ai;
      err = resolve(hp_, ai);
      for (addrinfo* a = ai.list; a && fd_ < 0; a = a->ai_next) {
        int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
          fd_ = fd;
        } else {
          err = std::strerror(errno);
          ::close(fd);
        }
      }
      if (fd_ >= 0) break;
      if (std::chrono::steady_clock::now() > deadline)
        throw DistError(str_cat("[init] ", who_, ": ", describe(), " was not reached within ",
                                seconds(timeout), " s (the timeout): ", err,
                                ". Rank 0 serves it: is rank 0 running, and is this its address?"));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
    tv.tv_usec = static_cast<suseconds_t>(timeout.count() % 1000 * 1000);
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  }
  ~TcpStore() override {
    if (fd_ >= 0) ::close(fd_);
  }

  void put(const std::string& key, const std::vector<char>& value) override {
    LOOM_CHECK_T(DistError, key.size() <= kMaxKey && value.size() <= kMaxValue, "[init] ", who_,
                 ": a store entry of ", key.size(), " + ", value.size(),
                 " bytes is over the TCP store's limits (64 KiB keys, 1 GiB values)");
    std::string req = "S";
    put_u32(req, key.size());
    req += key;
    put_u32(req, value.size());
    req.append(value.data(), value.size());
    std::lock_guard<std::mutex> lock(mu_);
    char r = 0;
    errno = 0;
    if (!send_all(fd_, req.data(), req.size()) || !recv_all(fd_, &r, 1) || r != 'K') lost();
  }

  std::optional<std::vector<char>> try_get(const std::string& key) override {
    std::string req = "G";
    put_u32(req, key.size());
    req += key;
    std::lock_guard<std::mutex> lock(mu_);
    char r = 0;
    errno = 0;
    if (!send_all(fd_, req.data(), req.size()) || !recv_all(fd_, &r, 1)) lost();
    if (r == 'N') return std::nullopt;
    char n[4];
    if (r != 'Y' || !recv_all(fd_, n, 4)) lost();
    std::vector<char> v(get_u32(n));
    if (!recv_all(fd_, v.data(), v.size())) lost();
    return v;
  }

  std::string describe() const override {
    return str_cat("the TCP store at ", hp_.host, ":", hp_.port);
  }

 private:
  [[noreturn]] void lost() {
    throw DistError(str_cat("[init] ", who_, ": ", describe(), " stopped answering (",
                            errno == EAGAIN || errno == EWOULDBLOCK ? "no answer within the timeout"
                            : errno                                 ? std::strerror(errno)
                                                                    : "connection closed",
                            "): rank 0 serves it; did rank 0 end?"));
  }

  HostPort hp_;
  std::string who_;
  std::unique_ptr<Server> server_;  // rank 0 only; destroyed after the connection below
  int fd_ = -1;
  std::mutex mu_;
};

}  // namespace

bool is_tcp_store(const std::string& store) {
  return store.find(':') != std::string::npos && store.find('/') == std::string::npos;
}

std::unique_ptr<KeyValueStore> make_dir_store(const std::string& dir) {
  return std::make_unique<DirStore>(dir);
}

std::unique_ptr<KeyValueStore> make_tcp_store(const std::string& host_port, bool serve,
                                              std::chrono::milliseconds timeout,
                                              const std::string& who) {
  return std::make_unique<TcpStore>(host_port, serve, timeout, who);
}

}  // namespace loom::dist
