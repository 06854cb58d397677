"""loom.save_safetensors / load_safetensors against the `safetensors` package (both ways)."""
import json
import struct

import numpy as np
import pytest
import torch

import loom
from conftest import L2T, from_torch, to_torch

st_torch = pytest.importorskip(
    "safetensors.torch",
    reason="the safetensors package is absent (scripts/install-deps.sh pins and installs it)")

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int32, torch.int64,
          torch.bool]


def _sample(dt, shape, seed):
    g = torch.Generator().manual_seed(seed)
    if dt == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dt.is_floating_point:
        return (torch.randn(shape, generator=g, dtype=torch.float64) * 100).to(dt)
    return torch.randint(-2**30, 2**30, shape, generator=g, dtype=dt)


def _tensors():
    shapes = [(3, 4), (5,), (), (2, 0, 3), (2, 3, 2)]
    return {f"layer.{i}.{str(dt).split('.')[-1]}": _sample(dt, shapes[i % len(shapes)], i)
            for i, dt in enumerate(DTYPES)}


def test_loom_writes_what_safetensors_reads(tmp_path):
    want = _tensors()
    path = tmp_path / "loom.safetensors"
    loom.save_safetensors({k: from_torch(v) for k, v in want.items()}, path,
                          metadata={"format": "pt", "note": "héllo \"quoted\""})
    got = st_torch.load_file(str(path))
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
        assert torch.equal(got[k], v), k
    from safetensors import safe_open
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() == {"format": "pt", "note": "héllo \"quoted\""}


def test_safetensors_writes_what_loom_reads(tmp_path):
    want = _tensors()
    path = tmp_path / "st.safetensors"
    st_torch.save_file(want, str(path), metadata={"epoch": "3", "name": "ünïcode"})
    got = loom.load_safetensors(str(path))
    assert isinstance(got, dict) and sorted(got) == sorted(want)
    for k, v in want.items():
        assert isinstance(got[k], loom.Tensor)
        assert L2T[got[k].dtype] == v.dtype and tuple(got[k].shape) == tuple(v.shape), k
        assert torch.equal(to_torch(got[k]), v), k
    assert loom.load_safetensors_metadata(path) == {"epoch": "3", "name": "ünïcode"}


def test_no_metadata_and_a_pending_tensor(tmp_path):
    path = tmp_path / "m.safetensors"
    a = loom.arange(6, dtype=loom.float32).reshape(2, 3) * 2  # pending: saving materializes it
    loom.save_safetensors({"a": a}, path)
    assert loom.load_safetensors_metadata(path) == {}
    header_len = struct.unpack("<Q", path.read_bytes()[:8])[0]
    header = json.loads(path.read_bytes()[8:8 + header_len])
    assert header["a"]["dtype"] == "F32" and header["a"]["shape"] == [2, 3]
    np.testing.assert_array_equal(st_torch.load_file(str(path))["a"].numpy(),
                                  np.arange(6, dtype=np.float32).reshape(2, 3) * 2)


def test_a_module_state_dict_round_trips(tmp_path):
    import loom.nn as nn
    model = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3))
    path = tmp_path / "model.safetensors"
    loom.save_safetensors(model.state_dict(), path)
    other = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3))
    other.load_state_dict(loom.load_safetensors(path))
    for (k, v), (k2, v2) in zip(model.state_dict().items(), other.state_dict().items()):
        assert k == k2
        np.testing.assert_array_equal(v.numpy(), v2.numpy())
    # and torch's module of the same shape loads the file
    tm = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    tm.load_state_dict(st_torch.load_file(str(path)))
    np.testing.assert_array_equal(tm[0].weight.detach().numpy(), model[0].weight.numpy())


def test_bad_arguments(tmp_path):
    with pytest.raises(TypeError, match="'state_dict'"):
        loom.save_safetensors([loom.ones(2)], tmp_path / "x")
    with pytest.raises(TypeError, match="'state_dict'.*'w'.*ndarray"):
        loom.save_safetensors({"w": np.ones(2)}, tmp_path / "x")
    with pytest.raises(TypeError, match="'metadata'"):
        loom.save_safetensors({"w": loom.ones(2)}, tmp_path / "x", metadata={"k": 1})
    with pytest.raises(TypeError, match="'path'"):
        loom.load_safetensors(3.5)
    with pytest.raises(loom.Error, match="missing.safetensors"):
        loom.load_safetensors(tmp_path / "missing.safetensors")
    bad = tmp_path / "u8.safetensors"
    st_torch.save_file({"x": torch.zeros(3, dtype=torch.uint8)}, str(bad))
    with pytest.raises(loom.Error, match="U8"):
        loom.load_safetensors(bad)
