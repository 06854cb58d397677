"""Shared by the peer scripts that `loom-bench --peers` runs: the workloads' sizes, timing,
and the output format (one `key value` line per figure, read by loom-bench).

Each peer script is run by its own interpreter (a venv outside the repository, recipe in
../shared/reference/peers_setup.md) as `python PEER.py WORK [--layers N]`, where WORK is one
of WORKS. It prints the figures it has for WORK and exits 0; a WORK it cannot run prints
`unsupported 1`.
"""
import argparse
import statistics
import time

WORKS = ("decoder_forward", "decoder_train_step", "scan_layers_compile", "cumsum_scan",
         "mlp_train", "attention")

# The seed decoder (Example 3): LAYERS x [Linear(DIM, DIM) -> exact GELU -> + residual], then
# LayerNorm(DIM), on x [BATCH, SEQ, DIM] float32, as loom-bench's decoder benchmarks.
LAYERS, DIM, BATCH, SEQ = 50, 512, 4, 512
CUMSUM_N = 1000  # cumsum_scan: a scan over this many float32 scalars
MLP_BATCH = 64   # mlp_train: 784-256-10, ReLU, cross entropy, SGD lr 0.01
# attention: scaled dot-product attention forward + backward on [ATT_B, ATT_H, T, ATT_D]
# float32, not causal, at each T of ATT_T
ATT_B, ATT_H, ATT_D, ATT_T = 4, 8, 64, (1024, 4096)


def parse_args(doc):
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("work", choices=WORKS)
    p.add_argument("--layers", type=int, default=LAYERS)
    p.add_argument("--reps", type=int, default=5)
    return p.parse_args()


def emit(key, value):
    print(f"{key} {value:.6g}", flush=True)


def median_ms(fn, reps, warmup=1):
    """The median of `reps` timings of fn() in milliseconds, after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def best_rate(fn, steps, rounds=5, warmup=30, finish=None):
    """Steps per second of `steps` calls of fn(), the best of `rounds`; finish() (if given)
    waits for asynchronous work at the end of each round."""
    for _ in range(warmup):
        fn()
    if finish:
        finish()
    best = 0.0
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        if finish:
            finish()
        best = max(best, steps / (time.perf_counter() - t0))
    return best
