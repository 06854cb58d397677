"""loom.nn.functional.scaled_dot_product_attention against torch: torch 1.13's composite
(softmax(q k^T * scale + mask) v, written here in torch), and torch 2.x's own
F.scaled_dot_product_attention where this torch has it. Values in float32/float64/bfloat16,
gradients of q, k, v and an additive mask through torch's autograd, and bad input."""
import math

import pytest
import torch

import loom
import loom.nn.functional as F
from conftest import from_torch, to_torch

HAS_TORCH_SDPA = hasattr(torch.nn.functional, "scaled_dot_product_attention")


def torch_composite(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    """The definition, in torch; a row without keys gives zeros (torch >= 2.5)."""
    L, S = q.shape[-2], k.shape[-2]
    if enable_gqa and q.dim() >= 3 and q.shape[-3] != k.shape[-3]:
        g = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(g, dim=-3), v.repeat_interleave(g, dim=-3)
    s = q @ k.transpose(-2, -1) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if is_causal:  # with a mask, both apply (torch's CPU kernels take the pair)
        tril = torch.ones(L, S, dtype=torch.bool).tril()
        if attn_mask is None:
            attn_mask = tril
        elif attn_mask.dtype == torch.bool:
            attn_mask = attn_mask & tril
        else:
            attn_mask = attn_mask.masked_fill(~tril, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            s = s.masked_fill(~attn_mask, float("-inf"))
        else:
            s = s + attn_mask
    w = torch.softmax(s, -1)
    w = torch.where(torch.isnan(w), torch.zeros_like(w), w)
    return w @ v


CASES = [  # q shape, k shape, v shape, mask kind, causal, gqa
    ((2, 3, 5, 8), (2, 3, 5, 8), (2, 3, 5, 8), None, False, False),
    ((2, 3, 4, 8), (2, 3, 9, 8), (2, 3, 9, 6), None, True, False),  # causal, L < S
    ((1, 2, 9, 4), (1, 2, 4, 4), (1, 2, 4, 4), None, True, False),  # causal, L > S
    ((2, 4, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8), None, False, True),  # grouped heads
    ((2, 2, 6, 4), (2, 2, 6, 4), (2, 2, 6, 4), "bool", False, False),
    ((2, 2, 6, 4), (2, 2, 7, 4), (2, 2, 7, 3), "float", False, False),
    ((3, 1, 8), (3, 7, 8), (3, 7, 5), "bool_batched", False, False),  # T = 1, 3-d
    ((2, 2, 17, 16), (2, 2, 33, 16), (2, 2, 33, 16), None, True, False),  # odd sizes
    ((5, 3), (7, 3), (7, 2), "float", False, False),  # 2-d
    ((2, 2, 6, 4), (2, 2, 6, 4), (2, 2, 6, 4), "bool", True, False),  # a mask and causal
    ((2, 2, 5, 4), (2, 2, 7, 4), (2, 2, 7, 3), "float", True, False),
    # Across the CPU kernel's blocks (64, 128 and 256 rows and keys) with partial last blocks:
    ((1, 2, 300, 16), (1, 2, 300, 16), (1, 2, 300, 16), None, True, False),  # causal
    ((1, 2, 200, 8), (1, 2, 333, 8), (1, 2, 333, 8), None, True, False),  # causal, L < S
    ((2, 2, 333, 8), (2, 1, 200, 8), (2, 1, 200, 4), None, True, True),  # causal, L > S, gqa
    ((1, 1, 130, 8), (1, 1, 270, 8), (1, 1, 270, 4), "float", False, False),
]


def make_mask(kind, q, k, dtype, gen):
    L, S = q[-2], k[-2]
    if kind is None:
        return None
    if kind == "bool":  # some rows keep no key at all
        m = torch.rand(L, S, generator=gen) > 0.4
        m[1] = False
        return m
    if kind == "bool_batched":
        return torch.rand(q[0], L, S, generator=gen) > 0.3
    return torch.randn(q[:-2] + (L, S), generator=gen).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_values_match_torch(case, dtype):
    qs, ks, vs, kind, causal, gqa = CASES[case]
    gen = torch.Generator().manual_seed(case)
    q, k, v = (torch.randn(s, generator=gen).to(dtype) for s in (qs, ks, vs))
    mask = make_mask(kind, qs, ks, dtype, gen)
    kw = dict(attn_mask=mask, is_causal=causal, enable_gqa=gqa)
    want = torch_composite(*(t.double() for t in (q, k, v)),
                           attn_mask=None if mask is None else
                           (mask if mask.dtype == torch.bool else mask.double()),
                           is_causal=causal, enable_gqa=gqa)
    got = F.scaled_dot_product_attention(
        from_torch(q), from_torch(k), from_torch(v),
        attn_mask=None if mask is None else from_torch(mask), is_causal=causal, enable_gqa=gqa)
    assert got.dtype == from_torch(q).dtype and tuple(got.shape) == tuple(want.shape)
    tol = {torch.float64: 1e-12, torch.float32: 2e-5, torch.bfloat16: 3e-2}[dtype]
    torch.testing.assert_close(to_torch(got).double(), want, rtol=tol, atol=tol)
    if HAS_TORCH_SDPA and dtype != torch.bfloat16:
        if gqa and "enable_gqa" not in torch.nn.functional.scaled_dot_product_attention.__doc__:
            return
        try:
            theirs = torch.nn.functional.scaled_dot_product_attention(q, k, v, **kw) if gqa \
                else torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                                      is_causal=causal)
        except RuntimeError:  # a mask with is_causal: torch before 2.3's CPU kernels refuse it
            assert mask is not None and causal
            return
        torch.testing.assert_close(to_torch(got), theirs, rtol=tol * 10, atol=tol * 10)


@pytest.mark.parametrize("dtype,case", [(torch.float64, c) for c in (1, 3, 4, 5, 6, 10, 11, 12,
                                                                      13, 14)]
                         + [(torch.float32, c) for c in (11, 12, 13, 14)])
def test_gradients_match_torch_autograd(case, dtype):
    qs, ks, vs, kind, causal, gqa = CASES[case]
    gen = torch.Generator().manual_seed(100 + case)
    ts = [torch.randn(s, generator=gen, dtype=torch.float64) for s in (qs, ks, vs)]
    mask = make_mask(kind, qs, ks, torch.float64, gen)
    leaves = ts + ([mask] if mask is not None and mask.dtype != torch.bool else [])
    for t in leaves:
        t.requires_grad_(True)
    w = torch.randn(torch_composite(*ts, attn_mask=mask, is_causal=causal,
                                    enable_gqa=gqa).shape, generator=gen, dtype=torch.float64)
    (torch_composite(*ts, attn_mask=mask, is_causal=causal, enable_gqa=gqa) * w).sum().backward()
    ls = [from_torch(t.detach().to(dtype)).requires_grad_() for t in leaves]
    lq, lk, lv = ls[:3]
    lmask = ls[3] if len(ls) == 4 else (None if mask is None else from_torch(mask))
    y = F.scaled_dot_product_attention(lq, lk, lv, attn_mask=lmask, is_causal=causal,
                                       enable_gqa=gqa)
    (y * from_torch(w.to(dtype))).sum().backward()
    tol = 1e-10 if dtype == torch.float64 else 2e-4  # float32: inputs rounded, sums over 333 keys
    for lt, t in zip(ls, leaves):
        g = to_torch(lt.grad).double()
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, t.grad, rtol=tol, atol=tol)


def test_a_fully_masked_row_gives_zeros_and_finite_gradients():
    q = loom.randn(1, 4, 3).requires_grad_()
    k = loom.randn(1, 5, 3).requires_grad_()
    v = loom.randn(1, 5, 2).requires_grad_()
    mask = torch.ones(4, 5, dtype=torch.bool)
    mask[2] = False
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=from_torch(mask))
    y.sum().backward()
    assert (to_torch(y)[0, 2] == 0).all()
    for t in (q, k, v):
        assert torch.isfinite(to_torch(t.grad)).all()
    assert (to_torch(q.grad)[0, 2] == 0).all()


def test_scale_and_dropout():
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 4, 6, generator=gen) for _ in range(3))
    got = F.scaled_dot_product_attention(from_torch(q), from_torch(k), from_torch(v), scale=0.3)
    torch.testing.assert_close(to_torch(got), torch_composite(q, k, v, scale=0.3))
    # dropout_p = 1 drops every weight; 0 < p < 1 keeps the expectation (weights / (1 - p)).
    zero = F.scaled_dot_product_attention(from_torch(q), from_torch(k), from_torch(v),
                                          dropout_p=1.0)
    assert (to_torch(zero) == 0).all()
    loom.manual_seed(0)
    ones = loom.ones(1, 1, 2000)
    kk = loom.zeros(1, 2000, 1)  # equal weights 1/2000: the output is the mean of kept v / (1-p)
    out = F.scaled_dot_product_attention(ones[:, :, :1], kk, loom.ones(1, 2000, 1), dropout_p=0.5)
    assert abs(out.item() - 1.0) < 0.1


def test_bad_input_is_a_clear_error():
    q, k, v = loom.randn(2, 4, 8), loom.randn(2, 6, 8), loom.randn(2, 6, 3)
    with pytest.raises(loom.ShapeError, match=r"scaled_dot_product_attention.*f32\[2,6,7\]"):
        F.scaled_dot_product_attention(q, loom.randn(2, 6, 7), v)
    with pytest.raises(loom.DTypeError, match="one floating dtype"):
        F.scaled_dot_product_attention(q, k.double(), v)
    with pytest.raises(loom.ShapeError, match=r"attn_mask bool\[4,5\]"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=loom.ones(4, 5, dtype=loom.bool_))
    with pytest.raises(loom.DTypeError, match="attn_mask must be bool or q's dtype"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=loom.ones(4, 6, dtype=loom.int64))
    with pytest.raises(loom.ShapeError, match="multiple of k's"):
        F.scaled_dot_product_attention(loom.randn(1, 3, 4, 8), loom.randn(1, 2, 6, 8),
                                       loom.randn(1, 2, 6, 8), enable_gqa=True)


def _layer_inputs(gen, layers=3, B=2, H=2, T=70, D=8):
    h = torch.randn(B, H, T, D, generator=gen, dtype=torch.float64)
    ws = torch.randn(layers, 3, D, D, generator=gen, dtype=torch.float64) / math.sqrt(D)
    return h, ws


def _layer(h, w, sdpa):
    """One attention layer: projections of h, causal attention, a residual."""
    return h + sdpa(h @ w[0], h @ w[1], h @ w[2], is_causal=True)


@pytest.mark.parametrize("tool", ["scan", "scan_remat", "fori_loop", "assume_pure", "compile"])
def test_fused_attention_inside_the_tools_equals_the_unrolled_torch_loop(tool):
    """The fused attention op in a scan body (saved and recomputed backward), a fori_loop,
    an assume_pure call and a compiled step: values and every gradient against the same
    layers unrolled in torch."""
    gen = torch.Generator().manual_seed(4)
    h, ws = _layer_inputs(gen)
    th, tws = h.clone().requires_grad_(), ws.clone().requires_grad_()
    y = th
    for k in range(ws.shape[0]):
        y = _layer(y, tws[k], torch_composite)
    (y * y).sum().backward()

    lh, lws = from_torch(h).requires_grad_(), from_torch(ws).requires_grad_()
    sdpa = F.scaled_dot_product_attention
    if tool in ("scan", "scan_remat"):
        out, _ = loom.scan(lambda c, w: (_layer(c, w, sdpa), None), lh, lws,
                           remat=tool == "scan_remat")
    elif tool == "fori_loop":
        out, _ = loom.fori_loop(0, ws.shape[0], lambda i, c, w: (_layer(c, w[i], sdpa), w),
                                lh, lws)
    else:
        def body(c, w):
            for k in range(w.shape[0]):
                c = _layer(c, w[k], sdpa)
            return c
        if tool == "assume_pure":
            out = loom.assume_pure(body)(lh, lws)
        else:  # a compiled step is cut before and after: its backward runs inside
            def step(c, w):
                out = body(c, w)
                (out * out).sum().backward()
                return out, c.grad, w.grad
            out, gh, gws = loom.compile(step)(lh, lws)
    if tool != "compile":
        (out * out).sum().backward()
        gh, gws = lh.grad, lws.grad
    for got, want in ((out, y), (gh, th.grad), (gws, tws.grad)):
        torch.testing.assert_close(to_torch(got), want.detach(), rtol=1e-10, atol=1e-10)


def test_attention_leaves_the_callers_openmp_thread_count_as_it_was():
    """The kernel runs its block products on one OpenMP thread each; the calling thread's
    setting (torch's thread count when torch shares the process) comes back afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        q, k, v = (loom.randn(2, 2, 300, 16).requires_grad_() for _ in range(3))
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
        loom.sync()
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
