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


def different_shardings():
    """The ranks annotate one weight differently: their partitioned graphs differ."""
    mesh = dist.Mesh((2,), ("model",))
    w = loom.tensor(np.ones((4, 4), np.float32))
    dist.mark_sharding(w, mesh, ("model", None) if dist.rank() == 0 else (None, "model"))
    try:
        (loom.ones(3, 4) @ w).sum().item()
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


def close(got, want, what, tol=1e-10):
    g, w_ = np.asarray(got.numpy()), np.asarray(want.numpy())
    if g.shape != w_.shape or not np.allclose(g, w_, rtol=tol, atol=tol):
        raise AssertionError(f"rank {dist.rank()}: {what}: max |diff| "
                             f"{np.max(np.abs(g - w_)) if g.shape == w_.shape else g.shape}")


def tensor_parallel():
    """The sharded layers against the unsharded ones on the same weights, float64: outputs,
    the input's gradient and each shard's gradient (the rows or columns of the full one),
    for a replicated objective sum(out * R); and two sharded blocks through scan_layers."""
    r, w = dist.rank(), dist.world_size()
    f64 = loom.float64
    loom.manual_seed(5)  # the same unsharded layers and data on every rank
    full_col, full_row = nn.Linear(8, 12, dtype=f64), nn.Linear(12, 6, dtype=f64)
    full_attn = nn.CausalSelfAttention(8, 4, dtype=f64)
    x0 = loom.randn(2, 5, 8, dtype=f64)
    r_col, r_row = loom.randn(2, 5, 12, dtype=f64), loom.randn(2, 5, 6, dtype=f64)
    col = dist.ColumnParallelLinear(8, 12, dtype=f64)
    col_local = dist.ColumnParallelLinear(8, 12, gather_output=False, dtype=f64)
    row = dist.RowParallelLinear(12, 6, dtype=f64)
    attn = dist.ShardedCausalSelfAttention(8, 4, dtype=f64)
    col.load(full_col)
    col_local.load(full_col)
    row.load(full_row)
    attn.load(full_attn)
    n, k = 12 // w, 12 // w

    def grads(model_fn, params, rr):
        x = x0.detach().requires_grad_()
        out = model_fn(x)
        (out * rr).sum().backward()
        return out, x.grad, [p.grad for p in params]

    out, gx, (gw, gb) = grads(col, [col.weight, col.bias], r_col)
    out_f, gx_f, (gw_f, gb_f) = grads(full_col, [full_col.weight, full_col.bias], r_col)
    close(out, out_f, "ColumnParallelLinear forward")
    close(gx, gx_f, "ColumnParallelLinear input grad")
    close(gw, gw_f[r * n:(r + 1) * n], "ColumnParallelLinear weight grad")
    close(gb, gb_f[r * n:(r + 1) * n], "ColumnParallelLinear bias grad")

    def pair(x):
        return row(col_local(x))

    def pair_full(x):
        return full_row(full_col(x))

    for m in (col_local, row, full_col, full_row):
        m.zero_grad()
    out, gx, (gw1, gw2, gb2) = grads(pair, [col_local.weight, row.weight, row.bias], r_row)
    out_f, gx_f, (gw1_f, gw2_f, gb2_f) = grads(pair_full, [full_col.weight, full_row.weight,
                                                           full_row.bias], r_row)
    close(out, out_f, "Column -> Row forward")
    close(gx, gx_f, "Column -> Row input grad")
    close(gw1, gw1_f[r * n:(r + 1) * n], "Column -> Row column weight grad")
    close(gw2, gw2_f[:, r * k:(r + 1) * k], "RowParallelLinear weight grad")
    close(gb2, gb2_f, "RowParallelLinear bias grad")

    ra = loom.randn(2, 5, 8, dtype=f64)
    out, gx, (gq, gp) = grads(attn, [attn.qkv.weight, attn.proj.weight], ra)
    out_f, gx_f, (gq_f, gp_f) = grads(full_attn, [full_attn.qkv.weight, full_attn.proj.weight], ra)
    close(out, out_f, "ShardedCausalSelfAttention forward")
    close(gx, gx_f, "ShardedCausalSelfAttention input grad")
    d = 8 // w
    rows = loom.cat([gq_f[j * 8 + r * d:j * 8 + (r + 1) * d] for j in range(3)], 0)
    close(gq, rows, "ShardedCausalSelfAttention qkv weight grad")
    close(gp, gp_f[:, r * d:(r + 1) * d], "ShardedCausalSelfAttention proj weight grad")

    class Block(nn.Module):
        def __init__(self, sharded):
            super().__init__()
            self.attn = dist.ShardedCausalSelfAttention(8, 4, dtype=f64) if sharded else \
                nn.CausalSelfAttention(8, 4, dtype=f64)

        def forward(self, x):
            return x + self.attn(x)

    loom.manual_seed(9)
    full_blocks = nn.ModuleList([Block(False) for _ in range(3)])
    blocks = nn.ModuleList([Block(True) for _ in range(3)])
    for b_, f_ in zip(blocks, full_blocks):
        b_.attn.load(f_.attn)
    x = x0.detach().requires_grad_()
    y = loom.scan_layers(blocks, x)
    (y * ra).sum().backward()
    xf = x0.detach().requires_grad_()
    yf = xf
    for f_ in full_blocks:
        yf = f_(yf)
    (yf * ra).sum().backward()
    close(y, yf, "sharded blocks through scan_layers")
    close(x.grad, xf.grad, "sharded blocks through scan_layers: input grad")
    close(blocks[2].attn.proj.weight.grad, full_blocks[2].attn.proj.weight.grad[:, r * d:(r + 1) * d],
          "sharded blocks through scan_layers: layer 2 proj grad")


class Mlp(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


def sharded_training(annotate, steps=3):
    """3 SGD steps of the Mlp (same seed on every rank), the annotations applied first; returns
    the losses, the model, and the last step's sharding report."""
    loom.manual_seed(7)
    model = Mlp(8).to(loom.float64)
    annotate(model)
    opt = loom.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        rng = np.random.default_rng(step)
        x = loom.tensor(rng.standard_normal((8, 8)))
        y = loom.tensor(rng.standard_normal((8, 8)))
        annotate_batch = getattr(annotate, "batch", None)
        if annotate_batch:
            annotate_batch(x, y)
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model, dist.sharding_report()


def sharding():
    """mark_sharding against the unannotated program on the same weights and batches, float64:
    Megatron-style weights (column then row) and data parallel written as a batch annotation;
    losses, final weights, layouts kept by the optimizer, the inserted collectives."""
    w = dist.world_size()
    mesh = dist.Mesh((w,), ("model",))
    want, ref, _ = sharded_training(lambda m: None)

    def megatron(m):
        dist.mark_sharding(m.fc1.weight, mesh, ("model", None))
        dist.mark_sharding(m.fc1.bias, mesh, ("model",))
        dist.mark_sharding(m.fc2.weight, mesh, (None, "model"))

    got, model, report = sharded_training(megatron)
    np.testing.assert_allclose(got, want, rtol=1e-10, err_msg="megatron losses")
    for name, p in model.state_dict().items():
        close(p, ref.state_dict()[name], f"megatron {name} after 3 steps")
    assert dist.sharding_of(model.fc1.weight) == f"mesh=[{w}] (0, None)", \
        dist.sharding_of(model.fc1.weight)
    assert dist.sharding_of(model.fc2.weight) == f"mesh=[{w}] (None, 0)"
    assert dist.sharding_of(model.fc2.bias) is None
    assert "mesh_all_reduce" in report, report

    data_mesh = dist.Mesh((w,), ("data",))

    def batch(x, y):
        dist.mark_sharding(x, data_mesh, ("data", None))
        dist.mark_sharding(y, data_mesh, ("data", None))

    def dp(m):
        pass
    dp.batch = batch
    got, model, report = sharded_training(dp)
    np.testing.assert_allclose(got, want, rtol=1e-10, err_msg="batch-annotated losses")
    for name, p in model.state_dict().items():
        close(p, ref.state_dict()[name], f"batch-annotated {name} after 3 steps")
        assert dist.sharding_of(p) is None, name  # weights stay replicated

    # Reading a sharded parameter after a forward that autograd may still differentiate.
    loom.manual_seed(3)
    lin = nn.Linear(8, 8)
    want_w = lin.weight.numpy().copy()
    dist.mark_sharding(lin.weight, mesh, ("model", None))
    lin(loom.ones(2, 8)).sum().item()
    np.testing.assert_array_equal(lin.weight.numpy(), want_w)
    assert len(repr(lin.weight)) > 0

    # Pieces in and out: from_local, full, gather_to.
    piece = loom.tensor(np.arange(6.0).reshape(2, 3) + 10 * dist.rank())
    t = dist.from_local(piece, mesh, ("model", None))
    assert t.shape == (2 * w, 3), t.shape
    whole = np.concatenate([np.arange(6.0).reshape(2, 3) + 10 * r for r in range(w)])
    np.testing.assert_array_equal(dist.full(t).numpy(), whole)
    np.testing.assert_array_equal((t * 2).numpy(), whole * 2)
    g = dist.gather_to(t, 0)
    assert (g is None) == (dist.rank() != 0)

    # A dim moving between axes: rows to columns in one all_to_all over Gloo.
    m = dist.from_local(loom.tensor(np.arange(24.0).reshape(2, 12) + 100 * dist.rank()), mesh,
                        ("model", None))
    moved = m * 2
    dist.mark_sharding(moved, mesh, (None, "model"))
    np.testing.assert_array_equal(dist.full(moved).numpy(), np.concatenate(
        [np.arange(24.0).reshape(2, 12) + 100 * r for r in range(w)]) * 2)
    report = dist.sharding_report()
    assert "mesh_all_to_all" in report and "mesh_all_gather" not in report, report

    # Errors: the same on every rank.
    for bad, err in [(lambda: dist.mark_sharding(loom.zeros(4, 6), mesh, ("model",)),
                      loom.ShapeError),
                     (lambda: dist.mark_sharding(loom.zeros(4, 6), mesh, ("data", None)),
                      loom.ShapeError),
                     (lambda: dist.mark_sharding(loom.zeros(3, 6), mesh, ("model", None)),
                      loom.ShapeError),
                     (lambda: dist.mark_sharding(loom.zeros(4, 6), dist.Mesh((w + 1,)),
                                                 (0, None)), loom.DistError)]:
        try:
            bad()
        except err as e:
            assert "mark_sharding" in str(e), e
        else:
            raise AssertionError(f"no {err.__name__}")


def torch_sharding():
    """loom.torch's xs.mark_sharding spelling: a torch MLP's weights annotated Megatron-style,
    torch.optim.SGD for 3 steps, against the same torch model on the CPU."""
    import torch
    import loom.torch as lt
    w = dist.world_size()
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    cpu = cpu.double()
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    model = model.double()
    model.load_state_dict(cpu.state_dict())
    model.to(lt.device())
    mesh = lt.Mesh((w,), ("model",))
    lt.mark_sharding(model[0].weight, mesh, ("model", None))
    lt.mark_sharding(model[2].weight, mesh, (None, "model"))
    assert lt.sharding_of(model[2].weight) == f"mesh=[{w}] (None, 0)", lt.sharding_of(model[2].weight)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (cpu, model)]
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(4, 8, generator=g, dtype=torch.float64)
        y = torch.randn(4, 8, generator=g, dtype=torch.float64)
        losses = []
        for m, opt, dev in ((cpu, opts[0], "cpu"), (model, opts[1], lt.device())):
            loss = ((m(x.to(dev)) - y.to(dev)) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert abs(losses[0] - losses[1]) < 1e-10 * abs(losses[0]), losses
    assert lt.sharding_of(model[0].weight) == f"mesh=[{w}] (0, None)", \
        lt.sharding_of(model[0].weight)
    for a, b in zip(cpu.parameters(), model.parameters()):
        np.testing.assert_allclose(b.detach().cpu().numpy(), a.detach().numpy(), rtol=1e-10)


if __name__ == "__main__":
    mode = sys.argv[1]
    dist.init()
    {"collectives": collectives, "data_parallel": lambda: data_parallel(sys.argv[2]),
     "different_graphs": different_graphs, "skipped_collective": skipped_collective,
     "dead_rank": dead_rank, "tensor_parallel": tensor_parallel, "sharding": sharding,
     "different_shardings": different_shardings, "torch_sharding": torch_sharding}[mode]()
    print("ok")
