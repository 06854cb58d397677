import numpy as np
import pytest
import torch

import loom

L2T = {loom.bool_: torch.bool, loom.int32: torch.int32, loom.int64: torch.int64,
       loom.bfloat16: torch.bfloat16, loom.float16: torch.float16, loom.float32: torch.float32,
       loom.float64: torch.float64}
T2L = {v: k for k, v in L2T.items()}
# relative/absolute tolerance per result dtype
TOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def to_torch(t):
    """An independent copy of a loom tensor's value (through float32/numpy for bf16)."""
    if t.dtype == loom.bfloat16:
        return torch.from_numpy(np.array(t.float().numpy())).to(torch.bfloat16)
    return torch.from_numpy(np.array(t.numpy()))


def from_torch(x):
    if x.dtype == torch.bfloat16:
        return loom.tensor(x.float().numpy()).to(loom.bfloat16)
    return loom.tensor(x.numpy())


def assert_same(got, want, tol=None):
    """Dtypes exactly, values to the dtype's tolerance (NaN == NaN)."""
    assert isinstance(got, loom.Tensor), type(got)
    assert L2T[got.dtype] == want.dtype, (got.dtype, want.dtype)
    assert tuple(got.shape) == tuple(want.shape), (got.shape, want.shape)
    g = to_torch(got)
    if want.dtype.is_floating_point:
        t = tol if tol is not None else TOL[want.dtype]
        torch.testing.assert_close(g.double(), want.double(), rtol=t, atol=t, equal_nan=True)
    else:
        assert torch.equal(g, want), (g, want)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
