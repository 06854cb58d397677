"""One rank of the loom.distributed tests (python/tests/test_distributed.py), started by
`python -m loom.launch -n N dist_worker.py MODE [OUT]`. Prints "ok" when its checks pass."""
import os
import sys

import numpy as np

import loom
import loom.distributed as dist
import loom.nn as nn
import loom.nn.functional as F

DTYPES = [loom.float32, loom.float64, loom.int32, loom.int64, loom.bfloat16]


def value(r, n, dtype):
    """Rank r's data: r + 1 + i * (r + 2) % 7, exact in every dtype of DTYPES."""
    i = np.arange(n)
    return loom.tensor((r + 1 + (i * (r + 2)) % 7).astype(np.float64)).to(dtype)


def expect(got, want, what):
    tol = 1e-2 if got.dtype == loom.bfloat16 else 1e-6  # bf16 rounds a mean of 3 ranks
    got = np.asarray(got.float().numpy() if got.dtype == loom.bfloat16 else got.numpy(),
                     dtype=np.float64)
    if got.shape != want.shape or not np.allclose(got, want, rtol=tol, atol=tol):
        raise AssertionError(f"rank {dist.rank()}: {what}: got {got[:8]}..., want {want[:8]}...")


def collectives():
    r, w = dist.rank(), dist.world_size()
    for n in (1, 7, 300_000):  # 300k floats cross Gloo's segments
        per = [(k + 1 + (np.arange(n) * (k + 2)) % 7).astype(np.float64) for k in range(w)]
        for dt in DTYPES:
            if dt == loom.bfloat16 and n > 7:
                continue  # bf16 holds these sums exactly only for small values
            x = value(r, n, dt)
            expect(dist.all_reduce(x), sum(per), f"all_reduce sum {dt} n={n}")
            expect(dist.all_reduce(x, op="max"), np.max(per, 0), f"all_reduce max {dt}")
            expect(dist.all_reduce(x, op="min"), np.min(per, 0), f"all_reduce min {dt}")
            if dt.is_floating_point:
                expect(dist.all_reduce(x, op="mean"), sum(per) / w, f"all_reduce mean {dt}")
            expect(dist.all_gather(x), np.concatenate(per), f"all_gather {dt} n={n}")
            big = loom.cat([value(r, n, dt)] * w)
            expect(dist.reduce_scatter(big), sum(per), f"reduce_scatter {dt} n={n}")
            expect(dist.broadcast(x, root=w - 1), per[w - 1], f"broadcast {dt} n={n}")
    # 2-d all_gather along dim 1
    x = loom.full((2, 3), float(r))
    expect(dist.all_gather(x, dim=1), np.concatenate([np.full((2, 3), k) for k in range(w)], 1),
           "all_gather dim=1")
    # gradients: the objective is the sum of the ranks' objectives. Every rank has
    # y = sum_k (k + 1) a = S a and J_r = sum(y^2), so dJ/da_r = 2 W S (r + 1) a.
    a = loom.tensor([1.0, 2.0], dtype=loom.float64, requires_grad=True)
    y = dist.all_reduce(a * float(r + 1))
    (y * y).sum().backward()
    s = sum(k + 1 for k in range(w))
    expect(a.grad, 2 * w * s * (r + 1) * np.array([1.0, 2.0]), "grad of all_reduce")
    # inside a compiled trace_once step
    @loom.compile(trace_once=True)
    def step(x):
        return dist.all_reduce(x * 2.0, op="sum")
    for k in range(3):
        expect(step(loom.full((4,), float(r + k))), np.full(4, 2.0 * sum(q + k for q in range(w))),
               f"compiled step {k}")
    assert loom.metrics().compiles >= 1
    dist.barrier()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 16)
        self.b = nn.Linear(16, 3)

    def forward(self, x):
        return self.b(F.gelu(self.a(x)))


def data(n):
    rng = np.random.default_rng(7)
    return (rng.standard_normal((n, 6)).astype(np.float32),
            rng.standard_normal((n, 3)).astype(np.float32))


def train(model, x, y, step_fn_wrap):
    opt = loom.optim.SGD(model.parameters(), lr=0.1)

    @loom.compile(trace_once=True)
    def step(xb, yb):
        loss = F.mse_loss(model(xb), yb)
        loss.backward()
        step_fn_wrap()
        opt.step()
        opt.zero_grad()
        return loss

    for _ in range(20):
        loss = step(x, y)
    loom.sync()
    return float(loss)


def data_parallel(out):
    loom.manual_seed(1234 + dist.rank())  # different initial weights: DataParallel broadcasts
    model = Net()
    dp = dist.DataParallel(model, bucket_mib=0.0005)  # several buckets for these 6x16+16x3
    xs, ys = data(16)
    b, e = dist.shard(16)
    train(dp, loom.tensor(xs[b:e]), loom.tensor(ys[b:e]), dp.average_gradients)
    if dist.rank() == 0:
        np.savez(out, **{k: v.numpy() for k, v in model.state_dict().items()})
    assert loom.metrics().compiles <= 3, loom.metrics().compiles


def different_graphs():
    n = 4 if dist.rank() == 0 else 5  # rank 1 traces another shape
    try:
        dist.all_reduce(loom.ones(n)).numpy()
    except loom.DistError as e:
        print("DistError:", str(e).replace("\n", " | "))
        sys.exit(3)
    raise AssertionError("no DistError")


def skipped_collective():
    x = dist.all_reduce(loom.ones(4))
    try:
        if dist.rank() == 0:
            x.numpy()  # rank 0 evaluates the collective, rank 1 runs another graph
        else:
            (loom.ones(3) * 2).numpy()
            dist.barrier()
    except loom.DistError as e:
        print("DistError:", str(e).replace("\n", " | "))
        sys.exit(3)
    raise AssertionError("no DistError")


def dead_rank():
    if dist.rank() == 1:
        os._exit(9)  # dies before the collective
    try:
        dist.all_reduce(loom.ones(4)).numpy()
    except loom.DistError as e:
        print("DistError:", str(e).replace("\n", " | "))
        sys.exit(3)
    raise AssertionError("no DistError")


if __name__ == "__main__":
    mode = sys.argv[1]
    dist.init()
    {"collectives": collectives, "data_parallel": lambda: data_parallel(sys.argv[2]),
     "different_graphs": different_graphs, "skipped_collective": skipped_collective,
     "dead_rank": dead_rank}[mode]()
    print("ok")
