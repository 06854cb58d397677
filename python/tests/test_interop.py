"""numpy and DLPack both ways: values, dtypes and shared memory (data pointers equal)."""
import numpy as np
import pytest
import torch

import loom
from conftest import L2T, T2L

NP = {loom.bool_: np.bool_, loom.int32: np.int32, loom.int64: np.int64,
      loom.float16: np.float16, loom.float32: np.float32, loom.float64: np.float64}


@pytest.mark.parametrize("dt", list(NP))
def test_numpy_both_ways_share_memory(dt):
    a = (np.arange(12).reshape(3, 4) % 3).astype(NP[dt])
    t = loom.from_numpy(a)
    assert t.dtype == dt and t.shape == (3, 4)
    assert t.data_ptr() == a.ctypes.data  # shared, not copied
    out = np.asarray(t)
    assert out.ctypes.data == a.ctypes.data and out.dtype == a.dtype
    np.testing.assert_array_equal(out, a)
    c = loom.tensor(a)  # copies
    assert c.data_ptr() != a.ctypes.data
    np.testing.assert_array_equal(c.numpy(), a)


def test_from_numpy_keeps_array_alive_and_results_are_right():
    a = np.arange(5, dtype=np.float32)
    t = loom.from_numpy(a)
    del a
    r = (t * 2 + 1).numpy()
    np.testing.assert_array_equal(r, np.arange(5, dtype=np.float32) * 2 + 1)


def test_loom_result_memory_exported_without_copy():
    t = loom.ones(4, 4) * 3
    a = np.asarray(t)
    assert a.ctypes.data == t.data_ptr()
    np.testing.assert_array_equal(a, np.full((4, 4), 3, np.float32))


def test_non_contiguous_numpy_is_copied_correctly():
    a = np.arange(12, dtype=np.float64).reshape(3, 4).T
    t = loom.from_numpy(a)
    np.testing.assert_array_equal(t.numpy(), a)
    np.testing.assert_array_equal(loom.tensor(a).numpy(), a)


# torch 1.13 cannot put bool tensors into DLPack ("Bool type is not supported by dlpack").
@pytest.mark.parametrize("tdt", [torch.int32, torch.int64, torch.float16,
                                 torch.bfloat16, torch.float32, torch.float64])
def test_dlpack_both_ways(tdt):
    x = (torch.arange(12).reshape(3, 4) % 3).to(tdt)
    t = loom.from_dlpack(x)
    assert t.dtype == T2L[tdt] and t.shape == (3, 4)
    assert t.data_ptr() == x.data_ptr()
    y = torch.from_dlpack(t)
    assert y.dtype == tdt and y.data_ptr() == x.data_ptr()
    assert torch.equal(y, x)
    z = torch.from_dlpack(t + t)
    assert torch.equal(z, x + x)


def test_dlpack_of_loom_result_shares():
    t = loom.arange(6).reshape(2, 3) * 2
    y = torch.from_dlpack(t)
    assert y.data_ptr() == t.data_ptr()
    assert torch.equal(y, torch.arange(6).reshape(2, 3) * 2)


def test_shared_numpy_memory_is_never_donated():
    # The tensor over a's memory dies before the graph runs: loom must not write results into
    # memory numpy still owns (Buffer::wrap counts the foreign owner as a user).
    a = np.full(1 << 16, 2.0, dtype=np.float32)
    t = loom.from_numpy(a)
    r = loom.exp(t) * 3
    del t
    loom.sync()
    np.testing.assert_array_equal(a, np.full(1 << 16, 2.0, dtype=np.float32))
    np.testing.assert_allclose(r.numpy(), np.exp(np.float32(2.0)) * 3, rtol=1e-6)
