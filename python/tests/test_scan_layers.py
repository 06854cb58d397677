"""scan_layers over Python-defined layers against the same layers in a for loop (forward and
every layer's gradients), its homogeneity errors, and is_layer_pure's single trace."""
import numpy as np
import pytest

import loom
import loom.nn as nn

forward_calls = {"n": 0}


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.linear = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        forward_calls["n"] += 1
        return self.norm(nn.functional.gelu(self.linear(x))) + x


def build(n, dim=8, seed=0):
    loom.manual_seed(seed)
    return nn.ModuleList([Block(dim) for _ in range(n)])


def run(layers, x_np, scan, **kw):
    for p in layers.parameters():
        p.grad = None
    x = loom.tensor(x_np, requires_grad=True)
    if scan:
        y = loom.scan_layers(layers, x, **kw)
    else:
        y = x
        for layer in layers:
            y = layer(y)
    (y * y).sum().backward()
    return (y.numpy().copy(), x.grad.numpy().copy(),
            {n: p.grad.numpy().copy() for n, p in layers.named_parameters()})


@pytest.mark.parametrize("n", [6, 24])
@pytest.mark.parametrize("remat", [False, True])
def test_scan_layers_equals_for_loop(n, remat):
    layers = build(n)
    x_np = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    y0, gx0, g0 = run(layers, x_np, False)
    y1, gx1, g1 = run(layers, x_np, True, remat=remat)
    np.testing.assert_allclose(y1, y0, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gx1, gx0, rtol=1e-4, atol=1e-4)
    assert set(g1) == set(g0) and len(g0) == 4 * n  # every layer's every parameter
    for name in g0:
        np.testing.assert_allclose(g1[name], g0[name], rtol=1e-3, atol=1e-4, err_msg=name)


@pytest.mark.parametrize("pure", [True, False])
def test_the_first_layer_is_traced_once_per_call_whatever_the_depth(pure):
    for n in (6, 24):
        layers = build(n)
        x = loom.randn(3, 8)
        forward_calls["n"] = 0
        for _ in range(2):
            loom.scan_layers(layers, x, is_layer_pure=pure).tolist()
        assert forward_calls["n"] == 2  # once per call, never once per layer
        loom.reset_metrics()
        loom.scan_layers(layers, x, is_layer_pure=pure).tolist()
        m = loom.metrics()
        assert m.bodies_traced == 1 and m.compiles == 0 and m.cache_hits >= 1


def test_scan_layers_mismatch_errors():
    layers = build(3)
    layers.append(Block(4))
    with pytest.raises(loom.ShapeError, match=r"layer 3's parameter 'linear.weight'"):
        loom.scan_layers(layers, loom.randn(3, 8))
    mixed = nn.ModuleList([Block(8), nn.Linear(8, 8)])
    with pytest.raises(TypeError, match="layer 1 is a Linear"):
        loom.scan_layers(mixed, loom.randn(3, 8))
    extra = build(2)
    extra[1].register_buffer("scale", loom.ones(1))
    with pytest.raises(loom.ShapeError, match="layer 1 .*buffers"):
        loom.scan_layers(extra, loom.randn(3, 8))
    assert loom.scan_layers(nn.ModuleList([]), loom.ones(2)).tolist() == [1.0, 1.0]
