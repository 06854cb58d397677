"""Every bound op against PyTorch 1.13 on seeded random inputs: result dtypes exactly, values
to dtype tolerance, gradients against torch's autograd."""
import itertools
import math

import numpy as np
import pytest
import torch

import loom
from conftest import L2T, assert_same, from_torch

DTYPES = [torch.bool, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32,
          torch.float64]
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def rand_torch(rng, shape, dt, nonzero=False, special=False):
    if dt == torch.bool:
        return torch.from_numpy(np.asarray(rng.random(shape) < 0.5))
    if dt in (torch.int32, torch.int64):
        a = np.asarray(rng.integers(-9, 10, size=shape))
        if nonzero:
            a[a == 0] = 3
        return torch.from_numpy(a).to(dt)
    a = np.asarray(rng.standard_normal(shape) * 3)
    if nonzero:
        a[np.abs(a) < 0.25] = 0.5
    if special and a.size >= 3:
        flat = a.reshape(-1)
        flat[0], flat[1], flat[2] = np.nan, np.inf, -np.inf
    return torch.from_numpy(a).to(dt)


BINARY = {
    "add": (lambda a, b: a + b, lambda a, b: a + b),
    "sub": (lambda a, b: a - b, lambda a, b: a - b),
    "mul": (lambda a, b: a * b, lambda a, b: a * b),
    "truediv": (lambda a, b: a / b, lambda a, b: a / b),
    "maximum": (loom.maximum, torch.maximum),
    "minimum": (loom.minimum, torch.minimum),
    "lt": (lambda a, b: a < b, lambda a, b: a < b),
    "le": (lambda a, b: a <= b, lambda a, b: a <= b),
    "gt": (lambda a, b: a > b, lambda a, b: a > b),
    "ge": (lambda a, b: a >= b, lambda a, b: a >= b),
    "eq": (lambda a, b: a == b, lambda a, b: a == b),
    "ne": (lambda a, b: a != b, lambda a, b: a != b),
}
NUMERIC_ONLY = {"sub"}  # torch refuses bool - bool
@pytest.mark.parametrize("op", sorted(BINARY))
@pytest.mark.parametrize("da,db", list(itertools.product(DTYPES, DTYPES)))
def test_binary_dtype_pairs(op, da, db, rng):
    lf, tf = BINARY[op]
    a, b = rand_torch(rng, (3, 4), da), rand_torch(rng, (4,), db, nonzero=True)
    if op in NUMERIC_ONLY and torch.bool in (da, db):  # torch raises for bool subtraction
        with pytest.raises(RuntimeError):
            tf(a, b)
        with pytest.raises(loom.Error):
            lf(from_torch(a), from_torch(b))
        return
    assert_same(lf(from_torch(a), from_torch(b)), tf(a, b))


@pytest.mark.parametrize("op", sorted(BINARY))
@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("scalar", [2, 2.5, True])
def test_binary_python_scalars(op, dt, scalar, rng):
    if op in NUMERIC_ONLY and (dt == torch.bool or scalar is True):
        pytest.skip("torch raises for bool subtraction")
    lf, tf = BINARY[op]
    if op in ("maximum", "minimum"):
        pytest.skip("torch.maximum takes tensors only")
    a = rand_torch(rng, (5,), dt, nonzero=True)
    assert_same(lf(from_torch(a), scalar), tf(a, scalar))
    assert_same(lf(scalar, from_torch(a)), tf(scalar, a))


@pytest.mark.parametrize("dt", [torch.int32, torch.int64, torch.float32, torch.float64])
@pytest.mark.parametrize("op", ["floordiv", "mod"])
def test_floordiv_mod_python_signs(op, dt, rng):
    a = rand_torch(rng, (6, 5), dt) * 3
    b = rand_torch(rng, (5,), dt, nonzero=True)
    la, lb = from_torch(a), from_torch(b)
    if op == "floordiv":
        want = torch.div(a, b, rounding_mode="floor")
        assert_same(la // lb, want, tol=1e-4)
        assert_same(la // 3, torch.div(a, 3, rounding_mode="floor"), tol=1e-4)
        assert_same(7 // lb, torch.div(torch.full_like(b, 7), b, rounding_mode="floor"), tol=1e-4)
    else:
        assert_same(la % lb, torch.remainder(a, b), tol=1e-4)
        assert_same(la % -3, torch.remainder(a, -3), tol=1e-4)
        assert_same(-7 % lb, torch.remainder(torch.full_like(b, -7), b), tol=1e-4)


def test_floor_special_values():
    x = torch.tensor([-2.5, -0.5, 0.0, 0.5, 2.5, 1e30, -1e30, float("nan"), float("inf"),
                      -float("inf"), 8388609.0, -3.0])
    assert_same(loom.floor(from_torch(x)), torch.floor(x))


UNARY = ["neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "sin", "cos",
         "erf"]


@pytest.mark.parametrize("name", UNARY)
@pytest.mark.parametrize("dt", FLOATS)
def test_unary_special_values(name, dt, rng):
    a = rand_torch(rng, (4, 5), dt, special=True)
    if name in ("log", "sqrt", "rsqrt"):
        a = a.abs()
    # torch 1.13's CPU kernels lack float16 for these: its float32 result rounded is the oracle
    want = getattr(torch, name)(a.float()).to(dt) if dt == torch.float16 else getattr(torch, name)(a)
    assert_same(getattr(loom, name)(from_torch(a)), want)
    assert_same(getattr(from_torch(a), name)(), want)


@pytest.mark.parametrize("shape", [(), (0,), (2, 0, 3)])
def test_zero_dim_and_zero_size(shape, rng):
    a = rand_torch(rng, shape, torch.float32)
    b = rand_torch(rng, shape, torch.float32)
    la, lb = from_torch(a), from_torch(b)
    assert_same(la * lb + 1.5, a * b + 1.5)
    assert_same(loom.exp(la), torch.exp(a))
    assert_same(la.sum(), a.sum())


def test_zero_dim_does_not_raise_dtype(rng):
    a = rand_torch(rng, (3,), torch.float16)
    s = torch.tensor(2.0, dtype=torch.float64)
    assert_same(from_torch(a) * from_torch(s), a * s)
    i = torch.tensor(3, dtype=torch.int64)
    j = rand_torch(rng, (3,), torch.int32)
    assert_same(from_torch(j) + from_torch(i), j + i)


@pytest.mark.parametrize("dims", [None, 0, 1, -1, (0, 2), (-1, -3)])
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("name", ["sum", "mean", "amax", "amin"])
def test_reductions(name, dims, keepdim, rng):
    a = rand_torch(rng, (3, 4, 5), torch.float32)
    la = from_torch(a)
    if dims is None:
        want = getattr(torch, name)(a)
        if keepdim:
            want = want.reshape(1, 1, 1)
        got = getattr(la, name)(keepdim=keepdim)
    else:
        want = getattr(torch, name)(a, dim=dims, keepdim=keepdim)
        got = getattr(la, name)(dim=dims, keepdim=keepdim)
    assert_same(got, want)


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("keepdim", [False, True])
def test_max_min_argmax_with_dim(dim, keepdim, rng):
    a = rand_torch(rng, (4, 6), torch.float32)
    la = from_torch(a)
    v, i = la.max(dim=dim, keepdim=keepdim)
    tv, ti = a.max(dim=dim, keepdim=keepdim)
    assert_same(v, tv)
    assert_same(i, ti)
    v, i = loom.min(la, dim, keepdim)
    tv, ti = torch.min(a, dim, keepdim)
    assert_same(v, tv)
    assert_same(i, ti)
    assert_same(la.argmax(dim=dim, keepdim=keepdim), a.argmax(dim=dim, keepdim=keepdim))
    assert_same(la.argmax(), a.argmax())
    assert_same(la.max(), a.max())


def test_integer_sum_and_mean_dtypes(rng):
    a = rand_torch(rng, (3, 4), torch.int32)
    assert_same(from_torch(a).sum(dim=1), a.sum(dim=1))
    b = rand_torch(rng, (3, 4), torch.bool)
    assert_same(from_torch(b).sum(), b.sum())


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax_family(dim, rng):
    a = rand_torch(rng, (3, 5), torch.float32)
    assert_same(loom.softmax(from_torch(a), dim), torch.softmax(a, dim))
    assert_same(from_torch(a).log_softmax(dim), a.log_softmax(dim))


@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 5)), ((4,), (4, 2)), ((2, 3, 4), (4,)),
                                   ((2, 1, 3, 4), (5, 4, 2))])
def test_matmul(sa, sb, rng):
    a, b = rand_torch(rng, sa, torch.float32), rand_torch(rng, sb, torch.float32)
    assert_same(from_torch(a) @ from_torch(b), a @ b, tol=1e-4)
    assert_same(loom.matmul(from_torch(a), from_torch(b)), torch.matmul(a, b), tol=1e-4)


def test_layout_ops(rng):
    a = rand_torch(rng, (2, 3, 4), torch.float32)
    la = from_torch(a)
    assert_same(la.reshape(4, -1), a.reshape(4, -1))
    assert_same(la.view((6, 4)), a.view((6, 4)))
    assert_same(la.permute(2, 0, 1), a.permute(2, 0, 1))
    assert_same(la.transpose(0, -1), a.transpose(0, -1))
    assert_same(la.T, a.permute(2, 1, 0))
    assert_same(la.unsqueeze(-1), a.unsqueeze(-1))
    assert_same(la.unsqueeze(1).squeeze(1), a)
    assert_same(loom.squeeze(la.reshape(1, 2, 1, 12)), a.reshape(1, 2, 1, 12).squeeze())
    assert_same(la.flatten(1), a.flatten(1))
    assert_same(la[:, :1].expand(2, 5, 4), a[:, :1].expand(2, 5, 4))
    assert_same(loom.cat([la, la], dim=-1), torch.cat([a, a], dim=-1))
    assert_same(loom.stack([la, la], dim=1), torch.stack([a, a], dim=1))
    idx = torch.tensor([2, 0, 2])
    assert_same(loom.index_select(la, 1, from_torch(idx)), torch.index_select(a, 1, idx))
    g = torch.from_numpy(rng.integers(0, 3, size=(2, 3, 4)))
    assert_same(loom.gather(la, 1, from_torch(g)), torch.gather(a, 1, g))
    src = rand_torch(rng, (2, 3, 4), torch.float32)
    assert_same(loom.index_add(la, 1, from_torch(idx), from_torch(src)),
                torch.index_add(a, 1, idx, src))


def test_index_select_and_index_add_gradients(rng):
    # index_select's adjoint is index_add (repeated indices accumulate) and back.
    w = rand_torch(rng, (6, 5), torch.float64).requires_grad_()
    src = rand_torch(rng, (4, 5), torch.float64).requires_grad_()
    idx = torch.tensor([3, 0, 3, 5])
    lw = from_torch(w.detach()).requires_grad_()
    ls = from_torch(src.detach()).requires_grad_()
    li = from_torch(idx)
    g = rand_torch(rng, (6, 5), torch.float64)
    (torch.index_select(w, 0, idx).sum() + (torch.index_add(w, 0, idx, src) * g).sum()).backward()
    (loom.index_select(lw, 0, li).sum() + (loom.index_add(lw, 0, li, ls) * from_torch(g)).sum()
     ).backward()
    assert_same(lw.grad, w.grad)
    assert_same(ls.grad, src.grad)


def test_where_clamp_to(rng):
    a = rand_torch(rng, (3, 4), torch.float32, special=True)
    c = a > 0
    la, lc = from_torch(a), from_torch(c)
    assert_same(loom.where(lc, la, 0.0), torch.where(c, a, torch.tensor(0.0)))
    assert_same(loom.clamp(la, min=-1.0, max=2.0), torch.clamp(a, min=-1.0, max=2.0))
    assert_same(la.to(loom.float64), a.to(torch.float64))
    assert_same((lc & (la < 1)) | ~lc, (c & (a < 1)) | ~c)


def test_nn_functions(rng):
    x = rand_torch(rng, (4, 6), torch.float32)
    w, b = rand_torch(rng, (6,), torch.float32), rand_torch(rng, (6,), torch.float32)
    lx = from_torch(x)
    assert_same(loom.layer_norm(lx, [6], from_torch(w), from_torch(b)),
                torch.nn.functional.layer_norm(x, [6], w, b), tol=1e-4)
    assert_same(loom.gelu(lx), torch.nn.functional.gelu(x))
    t = torch.tensor([1, 0, 5, 2])
    assert_same(loom.cross_entropy(lx, from_torch(t)), torch.nn.functional.cross_entropy(x, t),
                tol=1e-4)
    assert_same(loom.mse_loss(lx, from_torch(x * 0.5)),
                torch.nn.functional.mse_loss(x, x * 0.5))
    e = rand_torch(rng, (7, 3), torch.float32)
    assert_same(loom.embedding(from_torch(t), from_torch(e)),
                torch.nn.functional.embedding(t, e))


def test_pow_forms(rng):
    a = rand_torch(rng, (5,), torch.float32).abs() + 0.5
    la = from_torch(a)
    assert_same(la ** 2, a ** 2)
    assert_same(la ** 0.5, a ** 0.5)
    assert_same(2 ** la, 2 ** a)
    assert_same(la ** la, a ** a)


def test_inplace_forms(rng):
    a = rand_torch(rng, (3, 4), torch.float32)
    b = rand_torch(rng, (4,), torch.float32)
    la, lb = from_torch(a), from_torch(b)
    alias = la
    la += lb
    la *= 2
    la -= 1
    la /= 4
    a2 = (((a + b) * 2) - 1) / 4
    assert la is alias
    assert_same(alias, a2)
    i = from_torch(torch.tensor([1, 2, 3]))
    with pytest.raises(loom.DTypeError):
        i += 1.5  # torch: result type Float can't be cast to Long


GRAD_UNARY = ["exp", "tanh", "sigmoid", "sin", "cos", "erf", "relu", "abs", "neg", "sqrt",
              "log", "rsqrt"]


@pytest.mark.parametrize("name", GRAD_UNARY)
def test_unary_gradients(name, rng):
    a = torch.from_numpy(rng.uniform(0.3, 2.0, size=(3, 4)) * rng.choice([-1, 1], (3, 4)))
    if name in ("sqrt", "log", "rsqrt"):
        a = a.abs()
    a = a.float().requires_grad_()
    getattr(torch, name)(a).sum().backward()
    la = from_torch(a.detach()).requires_grad_()
    getattr(loom, name)(la).sum().backward()
    assert_same(la.grad, a.grad, tol=1e-4)


def test_composite_gradients(rng):
    a = torch.from_numpy(rng.standard_normal((3, 4))).float().requires_grad_()
    b = torch.from_numpy(rng.standard_normal((4, 2))).float().requires_grad_()
    loss = (torch.softmax(a @ b, -1) * torch.tensor([1.0, -2.0])).mean() + (a ** 2).max()
    loss.backward()
    la = from_torch(a.detach()).requires_grad_()
    lb = from_torch(b.detach()).requires_grad_()
    lloss = (loom.softmax(la @ lb, -1) * loom.tensor([1.0, -2.0])).mean() + (la ** 2).max()
    lloss.backward()
    assert_same(lloss.detach(), loss.detach(), tol=1e-5)
    assert_same(la.grad, a.grad, tol=1e-4)
    assert_same(lb.grad, b.grad, tol=1e-4)
