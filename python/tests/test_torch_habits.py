"""torch users' tensor habits (issue 37) against torch 1.13: numpy operands, None indexing,
0-d iteration, the in-place leaf rule, gelu's tanh form, nanoGPT's ops, grad modes, devices
and .data, grad clipping, lr schedulers, checkpoints and pickling, DLPack bools, errors."""
import copy
import math
import operator
import pickle

import numpy as np
import pytest
import torch

import loom
import loom.nn as nn
import loom.nn.functional as F

TD = {loom.float32: torch.float32, loom.float64: torch.float64, loom.int64: torch.int64,
      loom.int32: torch.int32, loom.bool_: torch.bool, loom.float16: torch.float16}


def tt(t):
    """A loom tensor's value as a torch tensor (via numpy)."""
    return torch.from_numpy(np.array(t.numpy(), copy=True))


def same(lt, ref, rtol=1e-6, atol=1e-6):
    assert isinstance(lt, loom.Tensor), type(lt)
    assert tuple(lt.shape) == tuple(ref.shape), (lt.shape, ref.shape)
    assert TD[lt.dtype] == ref.dtype, (lt.dtype, ref.dtype)
    np.testing.assert_allclose(lt.numpy().astype(np.float64),
                               ref.detach().numpy().astype(np.float64), rtol=rtol, atol=atol)


# ---- 1: numpy operands -------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["add", "sub", "mul", "truediv", "pow", "lt", "le", "gt", "ge",
                                "eq", "ne", "matmul", "floordiv", "mod"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_ndarray_operands_give_tensors(op, side, rng=np.random.default_rng(0)):
    # The array counts as the tensor torch.from_numpy would make of it. (torch 1.13 itself
    # gets there for `t + float_array` only: it raises for `array + t`, `t < array` and most
    # reflected forms, and mixes in numpy's promotion for integer arrays.)
    fn = getattr(operator, op)
    a = rng.uniform(0.5, 2.0, (3, 3)).astype(np.float32)
    for arr in (rng.uniform(0.5, 2.0, (3, 3)).astype(np.float32), rng.uniform(0.5, 2.0, (3, 3)),
                rng.integers(1, 4, (3, 3)), rng.integers(1, 4, (3, 3)).astype(np.int32)):
        lt, ref, rarr = loom.tensor(a), torch.tensor(a), torch.from_numpy(arr)
        args, targs = ((lt, arr), (ref, rarr)) if side == "left" else ((arr, lt), (rarr, ref))
        try:
            want = fn(*targs)
        except RuntimeError:  # matmul of mixed dtypes
            with pytest.raises(loom.DTypeError):
                fn(*args)
            continue
        same(fn(*args), want, rtol=1e-5)
    if op == "add":  # where torch 1.13 takes the array itself, the same result
        f64 = rng.uniform(size=(3, 3))
        same(loom.tensor(a) + f64, torch.tensor(a) + f64)


def test_ndarray_operands_keep_autograd():
    w = loom.tensor([1.0, 2.0, 3.0], requires_grad=True)
    wt = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    c = np.array([0.5, -1.0, 2.0], np.float32)
    for x, cc in ((w, c), (wt, torch.from_numpy(c))):
        y = ((x + cc) * (cc * x) + cc @ x + (cc - x) ** 2).sum()
        y.backward()
    same(w.grad, wt.grad)
    assert np.asarray(w).tolist() == [1.0, 2.0, 3.0]  # np.asarray still gives an ndarray
    assert isinstance(np.asarray(w), np.ndarray)


def test_ndarray_in_place_on_the_array_stays_numpy():
    a = np.ones(3, np.float32)
    a += loom.tensor([1.0, 2.0, 3.0])
    assert isinstance(a, np.ndarray) and a.tolist() == [2.0, 3.0, 4.0]


# ---- 2: indexing -------------------------------------------------------------------------------

@pytest.mark.parametrize("key", [None, (None, slice(1, None)), (Ellipsis, None),
                                 (None, 1), (slice(None), None, 0), (None, Ellipsis, None)])
def test_none_indexing(key):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    same(loom.tensor(a)[key], torch.tensor(a)[key])


@pytest.mark.parametrize("shape,key", [((4, 4), (1, 4)), ((4, 4), (None, 1, 4)),
                                       ((4, 4), (Ellipsis, 4)), ((4, 4), (None, 4)),
                                       ((4, 4), (1, None, 4)), ((2, 3, 4), (1, Ellipsis, 7)),
                                       ((2, 3, 4), (0, 3)), ((4, 4), (slice(None), -5))])
def test_index_error_names_torchs_dimension(shape, key):
    with pytest.raises(IndexError) as want:
        torch.zeros(*shape)[key]
    with pytest.raises(IndexError) as got:
        loom.zeros(*shape)[key]
    assert str(got.value) == str(want.value)


# ---- 3: iteration ------------------------------------------------------------------------------

def test_iterating_a_0d_tensor_raises_torchs_type_error():
    with pytest.raises(TypeError) as want:
        iter(torch.tensor(1.0))
    with pytest.raises(TypeError) as got:
        iter(loom.tensor(1.0))
    assert str(got.value) == str(want.value) == "iteration over a 0-d tensor"
    rows = list(loom.tensor([[1, 2], [3, 4]]))
    assert [r.tolist() for r in rows] == [[1, 2], [3, 4]]


# ---- 4: the in-place leaf rule -----------------------------------------------------------------

@pytest.mark.parametrize("op", ["zero_", "fill_"])
def test_zero_and_fill_on_a_leaf_that_requires_grad(op):
    args = () if op == "zero_" else (2.5,)
    wt = torch.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError):
        getattr(wt, op)(*args)
    w = loom.ones(3, requires_grad=True)
    with pytest.raises(loom.AutodiffError, match=op):
        getattr(w, op)(*args)
    assert w.tolist() == [1.0, 1.0, 1.0]
    with loom.no_grad(), torch.no_grad():
        assert getattr(w, op)(*args) is w
        getattr(wt, op)(*args)
    same(w, wt)
    assert w.requires_grad
    # a non-leaf may be filled, as in torch
    y, yt = w * 2, wt * 2
    getattr(y, op)(*args)
    getattr(yt, op)(*args)
    same(y, yt)
    # fill_ with a 0-d tensor, and its dtype rules
    x = loom.zeros(2, dtype=loom.int64)
    x.fill_(loom.tensor(3.7))
    xt = torch.zeros(2, dtype=torch.int64)
    xt.fill_(torch.tensor(3.7))
    same(x, xt)


# ---- 5: gelu's tanh form -----------------------------------------------------------------------

@pytest.mark.parametrize("dt", [loom.float32, loom.float64])
def test_gelu_tanh_matches_torch_with_gradient(dt, rng=np.random.default_rng(1)):
    a = rng.normal(0, 3, (5, 7)).astype(np.float32 if dt == loom.float32 else np.float64)
    tol = 1e-6 if dt == loom.float32 else 1e-12
    for fn, tfn in ((lambda x: loom.gelu(x, approximate="tanh"),
                     lambda x: torch.nn.functional.gelu(x, approximate="tanh")),
                    (lambda x: F.gelu(x, approximate="tanh"),
                     lambda x: torch.nn.functional.gelu(x, approximate="tanh")),
                    (nn.GELU(approximate="tanh"), torch.nn.GELU(approximate="tanh")),
                    (lambda x: x.gelu(), torch.nn.functional.gelu)):
        x = loom.tensor(a, requires_grad=True)
        xt = torch.tensor(a, requires_grad=True)
        y, yt = fn(x), tfn(xt)
        same(y, yt, rtol=tol, atol=tol)
        (y * y).sum().backward()
        (yt * yt).sum().backward()
        same(x.grad, xt.grad, rtol=10 * tol, atol=10 * tol)
    with pytest.raises(ValueError):
        loom.gelu(loom.ones(2), approximate="fast")


# ---- 6: nanoGPT's ops --------------------------------------------------------------------------

@pytest.mark.parametrize("fn", ["tril", "triu"])
@pytest.mark.parametrize("diagonal", [0, 1, -1, 5, -5])
def test_tril_triu(fn, diagonal, rng=np.random.default_rng(2)):
    a = rng.normal(size=(2, 4, 5)).astype(np.float32)
    same(getattr(loom, fn)(loom.tensor(a), diagonal=diagonal),
         getattr(torch, fn)(torch.tensor(a), diagonal=diagonal))
    same(getattr(loom.tensor(a), fn)(diagonal), getattr(torch.tensor(a), fn)(diagonal))
    same(getattr(loom, fn)(loom.ones(3, 3, dtype=loom.int64)),
         getattr(torch, fn)(torch.ones(3, 3, dtype=torch.int64)))
    with pytest.raises(loom.ShapeError):
        getattr(loom, fn)(loom.ones(3))


def test_masked_fill_as_nanogpt_uses_it(rng=np.random.default_rng(3)):
    T = 5
    a = rng.normal(size=(2, 3, T, T)).astype(np.float32)
    bias, bias_t = loom.tril(loom.ones(T, T)).view(1, 1, T, T), \
        torch.tril(torch.ones(T, T)).view(1, 1, T, T)
    x, xt = loom.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    att = x.masked_fill(bias[:, :, :T, :T] == 0, float("-inf"))
    att_t = xt.masked_fill(bias_t[:, :, :T, :T] == 0, float("-inf"))
    same(att, att_t)
    p, pt = loom.softmax(att, -1), torch.softmax(att_t, -1)
    same(p, pt)
    (p * p).sum().backward()
    (pt * pt).sum().backward()
    same(x.grad, xt.grad, atol=1e-6)
    # function form, a 0-d tensor value, int tensors, and the in-place form
    m = rng.uniform(size=(4,)) > 0.5
    same(loom.masked_fill(loom.arange(4), loom.tensor(m), 7),
         torch.masked_fill(torch.arange(4), torch.tensor(m), 7))
    same(loom.arange(4.0).masked_fill(loom.tensor(m), loom.tensor(-1.0)),
         torch.arange(4.0).masked_fill(torch.tensor(m), torch.tensor(-1.0)))
    y, yt = loom.zeros(2, 4), torch.zeros(2, 4)
    assert y.masked_fill_(loom.tensor(m), 2.0) is y
    yt.masked_fill_(torch.tensor(m), 2.0)
    same(y, yt)
    with pytest.raises(loom.DTypeError, match="boolean"):
        loom.zeros(4).masked_fill(loom.ones(4), 1.0)
    with pytest.raises(loom.AutodiffError):
        loom.zeros(4, requires_grad=True).masked_fill_(loom.tensor(m), 1.0)


@pytest.mark.parametrize("args", [(2, 0), (3, 1), ([1, 3, 1], 1), (5, 1), ((2, 2), 0), (1, -1)])
def test_split(args, rng=np.random.default_rng(4)):
    a = rng.normal(size=(4, 5)).astype(np.float32)
    got, want = loom.split(loom.tensor(a), *args), torch.split(torch.tensor(a), *args)
    assert isinstance(got, tuple) and len(got) == len(want)
    for g, w in zip(got, want):
        same(g, w)
    got = loom.tensor(a).split(args[0], dim=args[1])
    assert len(got) == len(want)
    with pytest.raises(loom.ShapeError, match="sum exactly to 5"):
        loom.tensor(a).split([2, 2], 1)


@pytest.mark.parametrize("chunks,dim", [(1, 0), (2, 0), (3, 0), (3, 1), (6, 1), (4, -1)])
def test_chunk(chunks, dim, rng=np.random.default_rng(5)):
    a = rng.normal(size=(4, 5)).astype(np.float32)
    got, want = loom.chunk(loom.tensor(a), chunks, dim), torch.chunk(torch.tensor(a), chunks, dim)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        same(g, w)
    assert len(loom.tensor(a).chunk(chunks, dim)) == len(want)
    with pytest.raises(loom.ShapeError):
        loom.tensor(a).chunk(0)


def test_split_keeps_autograd_nanogpt_qkv(rng=np.random.default_rng(6)):
    a = rng.normal(size=(2, 3, 12)).astype(np.float32)
    x, xt = loom.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    q, k, v = x.split(4, dim=2)
    qt, kt, vt = xt.split(4, dim=2)
    ((q * k).sum() + (v ** 2).sum()).backward()
    ((qt * kt).sum() + (vt ** 2).sum()).backward()
    same(x.grad, xt.grad)


@pytest.mark.parametrize("n", [1, 7, 128, 129, 1000, 5000])
def test_cumsum_float32_precision(n, rng=np.random.default_rng(7)):
    a = rng.normal(size=(3, n)).astype(np.float32)
    exact = np.cumsum(a.astype(np.float64), axis=1)
    got = loom.cumsum(loom.tensor(a), dim=1).numpy()
    want = torch.cumsum(torch.tensor(a), dim=1).numpy()
    assert got.dtype == np.float32
    scale = np.cumsum(np.abs(a.astype(np.float64)), axis=1) + 1.0
    # loom's error against the exact sums is within a few times torch's own (sequential) error
    err_loom = np.max(np.abs(got - exact) / scale)
    err_torch = np.max(np.abs(want - exact) / scale)
    assert err_loom <= max(4 * err_torch, 4 * np.finfo(np.float32).eps), (err_loom, err_torch)


def test_cumsum_dims_dtypes_and_gradient(rng=np.random.default_rng(8)):
    a = rng.normal(size=(4, 3, 5)).astype(np.float64)
    for dim in (0, 1, 2, -1):
        x, xt = loom.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
        y, yt = x.cumsum(dim), xt.cumsum(dim)
        same(y, yt, rtol=1e-12, atol=1e-12)
        (y * y).sum().backward()
        (yt * yt).sum().backward()
        same(x.grad, xt.grad, rtol=1e-12, atol=1e-12)
    ints = rng.integers(-5, 5, (3, 200))
    same(loom.cumsum(loom.tensor(ints), 1), torch.cumsum(torch.tensor(ints), 1), 0, 0)
    same(loom.cumsum(loom.tensor(ints.astype(np.int32)), 0),
         torch.cumsum(torch.tensor(ints.astype(np.int32)), 0), 0, 0)
    b = rng.uniform(size=(6,)) > 0.5
    same(loom.cumsum(loom.tensor(b), 0), torch.cumsum(torch.tensor(b), 0), 0, 0)
    same(loom.cumsum(loom.tensor(ints), 1, dtype=loom.float32),
         torch.cumsum(torch.tensor(ints), 1, dtype=torch.float32))
    same(loom.tensor(2.5).cumsum(0), torch.tensor(2.5).cumsum(0))


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("k,dim", [(1, -1), (3, -1), (5, 1), (2, 0), (0, -1)])
def test_topk_distinct_values(largest, k, dim, rng=np.random.default_rng(9)):
    a = rng.permutation(40).reshape(4, 10).astype(np.float32) / 7
    v, i = loom.topk(loom.tensor(a), k, dim=dim, largest=largest)
    vt, it = torch.topk(torch.tensor(a), k, dim=dim, largest=largest)
    same(v, vt)
    same(i, it, 0, 0)
    r = loom.tensor(a).topk(k, dim, largest)
    same(r.values, vt)
    same(r.indices, it, 0, 0)


def test_topk_ties_nan_ints_and_gradient():
    # ties: the same values, and the tied indices as a set (torch leaves their order open)
    x = [1.0, 3.0, 3.0, 2.0, 3.0, 1.0]
    v, i = loom.topk(loom.tensor(x), 3)
    vt, it = torch.topk(torch.tensor(x), 3)
    same(v, vt)
    assert sorted(i.tolist()) == sorted(it.tolist()) and i.dtype == loom.int64
    v, i = loom.topk(loom.tensor(x), 4, largest=False)
    vt, it = torch.topk(torch.tensor(x), 4, largest=False)
    same(v, vt)
    assert [x[j] for j in i.tolist()] == v.tolist() and len(set(i.tolist())) == 4
    assert sorted(i.tolist()[:3]) == sorted(it.tolist()[:3])
    # nan is the largest, -inf the smallest, as torch
    y = [[1.0, float("nan"), 3.0, 4.0, float("-inf")]]
    for largest in (True, False):
        v, i = loom.topk(loom.tensor(y), 5, largest=largest)
        vt, it = torch.topk(torch.tensor(y), 5, largest=largest)
        np.testing.assert_array_equal(v.numpy(), vt.numpy())
        assert i.tolist() == it.tolist()
    # integers with the dtype's extremes
    z = [[5, -2**63, 7, 2**63 - 1, 0]]
    for largest in (True, False):
        v, i = loom.topk(loom.tensor(z), 4, largest=largest)
        vt, it = torch.topk(torch.tensor(z), 4, largest=largest)
        same(v, vt, 0, 0)
        same(i, it, 0, 0)
    # the gradient flows to the picked entries
    a = np.array([[0.3, -1.0, 2.0, 0.7]], np.float32)
    x, xt = loom.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    (loom.topk(x, 2).values * loom.tensor([1.0, 10.0])).sum().backward()
    (torch.topk(xt, 2).values * torch.tensor([1.0, 10.0])).sum().backward()
    same(x.grad, xt.grad)
    with pytest.raises(loom.ShapeError, match="out of range"):
        loom.topk(loom.ones(3), 4)


def test_topk_nanogpt_sampling_crop(rng=np.random.default_rng(10)):
    logits = rng.normal(size=(2, 50)).astype(np.float32)
    lg, lt_ = loom.tensor(logits), torch.tensor(logits)
    v, _ = loom.topk(lg, 5)
    vt, _ = torch.topk(lt_, 5)
    out = lg.masked_fill(lg < v[:, [-1]], float("-inf"))
    out_t = lt_.masked_fill(lt_ < vt[:, [-1]], float("-inf"))
    same(loom.softmax(out, -1), torch.softmax(out_t, -1))


def test_multinomial_one_sample_distribution():
    loom.manual_seed(0)
    p = np.array([0.1, 0.0, 0.6, 0.3], np.float32)
    probs = loom.tensor(np.tile(p, (20000, 1)))
    s = loom.multinomial(probs, num_samples=1)
    st = torch.multinomial(torch.tensor(np.tile(p, (4, 1))), 1)
    assert s.dtype == loom.int64 and tuple(s.shape) == (20000, 1) == (20000, tuple(st.shape)[1])
    freq = np.bincount(s.numpy().ravel(), minlength=4) / 20000
    assert freq[1] == 0.0  # a zero weight is never drawn
    # within 5 standard deviations of the binomial frequency
    assert np.all(np.abs(freq - p) <= 5 * np.sqrt(p * (1 - p) / 20000) + 1e-9), freq
    # unnormalized weights, a 1-d input, the Tensor method
    w = loom.tensor([2.0, 0.0, 6.0])
    draws = np.array([w.multinomial(1).item() for _ in range(3)])
    assert set(draws) <= {0, 2} and tuple(w.multinomial(1).shape) == (1,)


def test_multinomial_many_samples():
    loom.manual_seed(1)
    p = np.array([0.5, 0.25, 0.125, 0.125], np.float32)
    n = 4000
    # without replacement: every row draws distinct categories, the zero weight never
    s = loom.multinomial(loom.tensor(np.tile(np.r_[p, 0.0], (n, 1))), 3).numpy()
    assert s.shape == (n, 3) and np.all(s < 4)
    assert all(len(set(r)) == 3 for r in s[:200].tolist())
    first = np.bincount(s[:, 0], minlength=4) / n
    assert np.all(np.abs(first - p) <= 5 * np.sqrt(p * (1 - p) / n))
    # with replacement: each draw follows p
    r = loom.multinomial(loom.tensor(np.tile(p, (n // 8, 1))), 8, replacement=True).numpy()
    freq = np.bincount(r.ravel(), minlength=4) / r.size
    assert np.all(np.abs(freq - p) <= 5 * np.sqrt(p * (1 - p) / r.size))
    with pytest.raises(RuntimeError) as want:
        torch.multinomial(torch.tensor(p), 5)
    with pytest.raises(loom.ShapeError, match="without replacement"):
        loom.multinomial(loom.tensor(p), 5)
    assert "without replacement" in str(want.value)


# ---- 7: grad modes -----------------------------------------------------------------------------

def test_no_grad_inference_mode_enable_grad_as_decorators_and_contexts():
    w = loom.ones(2, requires_grad=True)

    @loom.no_grad()
    def f(x):
        return x * 2

    @loom.no_grad
    def g(x):
        return x * 2

    @loom.inference_mode()
    def h(x):
        return x * 2

    for fn in (f, g, h):
        assert not fn(w).requires_grad and loom.is_grad_enabled()
    with loom.inference_mode():
        assert not (w * 2).requires_grad
    with loom.inference_mode(False):
        assert (w * 2).requires_grad
    with loom.no_grad():
        with loom.enable_grad():
            assert (w * 2).requires_grad
        assert not (w * 2).requires_grad

        @loom.enable_grad()
        def e(x):
            return x * 2
        assert e(w).requires_grad
    assert loom.is_grad_enabled()
    loom.set_grad_enabled(False)
    assert not loom.is_grad_enabled()
    loom.set_grad_enabled(True)
    with loom.set_grad_enabled(False):
        assert not loom.is_grad_enabled()
    assert loom.is_grad_enabled()

    # an exception inside restores the mode; recursion nests
    with pytest.raises(ZeroDivisionError):
        with loom.no_grad():
            1 / 0
    assert loom.is_grad_enabled()

    @loom.no_grad()
    def rec(n):
        return loom.is_grad_enabled() if n == 0 else rec(n - 1)
    assert rec(3) is False and loom.is_grad_enabled()


# ---- 8: devices, to(), .data -------------------------------------------------------------------

def test_device_and_to():
    t = loom.tensor([1.5, 2.5])
    assert str(t.device) == "cpu" and t.device == loom.device("cpu") and t.device == "cpu"
    assert t.device.type == "cpu" and repr(t.device) == "device(type='cpu')"
    assert t.to("cpu") is t and t.to(device="cpu") is t and t.cpu() is t
    assert t.to(loom.device("cpu")) is t
    ref = torch.tensor([1.5, 2.5])
    same(t.to(loom.float16), ref.to(torch.float16))
    same(t.to("cpu", loom.float64), ref.to("cpu", torch.float64))
    same(t.to(device="cpu", dtype=loom.int64), ref.to(device="cpu", dtype=torch.int64))
    same(t.to(loom.zeros(1, dtype=loom.int32)), ref.to(torch.zeros(1, dtype=torch.int32)))
    c = t.to(loom.float32, copy=True)
    assert c is not t
    with pytest.raises(loom.Error, match="cuda"):
        t.to("cuda")
    with pytest.raises(TypeError):
        t.to(3.0)


def test_data_is_detached_and_writes_through():
    p = nn.Parameter(loom.tensor([1.0, 2.0]))
    pt = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    assert not p.data.requires_grad and p.data.is_leaf and not pt.data.requires_grad
    same(p.data, pt.data)
    p.data.copy_(loom.tensor([3.0, 4.0]))
    pt.data.copy_(torch.tensor([3.0, 4.0]))
    same(p.detach(), pt.detach())
    p.data.mul_(0.5)
    pt.data.mul_(0.5)
    same(p.detach(), pt.detach())
    p.data = loom.tensor([7.0, 8.0])
    pt.data = torch.tensor([7.0, 8.0])
    same(p.detach(), pt.detach())
    assert p.requires_grad and p.is_leaf
    # no gradient flows through .data
    (p.data * p).sum().backward()
    (pt.data * pt).sum().backward()
    same(p.grad, pt.grad)
    with pytest.raises(loom.ShapeError):
        p.data = loom.zeros(3)
