// The Gloo communicator: one process per rank over Gloo's TCP transport, bound to the address
// the user names, rendezvous through a store (tcp_store.h): a directory every rank sees or a
// TCP store at host:port that rank 0 serves. Gloo's errors (IoException, timeouts) become
// DistError naming the op, the rank(s) and the timeout; after one the communicator is broken
// (Gloo: the transport state is unknown). When every rank is on this host, every collective
// (all_reduce and so reduce_scatter and the cross-rank check, all_gather, broadcast, barrier)
// goes through a shared-memory segment instead of TCP (shm_reduce.h); exchange, which only
// the mismatch path and the segment's own setup use, stays on Gloo.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <thread>

#include "distributed/reduce_impl.h"
#include "distributed/shm_reduce.h"
#include "distributed/tcp_store.h"
#include "loom/core/config.h"
#include "loom/core/error.h"
#include "loom/dist/dist.h"

namespace loom::dist {

namespace {

using loom::detail::str_cat;

// Gloo's view of a loom store: waits poll the store until the keys are there or our timeout
// passes, so that a store that never fills names the keys (ranks) it waited for.
class RendezvousStore final : public gloo::rendezvous::Store {
 public:
  RendezvousStore(std::unique_ptr<KeyValueStore> kv, std::chrono::milliseconds timeout)
      : kv_(std::move(kv)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override { kv_->put(key, data); }
  std::vector<char> get(const std::string& key) override {
    wait({key}, timeout_);
    return kv_->try_get(key).value_or(std::vector<char>{});
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + std::min(timeout, timeout_);
    for (;;) {
      std::string missing = missing_keys(keys, ", ");
      if (missing.empty()) return;
      if (std::chrono::steady_clock::now() > deadline)
        throw DistError(str_cat("[init] ", kv_->describe(), " did not fill within ",
                                seconds(timeout_), " s (the timeout): missing keys ", missing));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  // The keys of `keys` not in the store, joined by `sep`; "" when all are.
  std::string missing_keys(const std::vector<std::string>& keys, const char* sep,
                           const std::string& strip = "") {
    std::string missing;
    for (const std::string& k : keys)
      if (!kv_->try_get(k))
        missing += (missing.empty() ? "" : sep) + k.substr(std::min(strip.size(), k.size()));
    return missing;
  }
  std::string describe() const { return kv_->describe(); }

 private:
  std::unique_ptr<KeyValueStore> kv_;
  std::chrono::milliseconds timeout_;
};

std::vector<std::string> rank_keys(const char* prefix, int n) {
  std::vector<std::string> keys;
  for (int r = 0; r < n; ++r) keys.push_back(prefix + std::to_string(r));
  return keys;
}

class GlooCommunicator final : public Communicator {
 public:
  explicit GlooCommunicator(const InitOptions& o) : rank_(o.rank), size_(o.world_size) {
    if (o.timeout_s > 0)
      set_timeout(std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000)));
    // A write to a peer that died must raise, not end the process.
    std::signal(SIGPIPE, SIG_IGN);
    LOOM_CHECK_T(DistError, !o.store.empty(), "[init] rank ", rank_, " of ", size_,
                 ": no store: set LOOM_STORE to a directory every rank sees or to host:port "
                 "(rank 0 serves it; loom-launch sets a directory)");
    const std::string who = str_cat("rank ", rank_, " of ", size_);
    const bool tcp = is_tcp_store(o.store);
    store_ = std::make_unique<RendezvousStore>(
        tcp ? make_tcp_store(o.store, rank_ == 0, timeout(), who) : make_dir_store(o.store),
        timeout());
    // Ranks register first, so that a store that never fills names the missing ranks.
    store_->set("loom_rank_" + std::to_string(rank_), {'1'});
    const std::vector<std::string> keys = rank_keys("loom_rank_", size_);
    try {
      store_->wait(keys, timeout());
    } catch (const DistError&) {
      throw DistError(str_cat("[init] ", who, ": ", store_->describe(), " did not fill within ",
                              seconds(timeout()), " s (the timeout): ranks that never registered: ",
                              store_->missing_keys(keys, ",", "loom_rank_")));
    }
    gloo::transport::tcp::attr attr;
    attr.hostname = o.address;
    try {
      auto dev = gloo::transport::tcp::CreateDevice(attr);
      ctx_ = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
      ctx_->setTimeout(timeout());
      ctx_->connectFullMesh(*store_, dev);
      if (tcp) {
        // Rank 0's process serves the store: it returns only when every rank is done with it.
        store_->set("loom_ready_" + std::to_string(rank_), {'1'});
        if (rank_ == 0) store_->wait(rank_keys("loom_ready_", size_), timeout());
      }
    } catch (const DistError&) {
      throw;
    } catch (const std::exception& e) {
      throw DistError(str_cat("[init] rank ", rank_, " of ", size_, " (gloo, ", o.address,
                              "): connecting the ranks failed within ", seconds(timeout()),
                              " s (the timeout): ", e.what()));
    }
    std::string no_shm;
    shm_ = detail::ShmReduce::create(*this, &no_shm);
    if (config().debug)
      std::fprintf(stderr, "[loom] rank %d of %d: all_reduce %s\n", rank_, size_,
                   shm_ ? "through shared memory" : ("on Gloo's ring: " + no_shm).c_str());
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view kind() const override { return shm_ ? "gloo+shm" : "gloo"; }

  void all_reduce(void* data, int64_t n, DType dt, ReduceOp op) override {
    detail::check_reduce("all_reduce", dt, op);
    if (n == 0) return;
    if (shm_)
      return on_segment("all_reduce", [&] { shm_->all_reduce(data, n, dt, op, timeout()); });
    guarded("all_reduce", [&] {
      gloo::AllreduceOptions opts(ctx_);
      set_output(opts, data, n, itemsize(dt));
      opts.setReduceFunction([dt, op](void* c, const void* a, const void* b, size_t k) {
        if (c != a) std::memcpy(c, a, k * static_cast<size_t>(itemsize(dt)));
        detail::reduce_into(c, b, static_cast<int64_t>(k), dt, op);
      });
      opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      opts.setTimeout(timeout());
      gloo::allreduce(opts);
    });
    if (op == ReduceOp::Mean) detail::divide(data, n, dt, size_);
  }

  void all_gather(const void* in, void* out, int64_t bytes) override {
    if (bytes == 0) return;
    if (shm_) return on_segment("all_gather", [&] { shm_->all_gather(in, out, bytes, timeout()); });
    guarded("all_gather", [&] {
      gloo::AllgatherOptions opts(ctx_);
      opts.setInput(static_cast<uint8_t*>(const_cast<void*>(in)), static_cast<size_t>(bytes));
      opts.setOutput(static_cast<uint8_t*>(out), static_cast<size_t>(bytes * size_));
      opts.setTimeout(timeout());
      gloo::allgather(opts);
    });
  }

  void all_to_all(const void* in, void* out, int64_t bytes) override {
    if (bytes == 0) return;
    guarded("all_to_all", [&] {
      gloo::AlltoallOptions opts(ctx_);
      const size_t n = static_cast<size_t>(bytes * size_);
      opts.setInput(static_cast<uint8_t*>(const_cast<void*>(in)), n);
      opts.setOutput(static_cast<uint8_t*>(out), n);
      opts.setTimeout(timeout());
      gloo::alltoall(opts);
    });
  }

  void broadcast(void* data, int64_t bytes, int root) override {
    LOOM_CHECK(root >= 0 && root < size_, "[broadcast] root ", root, " is not a rank of ", size_);
    if (bytes == 0) return;
    if (shm_)
      return on_segment("broadcast", [&] { shm_->broadcast(data, bytes, root, timeout()); });
    guarded("broadcast", [&] {
      gloo::BroadcastOptions opts(ctx_);
      opts.setOutput(static_cast<uint8_t*>(data), static_cast<size_t>(bytes));
      opts.setRoot(root);
      opts.setTimeout(timeout());
      gloo::broadcast(opts);
    });
  }

  void barrier() override {
    if (shm_) return on_segment("barrier", [&] { shm_->barrier(timeout()); });
    guarded("barrier", [&] {
      gloo::BarrierOptions opts(ctx_);
      opts.setTimeout(timeout());
      gloo::barrier(opts);
    });
  }

  // Point to point with every peer, so that a peer that does not answer is named.
  std::vector<std::string> exchange(std::string_view mine) override {
    std::vector<std::string> all(static_cast<size_t>(size_));
    all[static_cast<size_t>(rank_)] = std::string(mine);
    if (size_ == 1) return all;
    check_broken("exchange");
    std::vector<int64_t> lens(static_cast<size_t>(size_), 0);
    int64_t len = static_cast<int64_t>(mine.size());
    const int slot = ctx_->nextSlot(2);
    round(
        "exchange", slot, &len, sizeof len, [&](int p) { return &lens[static_cast<size_t>(p)]; },
        [](int) { return sizeof(int64_t); });
    std::string payload(mine);
    if (payload.empty()) payload.push_back('\0');
    for (int p = 0; p < size_; ++p)
      if (p != rank_)
        all[static_cast<size_t>(p)].assign(std::max<int64_t>(lens[static_cast<size_t>(p)], 1),
                                           '\0');
    round(
        "exchange", slot + 1, payload.data(), payload.size(),
        [&](int p) { return all[static_cast<size_t>(p)].data(); },
        [&](int p) { return all[static_cast<size_t>(p)].size(); });
    for (int p = 0; p < size_; ++p)
      if (p != rank_)
        all[static_cast<size_t>(p)].resize(static_cast<size_t>(lens[static_cast<size_t>(p)]));
    return all;
  }

 private:
  template <class Opts>
  static void set_output(Opts& opts, void* data, int64_t n, int64_t item) {
    switch (item) {
      case 1: opts.setOutput(static_cast<uint8_t*>(data), static_cast<size_t>(n)); break;
      case 2: opts.setOutput(static_cast<uint16_t*>(data), static_cast<size_t>(n)); break;
      case 4: opts.setOutput(static_cast<uint32_t*>(data), static_cast<size_t>(n)); break;
      default: opts.setOutput(static_cast<uint64_t*>(data), static_cast<size_t>(n)); break;
    }
  }

  void check_broken(const char* op) const {
    if (!broken_.empty())
      throw DistError(str_cat("[", op, "] rank ", rank_, " of ", size_,
                              ": the communicator is broken by an earlier failure: ", broken_));
  }

  // The peers a failed collective waited on, for the message.
  std::string peers_text() const {
    if (size_ == 2) return str_cat("rank ", 1 - rank_);
    return str_cat("one of ranks ", (rank_ + size_ - 1) % size_, " and ", (rank_ + 1) % size_,
                   " (its ring neighbours) or a rank they wait on");
  }

  // A collective on the shared-memory segment: Gloo's TCP path took 2-10 ms to wake the ranks
  // after a busy step on a 2-core VM (the segment: 5-140 us). Its DistError breaks the
  // communicator, as a Gloo failure does.
  template <class F>
  void on_segment(const char* op, F&& f) {
    check_broken(op);
    try {
      f();
    } catch (const DistError& e) {
      broken_ = e.what();
      throw;
    }
  }

  template <class F>
  void guarded(const char* op, F&& f) {
    check_broken(op);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      f();
    } catch (const std::exception& e) {
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      broken_ = str_cat("[", op, "] rank ", rank_, " of ", size_, " (gloo): failed after ", waited,
                        " s (timeout ", seconds(timeout()),
                        " s); the rank that died or did not "
                        "answer: ",
                        peers_text(), ". Gloo: ", e.what());
      throw DistError(broken_);
    }
  }

  template <class RecvPtr, class RecvSize>
  void round(const char* op, int slot, void* send, size_t send_bytes, RecvPtr recv_ptr,
             RecvSize recv_size) {
    auto sbuf = ctx_->createUnboundBuffer(send, send_bytes);
    std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> rbufs(static_cast<size_t>(size_));
    int peer = -1;  // posting to a peer that already closed its end throws too
    try {
      for (peer = 0; peer < size_; ++peer) {
        if (peer == rank_) continue;
        rbufs[static_cast<size_t>(peer)] =
            ctx_->createUnboundBuffer(recv_ptr(peer), recv_size(peer));
        rbufs[static_cast<size_t>(peer)]->recv(peer, static_cast<uint64_t>(slot));
      }
      for (peer = 0; peer < size_; ++peer)
        if (peer != rank_) sbuf->send(peer, static_cast<uint64_t>(slot));
    } catch (const std::exception& e) {
      broken_ =
          str_cat("[", op, "] rank ", rank_, " of ", size_, " (gloo): rank ", peer,
                  " closed its connection before the cross-rank check: it died. Gloo: ", e.what());
      throw DistError(broken_);
    }
    const auto t0 = std::chrono::steady_clock::now();
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      std::string fail;
      try {
        rbufs[static_cast<size_t>(p)]->waitRecv(timeout());
      } catch (const std::exception& e) {
        fail = e.what();
      }
      if (!fail.empty()) {
        const double waited =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        broken_ =
            str_cat("[", op, "] rank ", rank_, " of ", size_, " (gloo): rank ", p,
                    " did not answer the cross-rank check within ", waited, " s (timeout ",
                    seconds(timeout()), " s): it died, or it runs other graphs. Gloo: ", fail);
        throw DistError(broken_);
      }
    }
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      try {
        sbuf->waitSend(timeout());
      } catch (const std::exception& e) {
        broken_ = str_cat("[", op, "] rank ", rank_, " of ", size_,
                          " (gloo): sending to the "
                          "ranks failed (timeout ",
                          seconds(timeout()), " s). Gloo: ", e.what());
        throw DistError(broken_);
      }
    }
  }

  int rank_, size_;
  std::unique_ptr<RendezvousStore> store_;
  std::shared_ptr<gloo::rendezvous::Context> ctx_;
  std::string broken_;
  std::unique_ptr<detail::ShmReduce> shm_;  // null: all_reduce on the ring (LOOM_DEBUG says why)
};

}  // namespace

std::shared_ptr<Communicator> make_gloo_communicator(const InitOptions& options) {
  InitOptions o = options;
  if (o.store.empty()) {
    const char* s = std::getenv("LOOM_STORE");
    o.store = s ? s : "";
  }
  if (o.address.empty()) {
    const char* a = std::getenv("LOOM_DIST_ADDR");
    o.address = a && *a ? a : "127.0.0.1";
  }
  LOOM_CHECK_T(DistError, o.world_size >= 1 && o.rank >= 0 && o.rank < o.world_size, "[init] rank ",
               o.rank, " is not in a world of ", o.world_size);
  return std::make_shared<GlooCommunicator>(o);
}

}  // namespace loom::dist
