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


def check_setitem(tkey, lkey, kind, seed, scalar):
    """t[key] = value on a [4, 5, 3] float32 tensor, loom against torch: `kind` is a Python
    number, a tensor of the selection's shape, or one broadcast from its last dim."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((4, 5, 3)).astype(np.float32)
    want = torch.from_numpy(base.copy())
    sel = want[tkey]
    if kind == "scalar":
        value_t, value_l = scalar, scalar
    else:
        shape = tuple(sel.shape) if kind == "tensor" else tuple(sel.shape)[-1:]
        v = torch.from_numpy(rng.standard_normal(shape).astype(np.float32))
        value_t, value_l = v, from_torch(v)
    want[tkey] = value_t
    got = loom.tensor(base)
    got[lkey] = value_l
    assert_same(got, want)


@pytest.mark.parametrize("key", KEYS, ids=repr)
@pytest.mark.parametrize("kind", ["scalar", "tensor", "broadcast"])
def test_setitem_equals_torch(key, kind):
    check_setitem(key, key, kind, 3, 7.5)


def _ix(v):
    return np.array(v, dtype=np.int64)  # an index tensor in a key


TENSOR_KEYS = [(_ix([3, 0]),), (_ix([-1, 1, -4]),), (_ix([[2, 0], [1, 3]]),), (_ix(2),),
               (_ix([]),), (slice(None), _ix([4, 0, 2])), (1, _ix([0, -1])),
               (Ellipsis, _ix([2, 1])), (_ix([1, 2]), slice(0, 3, 2)), (None, _ix([0, 3]))]


@pytest.mark.parametrize("key", TENSOR_KEYS, ids=repr)
@pytest.mark.parametrize("kind", ["scalar", "tensor", "broadcast"])
def test_setitem_index_tensor_equals_torch(key, kind):
    tkey = tuple(torch.from_numpy(k) if isinstance(k, np.ndarray) else k for k in key)
    lkey = tuple(loom.tensor(k) if isinstance(k, np.ndarray) else k for k in key)
    check_setitem(tkey, lkey, kind, 5, -3.25)


@pytest.mark.parametrize("key", [([3, 0],), (slice(None), [4, 0, 2]), (1, [0, -1]),
                                 (Ellipsis, [2, 1])], ids=repr)
@pytest.mark.parametrize("kind", ["scalar", "tensor"])
def test_setitem_list_keys_equal_torch(key, kind):
    """A list of ints in the key, as getitem takes it: the same parser reads both."""
    check_setitem(key, key, kind, 5, 1.5)


def test_setitem_index_tensor_repeats_and_gradients():
    # a position named twice gets the last value (torch 1.13's CPU index_put_ does the same)
    want = torch.zeros(5, dtype=torch.float64)
    want[torch.tensor([1, 3, 1])] = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    got = loom.zeros(5, dtype=loom.float64)
    got[loom.tensor([1, 3, 1])] = loom.tensor([1.0, 2.0, 3.0], dtype=loom.float64)
    assert_same(got, want)
    # gradients: to the untouched rows of x and to the rows of v that were written
    x_np = np.arange(12, dtype=np.float64).reshape(4, 3)
    idx = [2, 0]
    tx = torch.tensor(x_np, requires_grad=True)
    tv = torch.ones(2, 3, dtype=torch.float64, requires_grad=True)
    ty = tx * 2.0
    ty[torch.tensor(idx)] = tv * 5.0
    w = torch.arange(12, dtype=torch.float64).reshape(4, 3)
    (ty * w).sum().backward()
    lx = loom.tensor(x_np, requires_grad=True)
    lv = loom.ones(2, 3, dtype=loom.float64, requires_grad=True)
    ly = lx * 2.0
    ly[loom.tensor(idx)] = lv * 5.0
    (ly * from_torch(w)).sum().backward()
    assert_same(ly, ty.detach())
    assert_same(lx.grad, tx.grad)
    assert_same(lv.grad, tv.grad)


def test_setitem_index_tensor_pending_and_one_compile():
    """The index may be pending (computed on the graph); a loop with new index values of the
    same shape compiles once."""
    t = loom.zeros(6)
    loom.sync()
    loom.reset_metrics()
    for i in range(4):
        t[loom.tensor([i, i + 2]) % 6] = float(i + 1)
        loom.sync()
    want = torch.zeros(6)
    for i in range(4):
        want[torch.tensor([i, i + 2]) % 6] = float(i + 1)
    assert_same(t, want)
    assert loom.metrics().compiles == 1


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
    with pytest.raises(loom.DTypeError, match="int64 or int32"):
        t[loom.tensor([0.0])] = 1.0
    with pytest.raises(NotImplementedError, match="several index tensors"):
        t[loom.tensor([0]), loom.tensor([1])] = 1.0
    with pytest.raises(loom.ExecError, match="index 2 is out of range"):
        t[loom.tensor([0, 2])] = 1.0
        t.numpy()
    with pytest.raises(ValueError, match="step"):
        t[::-1] = 1.0
