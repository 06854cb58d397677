"""Shared by the peer scripts that `loom-bench --peers` runs: the workloads' sizes, timing,
and the output format (one `key value` line per figure, read by loom-bench).

Each peer script is run by its own interpreter (a venv outside the repository, recipe in
../shared/reference/peers_setup.md) as `python PEER.py WORK [--layers N]`, where WORK is one
of WORKS. It prints the figures it has for WORK and exits 0; a WORK it cannot run prints
`unsupported 1`.
"""
import argparse
import pathlib
import resource
import statistics
import time

import numpy as np

WORKS = ("decoder_forward", "decoder_train_step", "scan_layers_compile", "cumsum_scan",
         "mlp_train", "attention", "gpt")

# The seed decoder (Example 3): LAYERS x [Linear(DIM, DIM) -> exact GELU -> + residual], then
# LayerNorm(DIM), on x [BATCH, SEQ, DIM] float32, as loom-bench's decoder benchmarks.
LAYERS, DIM, BATCH, SEQ = 50, 512, 4, 512
CUMSUM_N = 1000  # cumsum_scan: a scan over this many float32 scalars
MLP_BATCH = 64   # mlp_train: 784-256-10, ReLU, cross entropy, SGD lr 0.01
# attention: scaled dot-product attention forward + backward on [ATT_B, ATT_H, T, ATT_D]
# float32, not causal, at each T of ATT_T
ATT_B, ATT_H, ATT_D, ATT_T = 4, 8, 64, (1024, 4096)
# gpt: nanoGPT's character-level configuration (shakespeare_char, no dropout) on this machine's
# scale, trained on data/tale_of_two_cities.txt from the same weights and batches in every
# program (gpt_params, gpt_starts; bench/gpt_bench.cpp draws the same). GPT_STEPS steps: step 0
# traces and compiles, steps 1.. are the steady ones; the loss every GPT_LOSS_EVERY steps.
GPT_LAYERS, GPT_HEADS, GPT_DIM, GPT_T, GPT_BATCH = 6, 6, 384, 256, 8
GPT_LR, GPT_BETAS, GPT_EPS, GPT_WEIGHT_DECAY = 1e-3, (0.9, 0.99), 1e-8, 0.1
GPT_STEPS, GPT_LOSS_EVERY = 31, 10
GPT_INIT_SEED, GPT_BATCH_SEED = 1, 2
GPT_TEXT = pathlib.Path(__file__).resolve().parents[2] / "data" / "tale_of_two_cities.txt"


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


def splitmix_uniform(seed, start, n):
    """Uniforms in [0, 1) from splitmix64 (bench.h's HostRng): the draws start .. start + n - 1
    of the generator seeded with `seed`, as float64 ((z >> 11) * 2^-53)."""
    i = np.arange(start + 1, start + n + 1, dtype=np.uint64)
    z = np.uint64(seed) + i * np.uint64(0x9E3779B97F4A7C15)  # wraps modulo 2^64
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def gpt_data():
    """The text as class indices (its bytes, the vocabulary their sorted distinct values)."""
    raw = np.frombuffer(GPT_TEXT.read_bytes(), dtype=np.uint8)
    chars = np.unique(raw)
    return np.searchsorted(chars, raw).astype(np.int64), len(chars)


def gpt_params(vocab):
    """nanoGPT's parameters by name, in order, float32: every matrix 0.02 * sqrt(3) * (2u - 1)
    (uniform with std 0.02), drawn in this order from one splitmix64 stream; LayerNorm weights 1,
    biases 0. lm_head.weight is wte's (tied), so it is not listed."""
    D, out, drawn = GPT_DIM, [], 0

    def matrix(name, rows, cols):
        nonlocal drawn
        u = splitmix_uniform(GPT_INIT_SEED, drawn, rows * cols)
        drawn += rows * cols
        out.append((name, (0.02 * np.sqrt(3.0) * (2 * u - 1)).astype(np.float32)
                    .reshape(rows, cols)))

    def norm(name):
        out.append((name + ".weight", np.ones(D, np.float32)))
        out.append((name + ".bias", np.zeros(D, np.float32)))

    matrix("wte.weight", vocab, D)
    matrix("wpe.weight", GPT_T, D)
    for i in range(GPT_LAYERS):
        h = f"h.{i}."
        norm(h + "ln_1")
        for name, rows, cols in (("attn.c_attn", 3 * D, D), ("attn.c_proj", D, D)):
            matrix(h + name + ".weight", rows, cols)
            out.append((h + name + ".bias", np.zeros(rows, np.float32)))
        norm(h + "ln_2")
        for name, rows, cols in (("mlp.c_fc", 4 * D, D), ("mlp.c_proj", D, 4 * D)):
            matrix(h + name + ".weight", rows, cols)
            out.append((h + name + ".bias", np.zeros(rows, np.float32)))
    norm("ln_f")
    return out


def gpt_starts(n_tokens):
    """[GPT_STEPS, GPT_BATCH] window starts: floor(u * (n_tokens - T - 1)), step by step."""
    u = splitmix_uniform(GPT_BATCH_SEED, 0, GPT_STEPS * GPT_BATCH)
    return (u * (n_tokens - GPT_T - 1)).astype(np.int64).reshape(GPT_STEPS, GPT_BATCH)


def gpt_batches():
    """The GPT_STEPS batches (x, y) as int64 [GPT_BATCH, GPT_T] arrays, and the vocabulary."""
    ids, vocab = gpt_data()
    at = gpt_starts(len(ids))[:, :, None] + np.arange(GPT_T)
    return [(ids[a], ids[a + 1]) for a in at], vocab


def run_gpt(step, batches):
    """Runs step(x, y) -> loss (a Python float, the step finished) on every batch and prints
    step_ms (median of the steady steps), first_step_ms, compile_ms (the first step less a
    steady one), peak_rss_mb and loss_K every
    GPT_LOSS_EVERY steps."""
    times, losses = [], []
    for x, y in batches:
        t0 = time.perf_counter()
        losses.append(step(x, y))
        times.append(time.perf_counter() - t0)
    emit("step_ms", statistics.median(times[1:]) * 1e3)
    emit("first_step_ms", times[0] * 1e3)
    # What the first step costs beyond a steady one: the trace and compile (eager: warm-up).
    emit("compile_ms", (times[0] - statistics.median(times[1:])) * 1e3)
    emit("peak_rss_mb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    for k in range(0, len(losses), GPT_LOSS_EVERY):
        print(f"loss_{k} {losses[k]:.9g}", flush=True)
