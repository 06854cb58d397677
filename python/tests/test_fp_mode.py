"""Denormals in runs (loom.set_flush_denormal) against PyTorch 1.13 in the same mode
(torch.set_flush_denormal): flushed by default, IEEE when turned off; bit-equal results."""
import pytest
import torch

import loom
from conftest import to_torch


def programs(lib, name):
    dt = getattr(lib, name)
    tiny = {"float32": 1e-39, "float64": 1e-310, "bfloat16": 1e-39}[name]
    small = {"float32": 1e-20, "float64": 1e-160, "bfloat16": 1e-20}[name]
    d = lib.full((300, 64), tiny, dtype=dt)
    s = lib.full((300, 64), small, dtype=dt)
    b = lib.ones((64, 32), dtype=dt)
    return [d * 64.0, s * s, d + d, lib.matmul(d, b)]


@pytest.fixture
def restore_modes():
    yield
    loom.set_flush_denormal(True)
    torch.set_flush_denormal(False)


@pytest.mark.parametrize("flush", [True, False])
@pytest.mark.parametrize("dt", ["float32", "float64", "bfloat16"])
def test_runs_match_torch_in_the_same_mode(flush, dt, restore_modes):
    assert loom.flush_denormal()  # the default
    assert loom.set_flush_denormal(flush) is True  # the previous setting
    assert loom.flush_denormal() is flush
    assert torch.set_flush_denormal(flush)
    want = programs(torch, dt)
    torch.set_flush_denormal(False)
    # The matmul's oracle is not torch's matmul: torch.set_flush_denormal sets the calling
    # thread's mode, and torch 2.x's BLAS threads keep whichever mode they had (on torch 2.9 the
    # float64 product gave denormal rows when flushed and zero rows in IEEE mode); torch 1.13's
    # bfloat16 matmul (oneDNN's AVX512_BF16 dot products) reads denormals as zero in either
    # mode. Each product sums 64 equal values: exactly 64 * tiny (d * 64.0, computed on this
    # thread), or zero when the denormal operand is flushed.
    want[3] = torch.zeros_like(want[3]) if flush else want[0][:, :32].clone()
    got = programs(loom, dt)
    for i, (g, w) in enumerate(zip(got, want)):
        g = to_torch(g)
        assert g.dtype == w.dtype
        assert torch.equal(g, w), (i, flush, dt, g.flatten()[:3], w.flatten()[:3])
    if flush:
        assert all(float(w.abs().max()) == 0 for w in want)
    else:
        assert all(float(w.abs().min()) > 0 for w in want)
