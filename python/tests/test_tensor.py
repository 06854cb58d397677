"""Creation, properties, repr and indexing against PyTorch 1.13."""
import numpy as np
import pytest
import torch

import loom
from conftest import L2T, assert_same, from_torch


@pytest.mark.parametrize("data", [[[1.0, 2.0], [3.0, 4.0]], [1, 2, 3], [True, False], 3.5, 7,
                                  [[1, 2.5]], np.arange(6, dtype=np.int32).reshape(2, 3),
                                  np.float64(2.0)])
def test_tensor_dtype_inference(data):
    assert_same(loom.tensor(data), torch.tensor(data))


def test_tensor_dtype_override():
    assert_same(loom.tensor([1, 2], dtype=loom.float64), torch.tensor([1, 2], dtype=torch.float64))
    assert_same(loom.tensor([1.5, 2], dtype=loom.bfloat16),
                torch.tensor([1.5, 2], dtype=torch.bfloat16))


def test_factories():
    assert_same(loom.zeros(2, 3), torch.zeros(2, 3))
    assert_same(loom.zeros((2, 3), dtype=loom.int64), torch.zeros((2, 3), dtype=torch.int64))
    assert_same(loom.ones(4), torch.ones(4))
    assert_same(loom.full((2, 3), 7.0), torch.full((2, 3), 7.0))
    assert_same(loom.full((2,), 7), torch.full((2,), 7))
    assert_same(loom.arange(5), torch.arange(5))
    assert_same(loom.arange(1, 6, dtype=loom.float32), torch.arange(1, 6, dtype=torch.float32))
    assert_same(loom.arange(0.5, 3), torch.arange(0.5, 3))
    assert_same(loom.arange(10, 1, -3), torch.arange(10, 1, -3))
    assert_same(loom.arange(0, 1, 0.25), torch.arange(0, 1, 0.25))
    loom.manual_seed(0)
    a = loom.randn(4, 4).numpy().copy()
    loom.manual_seed(0)
    assert np.array_equal(loom.randn(4, 4).numpy(), a)
    r = loom.rand(1000).numpy()
    assert r.min() >= 0 and r.max() < 1 and abs(r.mean() - 0.5) < 0.05


def test_properties():
    t = loom.zeros(2, 3)
    assert t.shape == (2, 3) and isinstance(t.shape, tuple) and t.shape[0] == 2
    assert t.size() == (2, 3) and t.size(1) == 3 and t.size(-1) == 3
    assert t.ndim == 2 and t.dim() == 2 and t.numel() == 6 and len(t) == 2
    assert t.dtype == loom.float32 and repr(loom.float32) == "loom.float32"
    assert not t.requires_grad and t.grad is None
    assert loom.tensor(2.5).item() == 2.5 and isinstance(loom.tensor(3).item(), int)
    assert loom.tensor([[1, 2], [3, 4]]).tolist() == [[1, 2], [3, 4]]
    p = loom.ones(3) * 2
    assert p.is_pending
    loom.sync()
    assert not p.is_pending


@pytest.mark.parametrize("data", [[[1.0, 2.0], [3.0, 4.0]], [1, 2, 3], [True, False], 2.5,
                                  [0.125, -3.0], [[[1, 2], [3, 4]], [[5, 6], [7, 80]]],
                                  [1e-6, 1.0, 1e5], [float("nan"), 1.5, -float("inf")], [],
                                  [[1.0, 2.0]] * 3])
@pytest.mark.parametrize("dt", [None, "float64", "int32"])
def test_repr_like_torch(data, dt):
    want = torch.tensor(data) if dt is None else torch.tensor(data).to(getattr(torch, dt))
    got = from_torch(want)
    assert repr(got) == repr(want).replace("torch.", "loom.")
    assert repr(got.requires_grad_() if got.dtype.is_floating_point else got) == \
        repr(want.requires_grad_() if want.is_floating_point() else want).replace("torch.", "loom.")


KEYS = [0, -1, (1, 2), slice(1, 3), slice(None, None, 2), (slice(None), 0), (Ellipsis, None),
        (None, 1), (-2, slice(None, None, -1 + 3)), (Ellipsis, 1), (slice(-3, None), Ellipsis, 0),
        slice(5, 10), (slice(None), slice(1, 4, 2), None, -1)]


@pytest.mark.parametrize("key", KEYS, ids=[repr(k) for k in KEYS])
def test_basic_indexing(key):
    a = torch.arange(60, dtype=torch.float32).reshape(3, 4, 5)
    assert_same(from_torch(a)[key], a[key])


def test_index_tensors():
    a = torch.arange(20).reshape(4, 5)
    for idx in (torch.tensor([3, 0, 3]), torch.tensor([[1, 2], [0, 3]]), torch.tensor(2)):
        assert_same(from_torch(a)[from_torch(idx)], a[idx])
    i = torch.tensor([4, 0])
    assert_same(from_torch(a)[:, from_torch(i)], a[:, i])
    neg = torch.tensor([-1, 2, -4])  # counted from the back, as torch
    assert_same(from_torch(a)[from_torch(neg)], a[neg])
    assert_same(from_torch(a)[1, from_torch(neg)], a[1, neg])
    for bad in ([4], [-5]):  # out of range either way: named as written
        with pytest.raises(loom.ExecError, match=f"index {bad[0]} is out of range"):
            from_torch(a)[loom.tensor(bad)].numpy()
    # several index tensors broadcast together in torch; loom says it does not do that
    with pytest.raises(NotImplementedError, match="several index tensors"):
        from_torch(a)[loom.tensor([0, 1]), loom.tensor([1, 2])]


def test_index_errors():
    t = loom.zeros(3, 4)
    with pytest.raises(IndexError):
        t[3]
    with pytest.raises(IndexError):
        t[0, 0, 0]
    with pytest.raises(TypeError, match="valid indices"):
        t["a"]
