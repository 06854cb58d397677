"""A torch user's reads (issue 37): a loop that reads only `loss.item()` is steady, host memory
shared with numpy keeps torch's values, errors and graph names point at the user's line, and
division, creation and zero-size operands give torch 1.13's values and errors."""
import os
import warnings

import numpy as np
import pytest
import torch

import loom
import loom.nn.functional as F
from loom import nn

from conftest import L2T, assert_same, from_torch

HERE = os.path.basename(__file__)


@pytest.fixture(autouse=True)
def _clean():
    loom.sync()
    loom.reset_metrics()
    yield
    loom.sync()


def _rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _models(seed=0):
    """A two-layer torch MLP and the same model in loom (same weights)."""
    torch.manual_seed(seed)
    tm = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    lm = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    lm.load_state_dict({k: loom.tensor(v.detach().numpy()) for k, v in tm.state_dict().items()})
    return tm, lm


def _batches(n, rng):
    return [(rng.standard_normal((8, 16)).astype(np.float32),
             rng.standard_normal((8, 4)).astype(np.float32)) for _ in range(n)]


# ---- item()-only loops ------------------------------------------------------------------------

def test_item_only_loop_compiles_a_fixed_set_and_matches_torch(rng):
    tm, lm = _models()
    topt = torch.optim.AdamW(tm.parameters(), lr=1e-2)
    lopt = loom.optim.AdamW(lm.parameters(), lr=1e-2)
    compiles, sizes, ours, theirs = [], [], [], []
    for x, y in _batches(100, rng):
        topt.zero_grad()
        loss = torch.nn.functional.mse_loss(tm(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        topt.step()
        theirs.append(loss.item())
        lopt.zero_grad()
        loss = F.mse_loss(lm(loom.tensor(x)), loom.tensor(y))
        loss.backward()
        lopt.step()
        ours.append(loss.item())  # the only read: no sync anywhere
        compiles.append(loom.metrics().compiles)
        sizes.append(loom.pending_graph_size())
    np.testing.assert_allclose(ours, theirs, rtol=2e-5, atol=1e-6)
    assert compiles[3:] == [compiles[3]] * 97, compiles
    assert max(sizes) == 0, sizes  # nothing the next step builds on stays pending
    assert not any(p.is_pending for p in lm.parameters())


def test_item_only_loop_memory_is_flat(rng):
    _, lm = _models()
    opt = loom.optim.SGD(lm.parameters(), lr=1e-2, momentum=0.9)
    x, y = (loom.tensor(a) for a in _batches(1, rng)[0])
    for step in range(500):
        opt.zero_grad()
        loss = F.mse_loss(lm(x), y)
        loss.backward()
        opt.step()
        loss.item()
        if step == 99:
            before = _rss_mb()
    assert _rss_mb() - before < 8, (before, _rss_mb())


def test_item_only_loop_keeps_unrelated_pending_work_pending():
    w = loom.tensor([1.0, 2.0])
    other = loom.tensor([3.0]) * 2  # shares no computed node with the read
    assert (w * 3).sum().item() == 9.0
    assert other.is_pending
    assert other.item() == 6.0


def test_reading_the_loss_then_backward_still_differentiates():
    w = loom.tensor([1.0, -2.0], requires_grad=True)
    loss = (w * w).sum()
    assert loss.item() == 5.0  # computes with loss what its graph reaches, keeps the tape
    loss.backward()
    np.testing.assert_array_equal(w.grad.numpy(), [2.0, -4.0])


def test_saving_after_a_loop_without_reads_is_one_graph(tmp_path, rng):
    _, lm = _models()
    opt = loom.optim.AdamW(lm.parameters(), lr=1e-2)
    for x, y in _batches(3, rng):
        opt.zero_grad()
        F.mse_loss(lm(loom.tensor(x)), loom.tensor(y)).backward()
        opt.step()  # parameters and moments stay pending: nothing read
    assert any(p.is_pending for p in lm.parameters())
    before = loom.metrics().executions
    loom.save({"model": lm.state_dict(), "opt": opt.state_dict()}, str(tmp_path / "ck.st"))
    assert loom.metrics().executions - before == 1
    back = loom.load(str(tmp_path / "ck.st"))
    for k, v in lm.state_dict().items():
        np.testing.assert_array_equal(back["model"][k].numpy(), v.numpy())


def test_a_growing_pending_graph_warns_once_naming_the_read():
    w = loom.tensor([1.0, 2.0])
    acc = loom.zeros(2)
    with pytest.warns(loom.LoomWarning, match="grew by") as seen:
        for step in range(300):
            for _ in range(40):
                acc = acc * 0.5 + 1.0  # never read: the pending graph grows
            (w * step).sum().item()
    assert len([m for m in seen if issubclass(m.category, loom.LoomWarning)]) == 1
    assert HERE in str(seen[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error", loom.LoomWarning)
        (w * 2).sum().item()  # once only
    np.testing.assert_allclose(acc.numpy(), [2.0, 2.0])


def test_a_steady_loop_does_not_warn():
    _, lm = _models()
    opt = loom.optim.SGD(lm.parameters(), lr=1e-2)
    x, y = loom.randn(8, 16), loom.randn(8, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", loom.LoomWarning)
        for _ in range(200):
            opt.zero_grad()
            loss = F.mse_loss(lm(x), y)
            loss.backward()
            opt.step()
            loss.item()


# ---- host memory shared with numpy ------------------------------------------------------------

def test_a_refilled_numpy_buffer_keeps_each_steps_values():
    buf = np.zeros(3, np.float32)
    ours, theirs = [], []
    for i in range(3):
        buf[:] = i
        ours.append(loom.from_numpy(buf).sum())
        theirs.append(torch.from_numpy(buf).sum())
    assert [o.item() for o in ours] == [t.item() for t in theirs] == [0.0, 3.0, 6.0]


def test_from_numpy_stays_shared_for_the_tensor_itself():
    buf = np.arange(4, dtype=np.float32)
    t = loom.from_numpy(buf)
    s = (t * 2).sum()  # pending: sees the values of now
    buf[:] = 10
    assert s.item() == 12.0
    np.testing.assert_array_equal(t.numpy(), [10, 10, 10, 10])  # shared, as torch.from_numpy
    assert t.numpy().ctypes.data == buf.ctypes.data


def test_writing_through_numpy_after_a_pending_use():
    t = loom.tensor([1.0, 2.0, 3.0])
    view = t.numpy()
    doubled = t * 2  # traced before the write: torch computes it now
    view[:] = 0
    np.testing.assert_array_equal(doubled.numpy(), [2, 4, 6])
    np.testing.assert_array_equal(t.numpy(), [0, 0, 0])  # the write is seen, as in torch
    np.testing.assert_array_equal((t + 1).numpy(), [1, 1, 1])


# ---- contiguous -------------------------------------------------------------------------------

def test_transpose_contiguous_view_on_a_pending_tensor():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    got = (loom.tensor(x) * 1).transpose(1, 2).contiguous().view(2, 12)
    assert got.is_pending
    want = torch.from_numpy(x).transpose(1, 2).contiguous().view(2, 12)
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    y = loom.tensor(x, requires_grad=True)
    (y.transpose(1, 2).contiguous().view(2, 12) * loom.arange(12)).sum().backward()
    yt = torch.from_numpy(x).requires_grad_()
    (yt.transpose(1, 2).contiguous().view(2, 12) * torch.arange(12)).sum().backward()
    np.testing.assert_array_equal(y.grad.numpy(), yt.grad.numpy())


# ---- errors and graph names point at the user's line ------------------------------------------

def test_a_run_time_index_error_names_this_line():
    emb = nn.Embedding(10, 4)
    with pytest.raises(loom.ExecError) as e:
        emb(loom.tensor([1, 12])).tolist()
    assert f"{HERE}:" in str(e.value), str(e.value)
    assert "ops.cpp" not in str(e.value)


def test_graph_names_of_item_and_numpy_are_the_python_line():
    w = loom.tensor([1.0, 2.0])
    (w * 3).sum().item()
    (w + 1).numpy()
    names = [g.name for g in loom.graph_metrics()]
    assert len(names) == 2 and all(n.startswith(f"{HERE}:") for n in names), names


# ---- division as torch computes it ------------------------------------------------------------

FLOATS = [loom.float32, loom.float64, loom.float16, loom.bfloat16]
INTS = [loom.int32, loom.int64]
SPECIAL = [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1.0, -1.0, 2.5, -3.0, 0.634,
           -110.75, -1.4384766, 4.4375, -0.21191406, 7.7, 0.1, 1e30, -1e-30]


def _torch_division(op, a, b, dt):
    """torch 1.13's result at dtype dt: half types computed in float32 (torch's opmath) from the
    same rounded inputs, then rounded (1.13 lacks some half CPU kernels)."""
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    want = L2T[dt]
    if want in (torch.float16, torch.bfloat16):
        ta, tb = ta.to(want).float(), tb.to(want).float()
        return getattr(torch, op)(ta, tb).to(want)
    return getattr(torch, op)(ta.to(want), tb.to(want))


@pytest.mark.parametrize("op", ["floor_divide", "remainder", "fmod"])
@pytest.mark.parametrize("dt", FLOATS, ids=str)
def test_float_division_matches_torch_on_every_pair_of_special_values(op, dt):
    a = np.repeat(np.array(SPECIAL, np.float64), len(SPECIAL))
    b = np.tile(np.array(SPECIAL, np.float64), len(SPECIAL))
    # element by element: torch's vectorized float32 fmod gives nan for fmod(1e30, -1e-30),
    # its scalar kernel (and C) the exact 8.17e-31
    want = torch.cat([_torch_division(op, a[i:i + 1], b[i:i + 1], dt) for i in range(len(a))])
    la = from_torch(torch.from_numpy(a).to(L2T[dt]))
    lb = from_torch(torch.from_numpy(b).to(L2T[dt]))
    got = getattr(loom, op)(la, lb)
    assert_same(got, want, tol=0)
    if op != "fmod":  # the operators
        assert_same(la // lb if op == "floor_divide" else la % lb, want, tol=0)


@pytest.mark.parametrize("dt", FLOATS, ids=str)
def test_float_division_matches_torch_on_random_values(dt, rng):
    a = (rng.standard_normal(4000) * 10.0 ** rng.integers(-3, 6, 4000)).astype(np.float64)
    b = (rng.standard_normal(4000) * 10.0 ** rng.integers(-3, 3, 4000)).astype(np.float64)
    la = from_torch(torch.from_numpy(a).to(L2T[dt]))
    lb = from_torch(torch.from_numpy(b).to(L2T[dt]))
    for op in ("floor_divide", "remainder", "fmod"):
        assert_same(getattr(loom, op)(la, lb), _torch_division(op, a, b, dt), tol=0)


def test_the_trials_reproducers():
    h, bf = loom.float16, loom.bfloat16
    assert (loom.tensor([-110.75], dtype=h) // loom.tensor([-1.4384766], dtype=h)).item() == 76.0
    r = loom.remainder(loom.tensor(-109.5, dtype=bf), loom.tensor(-2.078125, dtype=bf))
    assert r.item() == pytest.approx(-1.4375, abs=1e-2)
    inf = float("inf")
    assert np.isnan((loom.tensor([inf]) // loom.tensor([0.634])).item())
    assert (loom.tensor([0.2246]) // loom.tensor([-inf])).item() == -1.0
    assert loom.remainder(loom.tensor([0.2246]), loom.tensor([-inf])).item() == -inf


@pytest.mark.parametrize("dt", INTS, ids=str)
def test_integer_division_matches_torch(dt, rng):
    info = np.iinfo(np.int32 if dt == loom.int32 else np.int64)
    a = np.concatenate([rng.integers(-50, 50, 500), rng.integers(info.min, info.max, 500),
                        [info.min, info.max, -7, 7, 0]])
    b = np.concatenate([rng.integers(1, 9, 500) * rng.choice([-1, 1], 500),
                        rng.integers(info.min, info.max, 500), [3, -3, 2, -2, 5]])
    b[b == 0] = 1
    la, lb = loom.tensor(a).to(dt), loom.tensor(b).to(dt)
    ta, tb = torch.from_numpy(a).to(L2T[dt]), torch.from_numpy(b).to(L2T[dt])
    for op in ("floor_divide", "remainder", "fmod"):
        assert_same(getattr(loom, op)(la, lb), getattr(torch, op)(ta, tb))
    assert_same(la // 3, ta // 3)
    assert_same(la % -3, ta % -3)


@pytest.mark.parametrize("op", ["floor_divide", "remainder", "fmod"])
def test_integer_division_by_zero(op):
    a = loom.tensor([7, -7])
    # torch raises ZeroDivisionError; loom raises when the zero is known as the op is traced
    with pytest.raises(RuntimeError):
        getattr(torch, op)(torch.tensor([7, -7]), torch.tensor(0))
    with pytest.raises(loom.Error, match="division by zero"):
        getattr(loom, op)(a, loom.tensor(0))
    with pytest.raises(loom.Error, match="division by zero"):
        getattr(loom, op)(a, 0)
    # a zero known only when the graph runs gives 0, as numpy (docs/ir.md)
    zeros = loom.tensor([0, 0]) * 1
    np.testing.assert_array_equal(getattr(loom, op)(a, zeros).numpy(), [0, 0])


# ---- creation -----------------------------------------------------------------------------

@pytest.mark.parametrize("value,dt", [(1e40, loom.int64), (3e9, loom.int32), (2**63, loom.int64),
                                      (float("nan"), loom.int32), (1e40, loom.float32),
                                      (7e4, loom.float16), (1e39, loom.bfloat16)], ids=str)
def test_full_out_of_range_raises_as_torch(value, dt):
    with pytest.raises(RuntimeError):
        torch.full((2,), value, dtype=L2T[dt])
    with pytest.raises(loom.DTypeError, match="overflow"):
        loom.full((2,), value, dtype=dt)


@pytest.mark.parametrize("value,dt", [(2**31 - 1, loom.int32), (-2**63, loom.int64),
                                      (float("inf"), loom.float16), (65504.0, loom.float16),
                                      (-1e38, loom.float32), (True, loom.int32)], ids=str)
def test_full_in_range_matches_torch(value, dt):
    assert_same(loom.full((2,), value, dtype=dt), torch.full((2,), value, dtype=L2T[dt]))


@pytest.mark.parametrize("args", [(5, 0), (0.5, -2, 1), (0, 5, -1), (0, 5, 0), (1, 2, 0.0)],
                         ids=str)
def test_arange_with_inconsistent_bounds_raises_as_torch(args):
    with pytest.raises(RuntimeError):
        torch.arange(*args)
    with pytest.raises(loom.ShapeError):
        loom.arange(*args)


@pytest.mark.parametrize("args", [(5,), (2, 2), (5, 0, -2), (0.5, -2, -0.75), (1, 10, 3)], ids=str)
def test_arange_matches_torch(args):
    assert_same(loom.arange(*args), torch.arange(*args))


def test_factories_take_a_cpu_device():
    for f in (loom.zeros, loom.ones, loom.randn, loom.rand):
        assert f(2, 3, device="cpu").shape == (2, 3)
    assert loom.full((2,), 1.5, device=loom.device("cpu")).tolist() == [1.5, 1.5]
    assert loom.arange(3, device="cpu").tolist() == [0, 1, 2]
    assert loom.tensor([1, 2], device="cpu:0").tolist() == [1, 2]
    t = loom.ones(2)
    for f in (loom.zeros_like, loom.ones_like, loom.randn_like, loom.rand_like):
        assert f(t, device="cpu").shape == (2,)
    with pytest.raises(loom.Error, match="only device is 'cpu'"):
        loom.zeros(2, device="cuda")


# ---- zero-size operands -----------------------------------------------------------------------

MATMUL_SHAPES = [((0, 2, 0), (0, 0, 1)), ((0, 2, 0), (0, 1)), ((3, 0), (0, 4)), ((0, 3), (3, 4)),
                 ((3, 4), (4, 0)), ((2, 0, 3), (3, 5)), ((0,), (0,)), ((0,), (0, 3)),
                 ((2, 1, 0, 3), (4, 3, 2)), ((5, 0), (0,))]


@pytest.mark.parametrize("dt", [loom.float32, loom.float64, loom.float16, loom.bfloat16,
                                loom.int32, loom.int64], ids=str)
@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=str)
def test_zero_size_matmul_matches_torch(shapes, dt):
    sa, sb = shapes
    a, b = loom.zeros(*sa, dtype=dt) + 1, loom.zeros(*sb, dtype=dt) + 1
    want = torch.matmul(torch.ones(*sa, dtype=torch.float64), torch.ones(*sb, dtype=torch.float64))
    got = a @ b
    assert tuple(got.shape) == tuple(want.shape)
    np.testing.assert_array_equal(got.to(loom.float64).numpy(), want.numpy())


@pytest.mark.parametrize("dt", [loom.float32, loom.float64, loom.float16, loom.bfloat16,
                                loom.int32, loom.int64, loom.bool_], ids=str)
def test_zero_size_operands_of_every_kind(dt):
    e = loom.zeros(0, 3, dtype=dt)
    te = torch.zeros(0, 3, dtype=L2T[dt])
    cases = [lambda x: x.sum(0), lambda x: x.sum(1), lambda x: x.sum(),
             lambda x: x.transpose(0, 1), lambda x: x.reshape(3, 0), lambda x: x[:, 1:],
             lambda x: x.unsqueeze(0), lambda x: x.max(1).values if dt != loom.bool_ else x]
    if dt != loom.bool_:
        cases += [lambda x: x * 2, lambda x: x - x, lambda x: x.abs()]
    for f in cases:
        assert_same(f(e), f(te))
    assert_same(loom.cat([e, e], 0), torch.cat([te, te], 0))
    assert_same(loom.where(loom.zeros(0, 3, dtype=loom.bool_), e, e),
                torch.where(torch.zeros(0, 3, dtype=torch.bool), te, te))
    if dt in FLOATS:
        assert_same(e.mean(0), te.float().mean(0).to(L2T[dt]))
        assert_same(loom.softmax(e, 1), torch.softmax(te.float(), 1).to(L2T[dt]))
