"""The seed's decoder (Example 3: Linear -> GELU -> residual layers through scan_layers, then
LayerNorm) trained data-parallel: each rank takes its shard of every batch, the gradients
are averaged over the ranks inside the compiled step (bucketed all_reduce), and every rank
ends with the same weights. Rank 0 prints the loss of the whole batch as it falls.

    PYTHONPATH=build/python .venv/bin/python -m loom.launch -n 2 examples/python/data_parallel.py
"""
import time

import loom
import loom.distributed as dist
import loom.nn as nn
import loom.nn.functional as F
from loom import scan_layers

LAYERS, DIM, BATCH, SEQ, STEPS = 8, 128, 8, 64, 30


class DecoderLayer(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.linear = nn.Linear(dim, dim)
        self.act = nn.GELU()

    def forward(self, x):
        return self.act(self.linear(x)) + x  # residual


class Decoder(nn.Module):
    def __init__(self, dim, num_layers):
        super().__init__()
        self.layers = nn.ModuleList([DecoderLayer(dim) for _ in range(num_layers)])
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        return self.norm(scan_layers(self.layers, x))


def main():
    dist.init()
    rank, world = dist.rank(), dist.world_size()
    loom.manual_seed(0)  # the same data on every rank; the weights come from rank 0
    x = loom.randn(BATCH, SEQ, DIM)
    target = loom.randn(BATCH, SEQ, DIM) * 0.5
    loom.manual_seed(100 + rank)  # different initial weights: DataParallel broadcasts rank 0's
    model = dist.DataParallel(Decoder(DIM, LAYERS))
    opt = loom.optim.AdamW(model.parameters(), lr=3e-3)
    begin, end = dist.shard(BATCH)
    xs, ts = x[begin:end], target[begin:end]

    @loom.compile(trace_once=True, name="dp_step")
    def step(xb, tb):
        loss = F.mse_loss(model(xb), tb)
        loss.backward()
        model.average_gradients()
        opt.step()
        opt.zero_grad()
        return dist.all_reduce(loss.detach(), op="mean")  # the whole batch's loss, on all ranks

    t0 = time.perf_counter()
    for s in range(STEPS):
        loss = step(xs, ts)
        value = loss.item()  # every rank reads it: every rank runs the same graphs
        if rank == 0 and (s % 5 == 0 or s == STEPS - 1):
            print(f"step {s:2d}  loss {value:.4f}")
    seconds = time.perf_counter() - t0
    # every rank holds the same weights
    w = model.module.layers[LAYERS - 1].linear.weight
    spread = (dist.all_reduce(w, op="max") - dist.all_reduce(w, op="min")).abs().max().item()
    compiles = sum(g.compiles for g in loom.graph_metrics() if g.name == "dp_step")
    if rank == 0:
        print(f"{world} ranks x {end - begin} rows, {STEPS} steps in {seconds:.2f} s; the step "
              f"compiled {compiles} time(s); weights differ across ranks by {spread:g}")


if __name__ == "__main__":
    main()
