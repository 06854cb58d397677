#!/usr/bin/env python3
"""PyTorch reference for `loom-bench decoder_forward` and `decoder_train_step` (--train).

The seed decoder (LAYERS x [Linear(512,512) -> GELU -> residual], then LayerNorm(512)) forward
on a [4,512,512] float32 input under torch.no_grad(), with torch's default thread settings:
Debian's torch 1.13 runs its matmuls on OpenBLAS's own thread pool, so set_num_threads(2)
oversubscribes a 2-core machine and runs 2-6x slower; the default is the fair peer.
With --train, one step is the forward, loss = mean of the output, and the backward (gradients
of every weight and bias), as loom-bench decoder_train_step measures it.
Prints `key value` lines; loom-bench reads `median_ms`. Run with /usr/bin/python3.
"""
import argparse
import statistics
import time

import torch


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=50)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--train", action="store_true")
    args = parser.parse_args()

    torch.manual_seed(0)
    dim = 512
    # Weights ~ N(0, 0.02) as in loom-bench; the values do not change the time.
    linears = [torch.nn.Linear(dim, dim) for _ in range(args.layers)]
    with torch.no_grad():
        for lin in linears:
            torch.nn.init.normal_(lin.weight, 0.0, 0.02)
            torch.nn.init.normal_(lin.bias, 0.0, 0.02)
    gelu = torch.nn.GELU()  # exact erf form, as loom's gelu
    norm = torch.nn.LayerNorm(dim)
    x = torch.randn(4, 512, dim)

    def forward(h):
        for lin in linears:
            h = gelu(lin(h)) + h
        return norm(h)

    times = []
    if args.train:
        params = [p for lin in linears for p in lin.parameters()]

        def step():
            for p in params:
                p.grad = None
            forward(x).mean().backward()

        step()  # warm-up
        for _ in range(args.reps):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
    else:
        with torch.no_grad():
            forward(x)  # warm-up: allocator and OpenBLAS thread start
            for _ in range(args.reps):
                t0 = time.perf_counter()
                forward(x)
                times.append(time.perf_counter() - t0)

    print(f"torch_version {torch.__version__}")
    print(f"torch_threads {torch.get_num_threads()}")
    print(f"layers {args.layers}")
    print(f"min_ms {min(times) * 1e3:.3f}")
    print(f"median_ms {statistics.median(times) * 1e3:.3f}")


if __name__ == "__main__":
    main()
