"""loom.nn against torch.nn 1.13: every layer's forward and parameter gradients with the same
parameters, state_dict keys and shapes, loading torch's state_dict, Module semantics,
functional_call and loom.nn.functional."""
import collections
import math

import numpy as np
import pytest
import torch

import loom
import loom.nn as nn
import loom.nn.functional as F
from conftest import assert_same, from_torch

TOL64 = 1e-10


def copy_params(lm, tm):
    """torch module tm's parameters into loom module lm (through numpy), by name."""
    names = [k for k, _ in lm.named_parameters()]
    assert names == [k for k, _ in tm.named_parameters()]
    with loom.no_grad():
        for k, p in tm.named_parameters():
            lm.get_parameter(k).copy_(from_torch(p.detach()))


def check_layer(lm, tm, *inputs, tol=TOL64, grad_inputs=True):
    """Forward, the gradient of sum(out * r) for every parameter and floating input."""
    copy_params(lm, tm)
    t_in = [x.clone().requires_grad_(x.dtype.is_floating_point and grad_inputs) for x in inputs]
    l_in = [from_torch(x) for x in inputs]
    for lx, tx in zip(l_in, t_in):
        if tx.requires_grad:
            lx.requires_grad_()
    t_out = tm(*t_in)
    l_out = lm(*l_in)
    assert_same(l_out, t_out.detach(), tol=tol)
    r = torch.from_numpy(np.random.default_rng(0).standard_normal(t_out.shape)).to(t_out.dtype)
    (t_out * r).sum().backward()
    (l_out * from_torch(r)).sum().backward()
    for (k, tp), (k2, lp) in zip(tm.named_parameters(), lm.named_parameters()):
        assert k == k2
        assert lp.grad is not None, k
        assert_same(lp.grad, tp.grad, tol=tol)
    for lx, tx in zip(l_in, t_in):
        if tx.requires_grad:
            assert_same(lx.grad, tx.grad, tol=tol)


def randn(*shape, seed=0, dtype=torch.float64):
    return torch.from_numpy(np.random.default_rng(seed).standard_normal(shape)).to(dtype)


# ---- layers -------------------------------------------------------------------------------

@pytest.mark.parametrize("bias", [True, False])
def test_linear(bias):
    check_layer(nn.Linear(5, 3, bias=bias).double(), torch.nn.Linear(5, 3, bias=bias).double(),
                randn(2, 4, 5))


def test_linear_float32():
    check_layer(nn.Linear(6, 2), torch.nn.Linear(6, 2), randn(3, 6, dtype=torch.float32),
                tol=1e-5)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(approximate):
    check_layer(nn.GELU(approximate), torch.nn.GELU(approximate), randn(3, 7) * 3)


def test_relu_silu_tanh_sigmoid():
    x = randn(4, 5) * 2
    for lm, tm in [(nn.ReLU(), torch.nn.ReLU()), (nn.SiLU(), torch.nn.SiLU()),
                   (nn.Tanh(), torch.nn.Tanh()), (nn.Sigmoid(), torch.nn.Sigmoid())]:
        check_layer(lm, tm, x)


@pytest.mark.parametrize("shape,affine", [((6,), True), ((3, 4), True), ((4,), False)])
def test_layer_norm(shape, affine):
    tm = torch.nn.LayerNorm(shape, eps=1e-4, elementwise_affine=affine).double()
    if affine:  # not the ones/zeros of the init, so that the gradients say something
        with torch.no_grad():
            tm.weight.copy_(randn(*shape, seed=1))
            tm.bias.copy_(randn(*shape, seed=2))
    check_layer(nn.LayerNorm(shape, eps=1e-4, elementwise_affine=affine).double(), tm,
                randn(2, 3, 4) if len(shape) == 2 else randn(2, 5, shape[0]))


class TorchRMSNorm(torch.nn.Module):
    """torch 2.4's nn.RMSNorm, written out (torch 1.13 lacks it)."""

    def __init__(self, dim, eps=None):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x):
        eps = torch.finfo(x.dtype).eps if self.eps is None else self.eps
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * self.weight


@pytest.mark.parametrize("eps", [None, 1e-3])
def test_rms_norm(eps):
    tm = TorchRMSNorm(8, eps).double()
    with torch.no_grad():
        tm.weight.copy_(randn(8, seed=4))
    check_layer(nn.RMSNorm(8, eps=eps).double(), tm, randn(3, 2, 8) * 0.1)


def test_embedding():
    tm = torch.nn.Embedding(10, 4).double()
    lm = nn.Embedding(10, 4).double()
    idx = torch.tensor([[1, 3, 3], [9, 0, 1]])
    check_layer(lm, tm, idx)


@pytest.mark.parametrize("padding_idx", [3, -7])
def test_embedding_padding_idx(padding_idx):
    """torch's padding_idx: the row starts at zero and its gradient stays zero."""
    lm = nn.Embedding(10, 4, padding_idx=padding_idx).double()
    assert lm.padding_idx == 3
    assert not lm.weight.numpy()[3].any() and lm.weight.numpy()[4].any()
    tm = torch.nn.Embedding(10, 4, padding_idx=padding_idx).double()
    with torch.no_grad():
        tm.weight[3] = 0.5  # a non-zero padding row: forward reads it, backward skips it
    idx = torch.tensor([[1, 3, 3], [9, 0, 3]])
    check_layer(lm, tm, idx)
    assert not lm.weight.grad.numpy()[3].any()
    assert repr(lm) == "Embedding(10, 4, padding_idx=3)"
    with pytest.raises(loom.ShapeError, match="padding_idx 10 must be within num_embeddings 10"):
        nn.Embedding(10, 4, padding_idx=10)
    with pytest.raises(TypeError, match="padding_idx"):
        F.embedding(from_torch(idx), lm.weight, padding_idx=1.0)


def test_dropout():
    x = randn(200, 50, dtype=torch.float32) + 3.0  # no zeros in x
    d = nn.Dropout(0.25)
    assert d.training
    lx = from_torch(x).requires_grad_()
    y = d(lx)
    y.sum().backward()
    yv, xv = y.numpy(), x.numpy()
    kept = yv != 0
    np.testing.assert_allclose(yv[kept], xv[kept] / 0.75, rtol=1e-6)
    assert abs((~kept).mean() - 0.25) < 0.02  # 10000 Bernoulli(0.25): sd 0.004
    np.testing.assert_allclose(lx.grad.numpy(), kept / 0.75, rtol=1e-6)
    d.eval()
    np.testing.assert_array_equal(d(lx).numpy(), xv)
    with pytest.raises(ValueError, match="between 0 and 1"):
        nn.Dropout(1.5)


class TorchCausalSelfAttention(torch.nn.Module):
    """The C++ nn::CausalSelfAttention's math, in torch."""

    def __init__(self, dim, heads):
        super().__init__()
        self.dim, self.heads = dim, heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        hd = d // self.heads
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, hd).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        return self.proj(y)


def test_causal_self_attention():
    lm = nn.CausalSelfAttention(12, 3).double()
    tm = TorchCausalSelfAttention(12, 3).double()
    assert [(k, tuple(v.shape)) for k, v in lm.state_dict().items()] == \
        [(k, tuple(v.shape)) for k, v in tm.state_dict().items()]
    check_layer(lm, tm, randn(2, 5, 12))
    with pytest.raises(loom.ShapeError, match=r"expected \[batch, seq, 12\]"):
        lm(loom.zeros(2, 5, 8, dtype=loom.float64))
    with pytest.raises(loom.ShapeError, match="not a multiple"):
        nn.CausalSelfAttention(10, 3)


# ---- models: names, state dicts -----------------------------------------------------------

def make_model(lib):
    """The same model in torch.nn and loom.nn."""
    class Block(lib.Module):
        def __init__(self, dim):
            super().__init__()
            self.norm = lib.LayerNorm(dim)
            self.fc = lib.Linear(dim, 2 * dim)
            self.act = lib.GELU()
            self.out = lib.Linear(2 * dim, dim, bias=False)
            self.register_buffer("scale", lib_ones(lib, dim) * 0.5)
            self.register_buffer("cache", lib_ones(lib, 2), persistent=False)

        def forward(self, x):
            return x + self.out(self.act(self.fc(self.norm(x)))) * self.scale

    class Model(lib.Module):
        def __init__(self):
            super().__init__()
            self.embed = lib.Embedding(11, 6)
            self.blocks = lib.ModuleList([Block(6) for _ in range(2)])
            self.head = lib.Sequential(lib.LayerNorm(6), lib.Linear(6, 11))
            self.heads = lib.ModuleDict({"aux": lib.Linear(6, 2)})

        def forward(self, idx):
            h = self.embed(idx)
            for b in self.blocks:
                h = b(h)
            return self.head(h), self.heads["aux"](h)

    return Model()


def lib_ones(lib, n):
    return torch.ones(n) if lib is torch.nn else loom.ones(n)


def test_state_dict_keys_and_shapes_equal_torchs():
    tm, lm = make_model(torch.nn), make_model(nn)
    tsd, lsd = tm.state_dict(), lm.state_dict()
    assert list(lsd) == list(tsd)
    assert [tuple(v.shape) for v in lsd.values()] == [tuple(v.shape) for v in tsd.values()]
    assert isinstance(lsd, collections.OrderedDict)
    assert [k for k, _ in lm.named_parameters()] == [k for k, _ in tm.named_parameters()]
    assert [k for k, _ in lm.named_buffers()] == [k for k, _ in tm.named_buffers()]
    assert [k for k, _ in lm.named_modules()] == [k for k, _ in tm.named_modules()]
    assert [k for k, _ in lm.named_children()] == [k for k, _ in tm.named_children()]
    assert len(list(lm.modules())) == len(list(tm.modules()))
    assert len(list(lm.children())) == 4
    assert len(list(lm.parameters())) == len(list(tm.parameters()))


def test_load_torch_state_dict_gives_torchs_outputs():
    tm, lm = make_model(torch.nn).double(), make_model(nn).double()
    for k, v in tm.state_dict().items():  # not the init's ones/zeros
        with torch.no_grad():
            v.copy_(randn(*v.shape, seed=len(k)))
    res = lm.load_state_dict(tm.state_dict())  # torch tensors go in through DLPack
    assert res.missing_keys == [] and res.unexpected_keys == []
    idx = torch.tensor([[0, 5, 10, 3], [2, 2, 7, 1]])
    t_logits, t_aux = tm(idx)
    l_logits, l_aux = lm(from_torch(idx))
    assert_same(l_logits, t_logits.detach(), tol=TOL64)
    assert_same(l_aux, t_aux.detach(), tol=TOL64)
    # numpy arrays too, and loom's own state dict round trip
    lm2 = make_model(nn).double()
    lm2.load_state_dict({k: v.numpy() for k, v in tm.state_dict().items()})
    assert_same(lm2(from_torch(idx))[0], t_logits.detach(), tol=TOL64)
    lm3 = make_model(nn).double()
    lm3.load_state_dict(lm.state_dict())
    assert_same(lm3(from_torch(idx))[1], t_aux.detach(), tol=TOL64)


def torch_error(fn):
    with pytest.raises(RuntimeError) as e:
        fn()
    return str(e.value)


def test_load_state_dict_errors_read_as_torchs():
    tm = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    lm = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3))
    sd = tm.state_dict()
    del sd["0.bias"]
    sd["extra.weight"] = torch.zeros(2)
    want = torch_error(lambda: tm.load_state_dict(sd))
    with pytest.raises(loom.Error) as e:
        lm.load_state_dict(sd)
    assert str(e.value) == want
    # strict=False: the keys come back, nothing raises
    r = lm.load_state_dict(sd, strict=False)
    assert r.missing_keys == ["0.bias"] and r.unexpected_keys == ["extra.weight"]
    tr = tm.load_state_dict(sd, strict=False)
    assert r.missing_keys == tr.missing_keys and r.unexpected_keys == tr.unexpected_keys
    # a shape mismatch: a loom.ShapeError (a RuntimeError and a ValueError), torch's words
    sd = tm.state_dict()
    sd["0.weight"] = torch.zeros(3, 5)
    want = torch_error(lambda: tm.load_state_dict(sd)).replace("torch.Size", "loom.Size")
    with pytest.raises(loom.ShapeError) as e:
        lm.load_state_dict(sd)
    assert str(e.value) == want
    with pytest.raises(loom.ShapeError):
        lm.load_state_dict(sd, strict=False)
    with pytest.raises(TypeError, match="dict-like"):
        lm.load_state_dict([1, 2])


def test_module_registration():
    m = nn.Module()
    m.w = nn.Parameter(loom.ones(2))
    m.sub = nn.Linear(2, 2)
    m.register_buffer("b", loom.zeros(3))
    m.plain = loom.ones(1)  # a plain tensor attribute: neither parameter nor buffer
    assert [k for k, _ in m.named_parameters()] == ["w", "sub.weight", "sub.bias"]
    assert [k for k, _ in m.named_buffers()] == ["b"]
    assert list(m.state_dict()) == ["w", "b", "sub.weight", "sub.bias"]
    m.b = loom.full((3,), 2.0)  # a tensor assigned to a buffer's name stays a buffer
    assert m._buffers["b"] is m.b
    with pytest.raises(TypeError, match="as parameter 'w'"):
        m.w = loom.ones(2)
    with pytest.raises(TypeError, match="as child module 'sub'"):
        m.sub = 3
    with pytest.raises(TypeError, match="as buffer 'b'"):
        m.b = 3
    m.w = None
    assert [k for k, _ in m.named_parameters()] == ["sub.weight", "sub.bias"]
    del m.sub
    assert not hasattr(m, "sub")
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        m.nope
    with pytest.raises(KeyError, match="contain"):
        m.register_buffer("a.b", loom.ones(1))
    with pytest.raises(TypeError, match="loom.nn.Parameter or None"):
        m.register_parameter("q", loom.ones(1))

    class Early(nn.Module):
        def __init__(self):
            self.x = nn.Linear(1, 1)  # before super().__init__()

    with pytest.raises(AttributeError, match="before Module.__init__"):
        Early()
    # a module used twice is listed once, as in torch
    shared = nn.Linear(2, 2)
    s = nn.Sequential(shared, shared)
    assert len(list(s.parameters())) == 2 and len(list(s.modules())) == 2
    assert list(s.state_dict()) == ["0.weight", "0.bias", "1.weight", "1.bias"]


def test_parameter():
    t = loom.arange(4, dtype=loom.float32)
    p = nn.Parameter(t)
    assert isinstance(p, loom.Tensor) and isinstance(p, nn.Parameter)
    assert p.requires_grad and not t.requires_grad
    np.testing.assert_array_equal(p.numpy(), t.numpy())
    assert repr(p).startswith("Parameter containing:\ntensor(")
    assert not nn.Parameter(t, requires_grad=False).requires_grad
    assert not isinstance(p * 2, nn.Parameter)  # ops give plain tensors
    with loom.no_grad():
        p.copy_(loom.ones(4))
    np.testing.assert_array_equal(p.numpy(), np.ones(4, np.float32))
    with pytest.raises(TypeError, match="'data'"):
        nn.Parameter(np.ones(3))


def test_train_eval_zero_grad_requires_grad():
    m = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5), nn.Sequential(nn.Dropout()))
    assert m.eval() is m
    assert all(not x.training for x in m.modules())
    m.train()
    assert all(x.training for x in m.modules())
    m(loom.randn(2, 3)).sum().backward()
    assert m[0].weight.grad is not None
    m.zero_grad()
    assert m[0].weight.grad is None
    # (sync first: the C++ core still reports requires_grad for a pending leaf that a
    # backward has used, after requires_grad_(False); reported to the lead)
    loom.sync()
    m.requires_grad_(False)
    assert not m[0].weight.requires_grad
    with pytest.raises(NotImplementedError, match="forward"):
        nn.Module()(1)


def test_init_distributions():
    loom.manual_seed(0)
    lin = nn.Linear(400, 300)
    w, b = lin.weight.numpy(), lin.bias.numpy()
    bound = 1 / math.sqrt(400)
    assert w.dtype == np.float32 and w.shape == (300, 400) and b.shape == (300,)
    assert np.abs(w).max() <= bound and np.abs(b).max() <= bound
    # U(-a, a): mean 0, sd a / sqrt(3) (120000 draws: the sd of the mean is 4e-5)
    assert abs(w.mean()) < 5 * bound / math.sqrt(3) / math.sqrt(w.size)
    assert abs(w.std() / (bound / math.sqrt(3)) - 1) < 0.01
    e = nn.Embedding(1000, 64).weight.numpy()
    assert abs(e.mean()) < 0.01 and abs(e.std() - 1) < 0.01
    ln = nn.LayerNorm(5)
    np.testing.assert_array_equal(ln.weight.numpy(), np.ones(5, np.float32))
    np.testing.assert_array_equal(ln.bias.numpy(), np.zeros(5, np.float32))
    np.testing.assert_array_equal(nn.RMSNorm(5).weight.numpy(), np.ones(5, np.float32))
    assert all(p.requires_grad for p in lin.parameters())


def test_constructor_type_errors():
    with pytest.raises(TypeError, match="'in_features'"):
        nn.Linear(4.0, 3)
    with pytest.raises(TypeError, match="'dtype'"):
        nn.Linear(4, 3, dtype=loom.int64)
    with pytest.raises(TypeError, match="'embedding_dim'"):
        nn.Embedding(4, "3")
    with pytest.raises(TypeError, match="'input'"):
        F.linear(np.ones((2, 3)), loom.ones(3, 3))
    with pytest.raises(TypeError, match="'module'"):
        nn.functional_call(lambda x: x, {}, (loom.ones(1),))


def test_containers():
    ml = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])
    assert len(ml) == 3 and ml[-1] is ml[2]
    ml.append(nn.ReLU())
    assert [k for k, _ in ml.named_children()] == ["0", "1", "2", "3"]
    del ml[1]
    assert [k for k, _ in ml.named_children()] == ["0", "1", "2"]
    assert len(ml[:2]) == 2
    seq = nn.Sequential(collections.OrderedDict([("fc", nn.Linear(3, 4)), ("act", nn.ReLU())]))
    assert [k for k, _ in seq.named_parameters()] == ["fc.weight", "fc.bias"]
    assert seq[0] is seq.fc and isinstance(seq[:1], nn.Sequential)
    md = nn.ModuleDict({"a": nn.Linear(1, 1)})
    md["b"] = nn.ReLU()
    assert list(md) == ["a", "b"] and "a" in md and len(md) == 2


def test_linear_forward_is_a_few_traced_ops():
    lin = nn.Linear(8, 4)
    x = loom.randn(3, 8)
    loom.sync()
    loom.reset_metrics()
    y = lin(x)
    loom.sync()
    assert loom.metrics().ops_traced == 3  # transpose, matmul, add
    mlp = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 4))
    loom.sync()
    loom.reset_metrics()
    mlp(x)
    loom.sync()
    gelu_ops = loom.metrics().ops_traced - 6
    loom.reset_metrics()
    loom.gelu(x)
    loom.sync()
    assert gelu_ops == loom.metrics().ops_traced  # the module path adds no op of its own
    del y


# ---- functional_call ----------------------------------------------------------------------

def test_functional_call_swaps_and_restores():
    m = nn.Sequential(nn.Linear(3, 2), nn.LayerNorm(2))
    m[1].register_buffer("shift", loom.zeros(2))
    orig = m[1].forward
    x = loom.randn(4, 3)
    w, b = loom.randn(2, 3), loom.randn(2)
    got = nn.functional_call(m, {"0.weight": w, "0.bias": b}, (x,))
    want = m[1](x @ w.T + b)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)
    assert isinstance(m[0].weight, nn.Parameter) and m[0].weight is m._modules["0"].weight
    # a tuple of dicts (params, buffers), a single tensor as args, kwargs
    got2 = nn.functional_call(m, ({"0.weight": w}, {"1.shift": loom.ones(2)}), x)
    assert got2.shape == (4, 2)
    with pytest.raises(ValueError, match="multiple dictionaries"):
        nn.functional_call(m, ({"0.weight": w}, {"0.weight": w}), (x,))
    with pytest.raises(loom.Error, match="no parameter or buffer named '0.nope'"):
        nn.functional_call(m, {"0.nope": w}, (x,))
    with pytest.raises(loom.Error, match="missing"):
        nn.functional_call(m, {"0.weight": w}, (x,), strict=True)

    before = m[0].weight

    def boom(_):
        assert m[0].weight is w
        raise KeyError("inside")

    m[1].forward = boom
    with pytest.raises(KeyError, match="inside"):
        nn.functional_call(m, {"0.weight": w}, (x,))
    m[1].forward = orig
    assert m[0].weight is before


def test_functional_call_gradients_and_tied_weights():
    torch_lin = torch.nn.Linear(3, 2).double()
    m = nn.Linear(3, 2).double()
    x = randn(5, 3)
    params = {k: from_torch(v.detach()) for k, v in torch_lin.named_parameters()}

    def loss(p, x):
        return (nn.functional_call(m, p, (x,)) ** 2).sum()

    g = loom.grad(loss)(params, from_torch(x))
    (torch_lin(x) ** 2).sum().backward()
    assert_same(g["weight"], torch_lin.weight.grad, tol=TOL64)
    assert_same(g["bias"], torch_lin.bias.grad, tol=TOL64)
    # tied: one Parameter under two names is replaced under both
    emb = nn.Embedding(4, 3)
    head = nn.Linear(3, 4, bias=False)
    head.weight = emb.weight
    tied = nn.Sequential(emb, head)
    assert [k for k, _ in tied.named_parameters()] == ["0.weight"]
    new = loom.randn(4, 3)
    idx = loom.tensor([1, 2])
    got = nn.functional_call(tied, {"0.weight": new}, (idx,))
    want = new[idx] @ new.T
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)


# ---- functional ---------------------------------------------------------------------------

@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy(reduction):
    logits = randn(6, 5).requires_grad_()
    target = torch.tensor([0, 4, -100, 2, 2, 1])
    kw = dict(reduction=reduction, ignore_index=-100)
    for ls in (0.0, 0.1):
        logits.grad = None
        want = torch.nn.functional.cross_entropy(logits, target, label_smoothing=ls, **kw)
        ll = from_torch(logits.detach()).requires_grad_()
        got = F.cross_entropy(ll, from_torch(target), label_smoothing=ls, **kw)
        assert_same(got, want.detach(), tol=TOL64)
        want.sum().backward()
        got.sum().backward()
        assert_same(ll.grad, logits.grad, tol=TOL64)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_class_weights(reduction):
    logits = randn(6, 5).requires_grad_()
    target = torch.tensor([0, 4, -100, 2, 2, 1])
    weight = torch.tensor([0.5, 2.0, 1.0, 3.0, 0.25], dtype=torch.float64)
    for ls in (0.0, 0.2):
        logits.grad = None
        want = torch.nn.functional.cross_entropy(logits, target, weight=weight,
                                                 reduction=reduction, label_smoothing=ls)
        ll = from_torch(logits.detach()).requires_grad_()
        got = F.cross_entropy(ll, from_torch(target), weight=from_torch(weight),
                              reduction=reduction, label_smoothing=ls)
        assert_same(got, want.detach(), tol=TOL64)
        want.sum().backward()
        got.sum().backward()
        assert_same(ll.grad, logits.grad, tol=TOL64)
    probs = torch.softmax(randn(6, 5, seed=3), -1)
    want = torch.nn.functional.cross_entropy(logits.detach(), probs, weight=weight,
                                             reduction=reduction)
    got = F.cross_entropy(from_torch(logits.detach()), from_torch(probs),
                          weight=from_torch(weight), reduction=reduction)
    assert_same(got, want, tol=TOL64)
    spatial = randn(2, 5, 3)
    st = torch.from_numpy(np.random.default_rng(2).integers(0, 5, (2, 3)))
    want = torch.nn.functional.cross_entropy(spatial, st, weight=weight, reduction=reduction)
    got = F.cross_entropy(from_torch(spatial), from_torch(st), weight=from_torch(weight),
                          reduction=reduction)
    assert_same(got, want, tol=TOL64)
    loss = nn.CrossEntropyLoss(weight=from_torch(weight), reduction=reduction)
    tloss = torch.nn.CrossEntropyLoss(weight=weight, reduction=reduction)
    assert_same(loss(from_torch(logits.detach()), from_torch(target)),
                tloss(logits, target).detach(), tol=TOL64)
    assert list(loss.state_dict()) == list(tloss.state_dict()) == ["weight"]
    for lm, tm in ((nn.MSELoss(reduction=reduction), torch.nn.MSELoss(reduction=reduction)),
                   (nn.L1Loss(reduction=reduction), torch.nn.L1Loss(reduction=reduction))):
        a, b = randn(3, 4, seed=5), randn(3, 4, seed=6)
        assert_same(lm(from_torch(a), from_torch(b)), tm(a, b), tol=TOL64)
    logp = torch.log_softmax(logits.detach(), -1)
    assert_same(nn.NLLLoss(reduction=reduction)(from_torch(logp), from_torch(target)),
                torch.nn.NLLLoss(reduction=reduction)(logp, target), tol=TOL64)


def test_cross_entropy_weight_errors_and_legacy_flags():
    logits, target = randn(4, 3), torch.tensor([0, 2, 1, 1])
    lg, lt = from_torch(logits), from_torch(target)
    with pytest.raises(loom.ShapeError, match=r"weight must be a floating tensor of shape \[3\]"):
        F.cross_entropy(lg, lt, weight=loom.ones(4, dtype=loom.float64))
    with pytest.raises(TypeError, match="'weight' must be a loom.Tensor"):
        F.cross_entropy(lg, lt, weight=[1.0, 1.0, 1.0])
    for size_average, reduce in ((False, None), (None, False), (True, True), (False, True)):
        with pytest.warns(UserWarning):  # torch warns that the flags are deprecated
            want = torch.nn.functional.cross_entropy(logits, target, size_average=size_average,
                                                     reduce=reduce)
        got = F.cross_entropy(lg, lt, size_average=size_average, reduce=reduce)
        assert_same(got, want, tol=TOL64)


def test_cross_entropy_spatial_and_probabilities():
    logits = randn(2, 4, 3, 5)
    target = torch.from_numpy(np.random.default_rng(1).integers(0, 4, (2, 3, 5)))
    for red in ("mean", "none", "sum"):
        want = torch.nn.functional.cross_entropy(logits, target, reduction=red)
        assert_same(F.cross_entropy(from_torch(logits), from_torch(target), reduction=red), want,
                    tol=TOL64)
    probs = torch.softmax(randn(6, 5, seed=3), -1)
    lg = randn(6, 5, seed=4)
    for red in ("mean", "sum"):
        want = torch.nn.functional.cross_entropy(lg, probs, reduction=red)
        assert_same(F.cross_entropy(from_torch(lg), from_torch(probs), reduction=red), want,
                    tol=TOL64)
    with pytest.raises(ValueError, match="reduction"):
        F.cross_entropy(from_torch(lg), from_torch(probs), reduction="avg")


def test_functional_ops():
    x = randn(3, 4, 5)
    lx = from_torch(x)
    tf = torch.nn.functional
    w, b = randn(6, 5, seed=1), randn(6, seed=2)
    assert_same(F.linear(lx, from_torch(w), from_torch(b)), tf.linear(x, w, b), tol=TOL64)
    assert_same(F.linear(lx, from_torch(w)), tf.linear(x, w), tol=TOL64)
    for dim in (0, -1):
        assert_same(F.softmax(lx, dim), tf.softmax(x, dim), tol=TOL64)
        assert_same(F.log_softmax(lx, dim), tf.log_softmax(x, dim), tol=TOL64)
    assert_same(F.softmax(lx, -1, dtype=loom.float32), tf.softmax(x, -1, dtype=torch.float32),
                tol=1e-6)
    assert_same(F.gelu(lx), tf.gelu(x), tol=TOL64)
    assert_same(F.gelu(lx, approximate="tanh"), tf.gelu(x, approximate="tanh"), tol=TOL64)
    assert_same(F.relu(lx), tf.relu(x))
    assert_same(F.silu(lx), tf.silu(x), tol=TOL64)
    lw, lb = randn(4, 5, seed=5), randn(4, 5, seed=6)
    assert_same(F.layer_norm(lx, (4, 5), from_torch(lw), from_torch(lb)),
                tf.layer_norm(x, (4, 5), lw, lb), tol=TOL64)
    assert_same(F.layer_norm(lx, 5), tf.layer_norm(x, (5,)), tol=TOL64)
    want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * lw[0]
    assert_same(F.rms_norm(lx, [5], from_torch(lw[0]), eps=1e-6), want, tol=TOL64)
    y = randn(3, 4, 5, seed=7)
    for red in ("mean", "sum", "none"):
        assert_same(F.mse_loss(lx, from_torch(y), reduction=red),
                    tf.mse_loss(x, y, reduction=red), tol=TOL64)
        assert_same(F.l1_loss(lx, from_torch(y), reduction=red),
                    tf.l1_loss(x, y, reduction=red), tol=TOL64)
    emb = randn(7, 3)
    idx = torch.tensor([[0, 6], [3, 3]])
    assert_same(F.embedding(from_torch(idx), from_torch(emb)), tf.embedding(idx, emb))
    logp = torch.log_softmax(randn(4, 3), -1)
    t = torch.tensor([2, 0, -100, 1])
    assert_same(F.nll_loss(from_torch(logp), from_torch(t)), tf.nll_loss(logp, t), tol=TOL64)
    assert_same(F.dropout(lx, 0.3, training=False), x)
    with pytest.raises(ValueError, match="between 0 and 1"):
        F.dropout(lx, -0.1)
    with pytest.raises(loom.ShapeError, match="mse_loss"):
        F.mse_loss(lx, loom.ones(2))
