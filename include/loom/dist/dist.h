// loom::dist: training across ranks (processes, or threads of one process) on Gloo.
//
//   loom::dist::init();                      // from LOOM_RANK, LOOM_WORLD_SIZE, LOOM_STORE
//   Tensor g = loom::dist::all_reduce(x);    // a lazy graph op (loom/trace/collective.h)
//   loom::dist::barrier();
//
// Run N ranks with `loom-launch -n N PROGRAM ARGS...` (tools/loom_launch.cpp), or in one
// process with run_in_process(N, fn) (each thread a rank: tests). Every collective has a
// timeout (LOOM_DIST_TIMEOUT seconds, default 60); before a graph holding collectives runs,
// the ranks compare its fingerprint (loom/runtime/dist_check.h), so ranks that would run
// different collectives raise a DistError naming the ranks and the first differing op instead
// of hanging. After a DistError the communicator is broken: end the program.
// Thread-safety: the process's communicator is used by one thread at a time.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "loom/core/communicator.h"
#include "loom/trace/collective.h"
#include "loom/trace/sharding.h"

namespace loom::dist {

struct InitOptions {
  int rank = -1;         // -1: LOOM_RANK
  int world_size = -1;   // -1: LOOM_WORLD_SIZE
  std::string store;     // a directory every rank sees, or host:port (a TCP store rank 0
                         // serves, bound to host); "": LOOM_STORE
  std::string address;   // the address Gloo binds: "": LOOM_DIST_ADDR, else 127.0.0.1
  double timeout_s = 0;  // 0: LOOM_DIST_TIMEOUT, else 60
};

// Connects this process to the others (Gloo over TCP) and makes it the process's
// communicator. init() reads the environment; a world of 1 needs no store.
void init();
void init(const InitOptions& options);
// Drops the process's communicator (the connections close).
void finalize();
bool initialized();
int rank();        // the current communicator's rank; 0 without one
int world_size();  // its size; 1 without one
// Waits for every rank, checking that they all call it at this point of their graphs.
void barrier();

// A Gloo communicator (what init() makes), for tests and several groups.
std::shared_ptr<Communicator> make_gloo_communicator(const InitOptions& options);
// n communicators of one in-process group (rank r at position r).
std::vector<std::shared_ptr<Communicator>> in_process_group(
    int n, std::chrono::milliseconds timeout = default_timeout());
// Runs fn(rank) on n threads, each with its rank of a fresh in-process group as the thread's
// communicator; returns each rank's exception (null when it returned).
std::vector<std::exception_ptr> run_in_process(
    int n, const std::function<void(int)>& fn,
    std::chrono::milliseconds timeout = default_timeout());

}  // namespace loom::dist
