"""backward, .grad, no_grad, grad and value_and_grad against torch.autograd."""
import collections

import numpy as np
import torch

import loom
from conftest import assert_same, from_torch


def test_backward_accumulates_and_no_grad(rng=np.random.default_rng(3)):
    a = torch.from_numpy(rng.standard_normal((3, 4))).float().requires_grad_()
    la = from_torch(a.detach()).requires_grad_()
    for _ in range(2):
        (torch.tanh(a) * 2).sum().backward()
        (loom.tanh(la) * 2).sum().backward()
    assert_same(la.grad, a.grad, tol=1e-5)
    with loom.no_grad():
        assert not loom.is_grad_enabled()
        assert not (la * 2).requires_grad
    assert loom.is_grad_enabled() and (la * 2).requires_grad
    la.grad = None
    assert la.grad is None
    g = torch.from_numpy(rng.standard_normal((3, 4))).float()
    (a * a).backward(g)
    lb = from_torch(a.detach()).requires_grad_()
    (lb * lb).backward(from_torch(g))
    assert_same(lb.grad, 2 * a.detach() * g, tol=1e-5)


Pair = collections.namedtuple("Pair", ["w", "b"])


def test_value_and_grad_over_a_pytree():
    rng = np.random.default_rng(5)
    w = torch.from_numpy(rng.standard_normal((4, 3))).float().requires_grad_()
    b = torch.from_numpy(rng.standard_normal(3)).float().requires_grad_()
    x = torch.from_numpy(rng.standard_normal((2, 4))).float()
    loss = torch.sigmoid(x @ w + b).pow(2).mean()
    loss.backward()

    def f(params, inputs, scale=1.0):
        p = params["layer"]
        return (loom.sigmoid(inputs @ p.w + p.b) ** 2).mean() * scale

    params = {"layer": Pair(from_torch(w.detach()), from_torch(b.detach())), "extra": None}
    value, g = loom.value_and_grad(f)(params, from_torch(x))
    assert_same(value, loss.detach(), tol=1e-6)
    assert isinstance(g["layer"], Pair) and g["extra"] is None
    assert_same(g["layer"].w, w.grad, tol=1e-5)
    assert_same(g["layer"].b, b.grad, tol=1e-5)
    assert params["layer"].w.grad is None  # functional: no .grad touched
    gx = loom.grad(f, argnums=1)(params, from_torch(x), scale=2.0)
    xr = x.clone().requires_grad_()
    (torch.sigmoid(xr @ w.detach() + b.detach()).pow(2).mean() * 2).backward()
    assert_same(gx, xr.grad, tol=1e-5)


def test_grad_of_an_unused_leaf_is_zeros():
    g = loom.grad(lambda p: (p[0] * 3).sum())([loom.ones(2), loom.ones(3, dtype=loom.float64)])
    assert_same(g[0], torch.full((2,), 3.0))
    assert_same(g[1], torch.zeros(3, dtype=torch.float64))
