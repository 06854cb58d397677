// The TCP store (LOOM_STORE=host:port, rank 0 serves it): three ranks meet through it and run
// collectives; its server answers the documented wire format and drops a malformed client
// without harm to the others; a store that never fills, a missing rank 0, a port in use and
// malformed store names each raise a DistError within twice the timeout.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "dist/dist_util.h"
#include "expect_error.h"
#include "loom/loom.h"

namespace loom {
namespace {

using testing::expect_error;
using Clock = std::chrono::steady_clock;

constexpr double kTimeout = 2.0;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int port_of(const std::string& store) {
  return std::atoi(store.substr(store.rfind(':') + 1).c_str());
}

// A raw client of the store's server on 127.0.0.1:port, with a 5 s receive timeout.
int connect_to(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = testing::loopback(port);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << std::strerror(errno);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

// Rank `rank` of a world of 2 over the TCP store `store`, with the short timeout.
dist::InitOptions options(int rank, const std::string& store) {
  dist::InitOptions o;
  o.rank = rank;
  o.world_size = 2;
  o.store = store;
  o.timeout_s = kTimeout;
  return o;
}

std::string get_request(const std::string& key) {
  std::string r = "G";
  for (int i = 0; i < 4; ++i) r.push_back(static_cast<char>((key.size() >> (8 * i)) & 0xff));
  return r + key;
}

TEST(TcpStore, ThreeRanksMeetAndRunCollectives) {
  const std::string store = testing::free_tcp_store();
  testing::gloo_ranks(
      3, 20,
      [&](int r) {
        // sum over ranks of (r + 1) * i, for i in [0, 1000)
        std::vector<float> got = dist::all_reduce(arange(0, 1000) * (r + 1.0)).to_vector<float>();
        for (int i = 0; i < 1000; i += 97) EXPECT_EQ(got[static_cast<size_t>(i)], 6.0f * i);
        std::vector<float> g = dist::all_gather(full({2}, r)).to_vector<float>();
        for (int k = 0; k < 3; ++k) EXPECT_EQ(g[static_cast<size_t>(2 * k + 1)], k);
        if (r == 0) {
          const int port = port_of(store);  // rank 0 is this process
          // The wire format of tcp_store.cpp: a get of a key every rank set answers 'Y', 4
          // length bytes and the value; an unknown key answers 'N'.
          int fd = connect_to(port);
          std::string req = get_request("loom_rank_2") + get_request("no_such_key");
          ASSERT_EQ(::send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
          char reply[7] = {};
          ssize_t got_n = 0;
          while (got_n < 7) {
            ssize_t k = ::recv(fd, reply + got_n, sizeof reply - static_cast<size_t>(got_n), 0);
            ASSERT_GT(k, 0) << "the server did not answer";
            got_n += k;
          }
          EXPECT_EQ(std::string(reply, 7), std::string("Y\x01\0\0\0"
                                                       "1N",
                                                       7));
          ::close(fd);
          // A malformed request: the server closes that connection (recv sees the end) ...
          fd = connect_to(port);
          ASSERT_EQ(::send(fd, "X?", 2, 0), 2);
          char c = 0;
          EXPECT_EQ(::recv(fd, &c, 1, 0), 0) << "a malformed client was not dropped";
          ::close(fd);
          // ... and goes on serving the others.
          fd = connect_to(port);
          req = get_request("loom_rank_1");
          ASSERT_EQ(::send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
          EXPECT_EQ(::recv(fd, &c, 1, 0), 1);
          EXPECT_EQ(c, 'Y');
          ::close(fd);
        }
        dist::barrier();
      },
      60, store);
}

// World of 2 over a TCP store, only rank 0 comes: init raises, naming rank 1.
TEST(TcpStore, StoreThatNeverFills) {
  const dist::InitOptions o = options(0, testing::free_tcp_store());
  auto t0 = Clock::now();
  expect_error<DistError>([&] { dist::init(o); },
                          {"[init]", "the TCP store at 127.0.0.1:", "did not fill", "2 s",
                           "ranks that never registered: 1"});
  EXPECT_LT(since(t0), 2 * kTimeout);
  EXPECT_FALSE(dist::initialized());
}

// Rank 1 comes, rank 0 (the server) never does.
TEST(TcpStore, WithoutRankZeroRaises) {
  const dist::InitOptions o = options(1, testing::free_tcp_store());
  auto t0 = Clock::now();
  expect_error<DistError>([&] { dist::init(o); },
                          {"[init] rank 1 of 2", "the TCP store at 127.0.0.1:", "was not reached",
                           "2 s", "Rank 0 serves it"});
  EXPECT_LT(since(t0), 2 * kTimeout);
}

TEST(TcpStore, PortInUseRaises) {
  const std::string store = testing::free_tcp_store();
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = testing::loopback(port_of(store));
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  const dist::InitOptions o = options(0, store);
  expect_error<DistError>(
      [&] { dist::init(o); },
      {"[init] rank 0 of 2", "cannot serve the TCP store on " + store, "Address already in use"});
  ::close(fd);
}

TEST(TcpStore, MalformedNamesRaise) {
  for (const char* s : {"127.0.0.1:0", "127.0.0.1:65536", "127.0.0.1:", ":1234", "host:12x"}) {
    const dist::InitOptions o = options(0, s);
    expect_error<DistError>([&] { dist::init(o); },
                            {"[init]", std::string("the store '") + s + "'",
                             "neither a directory nor host:port", "1..65535"});
  }
}

}  // namespace
}  // namespace loom
