// All_reduce through shared memory, for the ranks of a Gloo group that share a host (the
// common case of `loom-launch -n N`): Gloo's ring over loopback TCP moves every byte through
// the kernel's socket buffers, twice, on the ranks' own cores (4 MiB: 4.4-5.8 ms between 2
// ranks; through the segment: about 1 ms).
//
// One POSIX shared-memory segment per group: a control line per rank, a slot per rank and a
// result area, each `slot_bytes`. all_gather, broadcast and barrier (an all_reduce of one
// byte) use it too. An all_reduce goes through in chunks of at most slot_bytes:
//   1. each rank copies its chunk into its slot, except the block it reduces itself, and
//      publishes the chunk's sequence number;
//   2. when every rank has published, rank r reduces block r (1/N of the chunk) over the
//      ranks' slots in rank order into the result area (Mean divides there) and publishes
//      again;
//   3. when every rank has, each copies the whole result back into its buffer.
// Every rank therefore holds the same bits (one rank computed each element). A rank enters
// the next chunk only after every rank has published step 2 of this one, so no slot and no
// block of the result area is written while another rank still reads it.
// Waits spin briefly, then yield, then sleep, and raise DistError naming the ranks that did
// not arrive when the communicator's timeout passes (a rank died, or runs other collectives),
// or sooner, naming it, when a rank's process has exited (each rank's control line holds its
// pid and PID namespace; the check runs every 10 ms of a wait, when the ranks share one).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "loom/core/communicator.h"

namespace loom::dist::detail {

class ShmReduce {
 public:
  // Collective over `c` (every rank calls it at the same point): the segment when every rank
  // of c is on this host (hostname and boot id) and it could be made and mapped, else nullptr
  // with the reason in *why. LOOM_DIST_SHM=0 on any rank turns it off; LOOM_DIST_SHM_KIB on
  // rank 0 sets the slot size (default 4096 KiB; tests use small slots to cross chunks).
  static std::unique_ptr<ShmReduce> create(Communicator& c, std::string* why);
  ~ShmReduce();
  ShmReduce(const ShmReduce&) = delete;
  ShmReduce& operator=(const ShmReduce&) = delete;

  // As Communicator::all_reduce (the dtype and op already checked); DistError after
  // `timeout` waiting for a rank (the Gloo communicator is then broken: later calls raise).
  void all_reduce(void* data, int64_t n, DType dt, ReduceOp op, std::chrono::milliseconds timeout);
  // An all_reduce of one byte, named "[barrier]" in messages.
  void barrier(std::chrono::milliseconds timeout);
  // As Communicator::all_gather and broadcast, in slot-sized chunks: each rank (the root)
  // copies its chunk into its slot, and after the first wait every rank copies what it needs
  // out; the second wait keeps a slot from being overwritten while another rank reads it.
  void all_gather(const void* in, void* out, int64_t bytes, std::chrono::milliseconds timeout);
  void broadcast(void* data, int64_t bytes, int root, std::chrono::milliseconds timeout);

 private:
  ShmReduce(int rank, int size, char* base, size_t bytes, int64_t slot_bytes);
  // Publishes `seq` in this rank's `which` counter (0: copied in, 1: reduced) and waits until
  // every rank has.
  void arrive_and_wait(int which, uint64_t seq, const char* op, std::chrono::milliseconds timeout);

  void reduce(void* data, int64_t n, DType dt, ReduceOp op, std::chrono::milliseconds timeout,
              uint64_t kind, const char* what);
  char* slot(int r) const;
  uint64_t* line(int r) const;  // rank r's first counter line (its counter, pid, call)
  // One collective as every rank must call it (kind, dtype, reduce op, count, root): written
  // in this rank's control line before its first wait and compared after it, so that ranks
  // calling different collectives, or sizes, raise instead of mixing their buffers.
  struct Call {
    uint64_t kind, dtype, op, count, root;
  };
  void begin(const Call& call);
  void check_call(const Call& call, const char* op) const;

  int rank_, size_;
  char* base_;
  size_t bytes_;
  int64_t slot_bytes_;
  uint64_t seq_ = 0;
  // Every rank's pid is in this process's PID namespace: a wait may look whether it exited.
  bool pids_comparable_ = false;
};

}  // namespace loom::dist::detail
