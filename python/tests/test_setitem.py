"""t[key] = value against torch 1.13: basic keys, broadcasting, dtype conversion, gradients,
errors."""
import numpy as np
import pytest
import torch

import loom
from conftest import assert_same, from_torch

KEYS = [0, -1, 2, slice(1, 3), slice(None, None, 2), slice(-3, None), (slice(None), 1),
        (1, slice(0, 4, 3)), (Ellipsis, 0), (None, 1), (slice(None), None, slice(1, 2)),
        (-2, -1, slice(None, None, 2)), (Ellipsis,), (slice(5, 9),), (0, 0, 0)]


@pytest.mark.parametrize("key", KEYS, ids=repr)
@pytest.mark.parametrize("kind", ["scalar", "tensor", "broadcast"])
def test_setitem_equals_torch(key, kind):
    rng = np.random.default_rng(3)
    base = rng.standard_normal((4, 5, 3)).astype(np.float32)
    want = torch.from_numpy(base.copy())
    sel = want[key]
    if kind == "scalar":
        value_t, value_l = 7.5, 7.5
    elif kind == "tensor":
        v = torch.from_numpy(rng.standard_normal(tuple(sel.shape)).astype(np.float32))
        value_t, value_l = v, from_torch(v)
    else:
        v = torch.from_numpy(rng.standard_normal(tuple(sel.shape)[-1:]).astype(np.float32))
        value_t, value_l = v, from_torch(v)
    want[key] = value_t
    got = loom.tensor(base)
    got[key] = value_l
    assert_same(got, want)


def test_setitem_converts_dtype_and_keeps_identity():
    want = torch.arange(6).reshape(2, 3)
    got = loom.arange(6).reshape(2, 3)
    alias = got
    got[1] = 9.7  # float into int64: truncated as torch
    want[1] = 9.7
    assert alias is got
    assert_same(got, want)


def test_setitem_gradients():
    x_np = np.arange(6, dtype=np.float64).reshape(2, 3)
    tx = torch.tensor(x_np, requires_grad=True)
    tv = torch.tensor([1.5, -2.0], dtype=torch.float64, requires_grad=True)
    ty = tx * 2.0
    ty[:, 1] = tv * 3.0
    (ty * torch.arange(6, dtype=torch.float64).reshape(2, 3)).sum().backward()
    lx = loom.tensor(x_np, requires_grad=True)
    lv = loom.tensor([1.5, -2.0], dtype=loom.float64, requires_grad=True)
    ly = lx * 2.0
    ly[:, 1] = lv * 3.0
    (ly * loom.arange(6, dtype=loom.float64).reshape(2, 3)).sum().backward()
    assert_same(ly, ty.detach())
    assert_same(lx.grad, tx.grad)
    assert_same(lv.grad, tv.grad)


def test_setitem_in_a_loop_compiles_once():
    t = loom.zeros(8)
    loom.sync()
    loom.reset_metrics()
    for i in range(5):
        t[i] = float(i)
        loom.sync()
    assert t.tolist() == [0, 1, 2, 3, 4, 0, 0, 0]
    assert loom.metrics().compiles == 1


def test_setitem_errors():
    t = loom.zeros(2, 3)
    with pytest.raises(IndexError):
        t[2] = 1.0
    with pytest.raises(IndexError):
        t[0, 0, 0] = 1.0
    with pytest.raises(loom.ShapeError, match="shape mismatch"):
        t[0] = loom.ones(4)
    with pytest.raises(TypeError, match="index tensors"):
        t[loom.tensor([0])] = 1.0
    with pytest.raises(ValueError, match="step"):
        t[::-1] = 1.0
