"""Tracing cost per op from Python against PyTorch eager, measured in the same run.

    PYTHONPATH=build/python .venv/bin/python bench/python/trace_overhead.py

loom: `x = x * 1.0001 + y` on 16-element tensors, 100,000 ops (50,000 iterations of two ops),
no sync (the pending graph compacts itself). torch: `a + b` on 16-element tensors, eagerly.
Prints "key value" lines (median of three runs)."""
import statistics
import time

import torch

import loom

OPS = 100_000


def loom_per_op():
    x, y = loom.ones(16), loom.ones(16)
    t0 = time.perf_counter()
    for _ in range(OPS // 2):
        x = x * 1.0001 + y
    dt = time.perf_counter() - t0
    del x
    loom.sync()
    return dt / OPS


def torch_per_op():
    a, b = torch.ones(16), torch.ones(16)
    t0 = time.perf_counter()
    for _ in range(OPS):
        c = a + b
    dt = time.perf_counter() - t0
    del c
    return dt / OPS


def main():
    loom_us = statistics.median(loom_per_op() for _ in range(3)) * 1e6
    torch_us = statistics.median(torch_per_op() for _ in range(3)) * 1e6
    print(f"loom_trace_us_per_op {loom_us:.3f}")
    print(f"torch_eager_add_us_per_op {torch_us:.3f}")
    print(f"ratio_loom_over_torch {loom_us / torch_us:.3f}")


if __name__ == "__main__":
    main()
