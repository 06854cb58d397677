// The rendezvous stores the Gloo communicator meets through: a key-value map that every rank
// writes its own keys into and reads the others' from. Two kinds:
//   - a directory every rank sees (one file per key, written to a temporary name and renamed);
//   - a TCP store at host:port: rank 0 serves it (bound to that host) from a thread of its
//     process, every rank (rank 0 too) is a client. Debian's Gloo 0.5.0 has no TCP store.
// Neither blocks without a deadline: a client that cannot reach the server, or a server that
// stops answering, raises DistError within the communicator's timeout.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace loom::dist {

// A timeout in seconds, for messages.
inline double seconds(std::chrono::milliseconds t) {
  return static_cast<double>(t.count()) / 1000.0;
}

class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  virtual void put(const std::string& key, const std::vector<char>& value) = 0;
  // The value, or nothing when the key is not set (yet).
  virtual std::optional<std::vector<char>> try_get(const std::string& key) = 0;
  // "the store '/dir'" or "the TCP store at host:port", for messages.
  virtual std::string describe() const = 0;
};

// True when `store` names host:port (a ':' and no '/').
bool is_tcp_store(const std::string& store);

std::unique_ptr<KeyValueStore> make_dir_store(const std::string& dir);

// Rank 0 (`serve`) listens on host:port and keeps serving until the store is destroyed; every
// rank connects to it, retrying until `timeout` passes. `who` ("rank 1 of 2") prefixes errors.
std::unique_ptr<KeyValueStore> make_tcp_store(const std::string& host_port, bool serve,
                                              std::chrono::milliseconds timeout,
                                              const std::string& who);

}  // namespace loom::dist
