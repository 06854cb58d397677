"""python -m loom.launch: starts N local ranks of a program with their environment.

    python -m loom.launch -n N [--store DIR|HOST:PORT] [--rank-offset K] [--world-size W] PROGRAM ARGS...

PROGRAM is a Python file (run with this interpreter), `-m MODULE`, or any executable. Each
rank gets LOOM_RANK (K + i), LOOM_LOCAL_RANK (i), LOOM_WORLD_SIZE (W, default K + N) and
LOOM_STORE (DIR or HOST:PORT; default a fresh temporary directory, removed at the end;
with HOST:PORT, rank 0 serves a TCP store bound to HOST). Every line a rank
prints is prefixed with "[rank R] " (stdout to stdout, stderr to stderr). When a rank fails
(non-zero exit or a signal), the others are ended (SIGTERM, then SIGKILL after 3 s) and the
launcher exits with the failing rank's status (128 + signal for a signal). The same options
and behaviour as the C++ `loom-launch`.

Multi-host: the same command on every host, with the same store (a directory every host sees,
or --store HOSTA:PORT where HOSTA is the address of the host that runs rank 0), the total
--world-size, --rank-offset = the ranks started before this host, and LOOM_DIST_ADDR = this
host's address (Gloo binds it; 127.0.0.1 reaches local ranks only).
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time


def _pump(stream, out, prefix, lock):
    for line in iter(stream.readline, b""):
        with lock:
            out.write(prefix + line)
            out.flush()
    stream.close()


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m loom.launch",
                                description="Starts N local ranks of a loom program.")
    p.add_argument("-n", "--nproc", type=int, required=True, help="ranks on this host")
    p.add_argument("--store", help="a rendezvous directory every rank sees, or HOST:PORT for a TCP "
                   "store that rank 0 serves (default: a fresh temporary directory)")
    p.add_argument("--rank-offset", type=int, default=0, help="ranks started on other hosts")
    p.add_argument("--world-size", type=int, help="all ranks (default: offset + n)")
    p.add_argument("program", help="a .py file, -m MODULE, or an executable")
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    if a.nproc < 1 or a.rank_offset < 0:
        p.error("-n must be at least 1 and --rank-offset not negative")
    world = a.world_size if a.world_size is not None else a.rank_offset + a.nproc
    if world < a.rank_offset + a.nproc:
        p.error(f"--world-size {world} is smaller than --rank-offset + -n")
    if a.program == "-m":
        cmd = [sys.executable, "-m"] + a.args
    elif a.program.endswith(".py"):
        cmd = [sys.executable, a.program] + a.args
    else:
        cmd = [a.program] + a.args
    store = a.store or tempfile.mkdtemp(prefix="loom-store-")
    procs, pumps, lock = [], [], threading.Lock()
    out, err = sys.stdout.buffer, sys.stderr.buffer
    for i in range(a.nproc):
        r = a.rank_offset + i
        env = dict(os.environ, LOOM_RANK=str(r), LOOM_LOCAL_RANK=str(i),
                   LOOM_WORLD_SIZE=str(world), LOOM_STORE=store)
        pr = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        procs.append((r, pr))
        prefix = f"[rank {r}] ".encode()
        for stream, sink in ((pr.stdout, out), (pr.stderr, err)):
            t = threading.Thread(target=_pump, args=(stream, sink, prefix, lock), daemon=True)
            t.start()
            pumps.append(t)
    status = 0

    def end_all():
        for _, q in procs:
            if q.poll() is None:
                q.terminate()
        deadline = time.monotonic() + 3
        for _, q in procs:
            try:
                q.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                q.kill()
                q.wait()

    try:
        running = dict(procs)
        while running:
            for r, q in list(running.items()):
                rc = q.poll()
                if rc is None:
                    continue
                del running[r]
                if rc != 0 and status == 0:
                    status = 128 - rc if rc < 0 else rc
                    how = f"signal {-rc}" if rc < 0 else f"exit {rc}"
                    with lock:
                        err.write(f"loom.launch: rank {r} failed ({how}); ending the others\n"
                                  .encode())
                        err.flush()
                    end_all()
            time.sleep(0.02)
    except KeyboardInterrupt:
        end_all()
        status = 128 + signal.SIGINT
    for t in pumps:
        t.join()
    if not a.store:
        shutil.rmtree(store, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
