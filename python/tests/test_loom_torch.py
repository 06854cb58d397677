"""loom.torch: torch programs (torch.nn modules, torch.optim, loss.backward()) on loom's device,
against the same program on torch eager (Debian's torch 1.13, or torch 2.x where present)."""
import copy
import io
import math
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import loom
import loom.torch as lt

dev = lt.device()


class CausalSelfAttention(nn.Module):  # nanoGPT's, as its repository writes it
    def __init__(self, d, h, block):
        super().__init__()
        self.h = h
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        # torch 2.x: F.scaled_dot_product_attention (loom's attention op); 1.13: the composite
        self.flash = hasattr(F, "scaled_dot_product_attention")
        if not self.flash:
            self.register_buffer("bias", torch.tril(torch.ones(block, block))
                                 .view(1, 1, block, block))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.h, C // self.h).transpose(1, 2)
        k = k.view(B, T, self.h, C // self.h).transpose(1, 2)
        v = v.view(B, T, self.h, C // self.h).transpose(1, 2)
        if self.flash:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0,
                                               is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            y = F.softmax(att, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, d, h, block):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, h, block)
        self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, vocab=32, block=8, d=16, heads=2, layers=2):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.blocks = nn.ModuleList([Block(d, heads, block) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.wte.weight = self.lm_head.weight  # tied, as nanoGPT

    def forward(self, idx, targets):
        pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for b in self.blocks:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


TEXT = "the quick brown fox jumps over the lazy dog. " * 8
VOCAB = sorted(set(TEXT))  # 28 characters: GPT()'s 32 tokens hold them


def batches(n, seed=1, block=8):
    """Windows of a char-level text: inputs and their next characters, 4 a batch."""
    data = torch.tensor([VOCAB.index(c) for c in TEXT])
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        starts = torch.randint(0, len(data) - block - 1, (4,), generator=g)
        out.append((torch.stack([data[s:s + block] for s in starts]),
                    torch.stack([data[s + 1:s + 1 + block] for s in starts])))
    return out


def nanogpt_adamw(model, lr):
    """nanoGPT's configure_optimizers: weight decay on the matrices only."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))


def test_gpt_step_0_loss_and_every_gradient_equal_torch():
    torch.manual_seed(0)
    ref = GPT()
    model = copy.deepcopy(ref).to(dev)
    assert model.wte.weight is model.lm_head.weight  # the tie survives the move
    (idx, tg), = batches(1)
    loss = model(idx.to(dev), tg.to(dev))
    loss.backward()
    want = ref(idx, tg)
    want.backward()
    torch.testing.assert_close(lt.to_torch(loss), want.detach())
    names = [n for n, _ in ref.named_parameters()]
    assert names == [n for n, _ in model.named_parameters()] and len(names) == 28
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        # float32's tolerances, atol scaled to the gradient's size (its default 1e-5 is for
        # values near 1; these are near 1e-2)
        torch.testing.assert_close(lt.to_torch(p.grad), q.grad, rtol=1.3e-6,
                                   atol=1e-5 * q.grad.abs().max().item(),
                                   msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("cut", ["sync", "item"])
def test_gpt_100_adamw_steps_match_torch_and_compile_once(cut):
    """100 steps of nanoGPT's loop (warmup lr, clipping, AdamW with decay) on loom and on eager
    from the same weights and batches; the step compiles once, whether the loop cuts it with
    lt.sync() or only reads loss.item()."""
    torch.manual_seed(0)
    ref = GPT()
    model = copy.deepcopy(ref).to(dev)
    opt, ref_opt = nanogpt_adamw(model, 3e-3), nanogpt_adamw(ref, 3e-3)
    loom.reset_metrics()
    losses, want, compiles = [], [], []
    for it, (idx, tg) in enumerate(batches(100)):
        for o in (opt, ref_opt):
            for group in o.param_groups:
                group["lr"] = 3e-3 * min(1.0, (it + 1) / 10)  # a new lr each step: an input
        loss = model(idx.to(dev), tg.to(dev))
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cut == "sync":
            lt.sync()
            losses.append(loss)
        else:
            losses.append(loss.item())  # the only read
        compiles.append(loom.metrics().compiles)
        w = ref(idx, tg)
        w.backward()
        nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        want.append(w.item())
    assert compiles[-1] == compiles[1], compiles  # nothing compiles after step 1
    assert loom.pending_graph_size() == 0
    got = [x.item() if isinstance(x, torch.Tensor) else x for x in losses]
    assert loom.metrics().compiles == compiles[-1]  # reading synced losses runs nothing new
    assert want[-1] < 0.9 * want[0]  # it learns: the comparison is not of a flat curve
    for it, (a, b) in enumerate(zip(got, want)):
        assert a == pytest.approx(b, rel=1e-4), f"step {it}: loom {a}, torch {b}"


@pytest.mark.skipif(not hasattr(F, "scaled_dot_product_attention"),
                    reason="F.scaled_dot_product_attention needs torch >= 2.0")
@pytest.mark.parametrize("kw", [dict(is_causal=True), dict(scale=0.3, enable_gqa=True, mask=1)])
def test_scaled_dot_product_attention_is_loom_attention_with_torch_gradients(kw):
    g = torch.Generator().manual_seed(0)
    heads_kv = 2 if kw.get("enable_gqa") else 4
    q, k, v = (torch.randn(2, h, 6, 4, generator=g) for h in (4, heads_kv, heads_kv))
    mask = torch.randn(6, 6, generator=g) > 0 if kw.pop("mask", None) else None
    outs = []
    for d in (dev, "cpu"):
        ts = [t.to(d).requires_grad_() for t in (q, k, v)]
        y = F.scaled_dot_product_attention(*ts, attn_mask=None if mask is None else
                                           mask.to(d), **kw)
        (y * y).sum().backward()
        outs.append([lt.to_torch(t) for t in [y] + [t.grad for t in ts]])
    for got, want in zip(*outs):
        torch.testing.assert_close(got, want.detach())


@pytest.mark.skipif(not hasattr(F, "scaled_dot_product_attention"),
                    reason="F.scaled_dot_product_attention needs torch >= 2.0")
def test_attention_dropout_backward_uses_the_forward_draw():
    q = torch.randn(1, 1, 6, 4, device=dev)
    v = torch.eye(6, device=dev).view(1, 1, 6, 6).requires_grad_()
    y = F.scaled_dot_product_attention(q, q, v, dropout_p=0.5)  # y = the dropped weights P
    y.sum().backward()  # so v's gradient row j is P's column sum j
    p = lt.to_torch(y)[0, 0]
    assert 0 < (p == 0).float().mean() < 1
    torch.testing.assert_close(lt.to_torch(v.grad)[0, 0], p.sum(0).view(6, 1).expand(6, 6))


def test_mlp_sgd_momentum_and_lr_schedule_match_torch():
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(),
                        nn.Linear(16, 1))
    model = copy.deepcopy(ref).to(dev)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
            for m in (model, ref)]
    scheds = [torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.5) for o in opts]
    g = torch.Generator().manual_seed(3)
    loom.reset_metrics()
    for step in range(10):
        x, y = torch.randn(8, 6, generator=g), torch.randn(8, 1, generator=g)
        losses = []
        for m, o, s, d in zip((model, ref), opts, scheds, (dev, "cpu")):
            loss = F.mse_loss(m(x.to(d)), y.to(d))
            loss.backward()
            o.step()
            o.zero_grad()
            s.step()
            losses.append(loss.item())
        assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    assert loom.metrics().compiles <= 4  # lr changes are graph inputs: no compile per step


def test_factories_moves_and_printing():
    z = torch.zeros(2, 3, device=dev)
    assert isinstance(z, lt.LoomTensor) and z.shape == (2, 3) and z.dtype == torch.float32
    assert torch.ones(4, dtype=torch.float64, device=dev).sum().item() == 4.0
    assert torch.full((2,), 7, device=dev).tolist() == [7, 7]
    assert torch.arange(5, device=dev).tolist() == [0, 1, 2, 3, 4]
    t = torch.tensor([[1.5, -2.0]], device=dev)
    assert lt.to_torch(t * 2).tolist() == [[3.0, -4.0]]
    assert torch.randn(3, 5, device=dev).shape == (3, 5)
    cpu = torch.randn(3, 4)
    back = lt.to_torch(lt.to_loom(cpu).t() @ lt.to_loom(cpu))
    torch.testing.assert_close(back, cpu.t() @ cpu)
    assert "device=" in repr(t) and "1.5000" in repr(t)
    tree = lt.to_torch({"a": [t, 3], "b": cpu})
    assert isinstance(tree["a"][0], torch.Tensor) and not isinstance(tree["a"][0], lt.LoomTensor)


def test_state_dict_round_trip_keeps_ties():
    torch.manual_seed(0)
    model = GPT().to(dev)
    back = lt.to_torch(model)
    assert back.wte.weight is back.lm_head.weight
    assert all(not isinstance(p, lt.LoomTensor) for p in back.parameters())
    fresh = GPT()
    fresh.load_state_dict(back.state_dict())
    (idx, tg), = batches(1)
    assert fresh(idx, tg).item() == pytest.approx(back(idx, tg).item(), rel=1e-6)


def test_an_op_without_lowering_is_a_clear_error():
    x = torch.randn(3, 3, device=dev)
    with pytest.raises(loom.Error, match=r"aten\.linalg_.*no lowering to loom.*float32\[3, 3\]"):
        torch.linalg.inv(x)


def test_a_run_time_error_names_the_users_line_not_torchs():
    """An index out of range, found when the graph runs: the error names the line of the
    program that made the lookup (not torch's nn.functional, which called the op)."""
    import inspect
    emb = nn.Embedding(10, 4).to(dev)
    line = inspect.currentframe().f_lineno + 1
    y = emb(torch.tensor([1, 12], device=dev))
    with pytest.raises(loom.ExecError, match=rf"index 12 is out of range.*traced at "
                                             rf"test_loom_torch\.py:{line}\b"):
        y.sum().item()


def test_writes_through_views_as_torch():
    """A write into a view reaches its base and the base's other views, as torch's aliasing."""
    def program(d):
        x = torch.arange(12, dtype=torch.float32, device=d).view(3, 4)
        flat = x.view(-1)
        col = x.t()[1]
        x[0].add_(1.0)               # select, then in place
        x[:, 1] = 5.0                # slice + select + copy_ (__setitem__)
        x[1:, 2:].mul_(2.0)          # a slice of a slice
        x.t()[3].sub_(0.5)           # a transposed view's row
        return x, flat, col
    got = [lt.to_torch(t) for t in program(dev)]
    want = program("cpu")
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_a_write_into_an_expanded_tensor_is_refused_as_torch():
    x = torch.zeros(1, 4, device=dev)
    e = x.expand(3, 4)
    with pytest.raises(loom.Error, match=r"aten\.add_\.Tensor: unsupported operation: more than "
                                         r"one element .* expanded"):
        e.add_(1.0)
    with pytest.raises(RuntimeError, match="more than one element"):  # torch says the same
        torch.zeros(1, 4).expand(3, 4).add_(1.0)


def test_assume_pure_over_functional_call_traces_once_and_differentiates():
    from torch.nn.utils.stateless import functional_call  # torch.func's on 2.x
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))
    model = copy.deepcopy(ref).to(dev)
    pure = lt.assume_pure(lambda params, x: functional_call(model, params, (x,)))
    params = dict(model.named_parameters())
    x = torch.randn(5, 4)
    loom.reset_metrics()
    for _ in range(3):
        y = pure(params, x.to(dev))
        (y * y).sum().backward()
        want = ref(x)
        (want * want).sum().backward()
    m = loom.metrics()
    assert m.bodies_traced <= 2 and m.pure_hits >= 4  # forward and its VJP signature, then hits
    torch.testing.assert_close(lt.to_torch(y), want.detach())
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(lt.to_torch(p.grad), q.grad, msg=lambda s: f"{name}: {s}")


def test_assume_pure_cached_calls_follow_statics_outputs_and_gradients():
    """Calls of tensors and numbers take a path without torch's pytree once seen: each
    static value, output structure and gradient still as the function's own."""
    def f(a, b, scale=1.0):
        return a @ b * scale

    def pair(a, b, k=1):
        return a + b, a * k

    g = torch.Generator().manual_seed(6)
    a, b = torch.randn(3, 3, generator=g), torch.randn(3, 3, generator=g)
    pure_f, pure_pair = lt.assume_pure(f), lt.assume_pure(pair)
    for scale in (2.0, 2.0, 3, True, 2.0):
        torch.testing.assert_close(lt.to_torch(pure_f(a.to(dev), b.to(dev), scale=scale)),
                                   f(a, b, scale))
    torch.testing.assert_close(lt.to_torch(pure_f(a.to(dev), b.to(dev))), f(a, b))
    for k in (2, 2, 5):
        got = lt.to_torch(pure_pair(a.to(dev), b.to(dev), k))
        assert isinstance(got, tuple)
        torch.testing.assert_close(got, pair(a, b, k))
    for _ in range(2):
        la = a.to(dev).requires_grad_()
        pure_f(la, b.to(dev), scale=3.0).sum().backward()
    ta = a.clone().requires_grad_()
    f(ta, b, scale=3.0).sum().backward()
    torch.testing.assert_close(lt.to_torch(la.grad), ta.grad)
    lb = b.to(dev).requires_grad_()  # the second argument alone requires grad
    pure_f(a.to(dev), lb, scale=3.0).sum().backward()
    tb = b.clone().requires_grad_()
    f(a, tb, scale=3.0).sum().backward()
    torch.testing.assert_close(lt.to_torch(lb.grad), tb.grad)
    with torch.no_grad():  # no gradient recorded, whatever the arguments require
        assert not pure_f(la, lb, scale=3.0).requires_grad


def test_assume_pure_cached_calls_follow_shapes_keywords_and_methods():
    """The cached path (argument types and keyword names seen before) with new shapes, the
    keywords in another order and the function as a method: each the function's own value."""
    def f(a, b, *, scale=1.0, shift=0.0):
        return a * scale + b + shift

    class Layer(nn.Module):
        @lt.assume_pure
        def forward(self, x, k=2.0):
            return x * k

    pure = lt.assume_pure(f)
    g = torch.Generator().manual_seed(7)
    for shape in ((2, 3), (2, 3), (4,), (2, 3)):
        a, b = torch.randn(*shape, generator=g), torch.randn(*shape, generator=g)
        for kw in ({"scale": 2.0, "shift": 1.0}, {"shift": 1.0, "scale": 2.0}, {"scale": 4.0}):
            got = pure(a.to(dev), b.to(dev), **kw)
            assert isinstance(got, lt.LoomTensor) and got.shape == a.shape
            torch.testing.assert_close(lt.to_torch(got), f(a, b, **kw))
    layer, x = Layer(), torch.randn(3, generator=g)
    for k in (2.0, 2.0, 5.0):
        torch.testing.assert_close(lt.to_torch(layer(x.to(dev), k)), x * k)


def test_scan_equals_the_python_loop_with_gradients():
    xs = torch.randn(6, 3, generator=torch.Generator().manual_seed(2))
    w = torch.full((3,), 0.1, requires_grad=True)
    c0 = lt.to_loom(w.detach()).requires_grad_()

    def step(c, x):
        c = torch.tanh(c * 1.5 + x)
        return c, (c * 2).sum(0, keepdim=True)

    final, ys = lt.scan(step, c0, xs.to(dev))
    (final.sum() + (ys * ys).sum()).backward()
    c, outs = w, []
    for t in range(6):
        c, y = step(c, xs[t])
        outs.append(y)
    (c.sum() + (torch.stack(outs) ** 2).sum()).backward()
    torch.testing.assert_close(lt.to_torch(final), c.detach())
    torch.testing.assert_close(lt.to_torch(ys), torch.stack(outs).detach())
    torch.testing.assert_close(lt.to_torch(c0.grad), w.grad)


def test_fori_loop_and_while_loop():
    r = lt.fori_loop(0, 5, lambda i, a: a * 2 + i, torch.ones(2, device=dev))
    assert lt.to_torch(r).tolist() == [58.0, 58.0]  # closed form of a -> 2a + i, i = 0..4
    i, a = lt.while_loop(lambda i, a: i < 4, lambda i, a: (i + 1, a * 3),
                         (torch.tensor(0, device=dev), torch.ones(2, device=dev)))
    assert lt.to_torch(i).item() == 4 and lt.to_torch(a).tolist() == [81.0, 81.0]


def test_compile_cuts_one_graph_per_step():
    w = torch.ones(3, device=dev)
    step = lt.compile(lambda x: (x * w).sum())
    loom.reset_metrics()
    for k in range(4):
        out = step(torch.full((3,), float(k), device=dev))
    assert loom.pending_graph_size() == 0 and loom.metrics().compiles <= 2
    assert lt.to_torch(out).item() == 9.0


class _Layer(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.lin, self.ln = nn.Linear(d, d), nn.LayerNorm(d)

    def forward(self, x):
        return x + F.gelu(self.lin(self.ln(x)))


@pytest.mark.parametrize("depth", [1, 4])
def test_scan_layers_over_a_module_list_equals_the_loop(depth):
    torch.manual_seed(0)
    ref = nn.ModuleList([_Layer() for _ in range(depth)])
    model = copy.deepcopy(ref).to(dev)
    x = torch.randn(3, 8)
    y = lt.scan_layers(model, x.to(dev), is_layer_pure=True)
    (y * y).sum().backward()
    h = x
    for layer in ref:
        h = layer(h)
    (h * h).sum().backward()
    torch.testing.assert_close(lt.to_torch(y), h.detach())
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(lt.to_torch(p.grad), q.grad, rtol=1e-4, atol=1e-5,
                                   msg=lambda s: f"{name}: {s}")


def test_scan_layers_names_the_layer_that_differs():
    layers = nn.ModuleList([_Layer(8), _Layer(8), _Layer(4)]).to(dev)
    with pytest.raises(loom.TraceError, match=r"layer 2 \(_Layer\) differs from layer 0"):
        lt.scan_layers(layers, torch.zeros(3, 8, device=dev))


def test_a_checkpoint_mid_training_leaves_training_as_it_was():
    """lt.to_torch(model) is a CPU copy: training on loom continues as on eager after it."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    model = copy.deepcopy(ref).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, foreach=True)  # the foreach kernels
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.05, foreach=False)
    g = torch.Generator().manual_seed(4)
    for step in range(6):
        x, y = torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)
        if step == 3:
            buf = io.BytesIO()
            torch.save(model.state_dict(), buf)  # LoomTensors pickle as CPU tensors
            saved = lt.to_torch(model).state_dict()
            buf.seek(0)
            loaded = torch.load(buf)
            for k, v in saved.items():
                assert type(loaded[k]) is torch.Tensor and torch.equal(loaded[k], v)
        for m, o, d in ((model, opt, dev), (ref, ref_opt, "cpu")):
            loss = F.mse_loss(m(x.to(d)), y.to(d))
            loss.backward()
            o.step()
            o.zero_grad()
        torch.testing.assert_close(lt.to_torch(model[0].weight), ref[0].weight.detach())


def test_generate_habits_index_topk_multinomial_dropout():
    x = torch.randn(2, 5, 8)
    torch.testing.assert_close(lt.to_torch(x.to(dev)[:, [-1], :]), x[:, [-1], :])
    torch.testing.assert_close(lt.to_torch(x.to(dev)[:, torch.tensor([0, -1])]),
                               x[:, torch.tensor([0, -1])])
    v, i = torch.topk(x.to(dev), 3, dim=-1)
    want_v, want_i = torch.topk(x, 3, dim=-1)
    torch.testing.assert_close(lt.to_torch(v), want_v)
    assert torch.equal(lt.to_torch(i), want_i)
    probs = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]], device=dev)
    assert lt.to_torch(torch.multinomial(probs, 1)).tolist() == [[2], [0]]
    d = lt.to_torch(F.dropout(torch.ones(20000, device=dev), 0.25, training=True))
    assert abs((d == 0).float().mean().item() - 0.25) < 0.02  # dropped with probability p
    kept = d[d != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 4.0 / 3.0))  # scaled by 1/(1-p)
    r = torch.randint(0, 10, (6,), generator=torch.Generator().manual_seed(1), device=dev)
    assert isinstance(r, lt.LoomTensor)
    assert lt.to_torch(r).tolist() == torch.randint(
        0, 10, (6,), generator=torch.Generator().manual_seed(1)).tolist()


def test_cpu_and_loom_tensors_do_not_mix():
    with pytest.raises(loom.Error, match=r"expected all tensors on loom's device, got a cpu "
                                         r"tensor torch.float32\[3\]"):
        torch.ones(3) + torch.ones(3, device=dev)
    y = torch.ones(3, device=dev) * torch.tensor(2.0)  # a CPU scalar is a number, as torch
    assert lt.to_torch(y).tolist() == [2.0, 2.0, 2.0]
    z = torch.zeros(3, device=dev)
    z.copy_(torch.arange(3.0))  # copy_ moves data across devices, as torch
    assert lt.to_torch(z).tolist() == [0.0, 1.0, 2.0]


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile needs torch >= 2.0")
def test_torch_compile_with_the_loom_backend_trains_as_eager():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.GELU(), nn.Linear(16, 1))
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="loom")
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, ref)]
    g = torch.Generator().manual_seed(5)
    before = lt.fx_graphs_compiled()
    for step in range(6):
        if step == 2:
            lowered = lt.aten_ops_lowered()
        x, y = torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)
        for m, o in ((compiled, opts[0]), (ref, opts[1])):
            loss = F.mse_loss(m(x), y)
            loss.backward()
            o.step()
            o.zero_grad()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach(), q.detach())
    assert lt.fx_graphs_compiled() - before == 2  # one forward and one backward graph
    # From the third call each graph is inserted as traced: no aten op goes through Python.
    assert lt.aten_ops_lowered() == lowered


@pytest.mark.skipif(not hasattr(torch.ops.aten, "_safe_softmax"),
                    reason="aten._safe_softmax is torch >= 2.5's")
def test_safe_softmax_gives_zeros_for_rows_of_minus_inf_only():
    x = torch.randn(3, 4, 5)
    x[1, 2] = float("-inf")
    x[0, :, 3] = float("-inf")
    want = torch.ops.aten._safe_softmax(x, -1)
    got = torch.ops.aten._safe_softmax(x.to(lt.device()), -1)
    torch.testing.assert_close(lt.to_torch(got), want)
    assert lt.to_torch(got)[1, 2].eq(0).all()
    got64 = torch.ops.aten._safe_softmax(x.to(lt.device()), 1, dtype=torch.float64)
    torch.testing.assert_close(lt.to_torch(got64),
                               torch.ops.aten._safe_softmax(x, 1, dtype=torch.float64))


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile needs torch >= 2.0")
def test_torch_compile_of_attention_with_dropout_trains():
    """torch 2.x decomposes SDPA with dropout_p > 0 (through aten._safe_softmax) in the graph
    Dynamo hands to loom: the dropped weights are 0, the kept ones scaled by 1 / (1 - p)."""
    q, k = torch.randn(2, 3, 16, 8), torch.randn(2, 3, 16, 8)
    v = torch.eye(16).expand(2, 3, 16, 16).contiguous().requires_grad_()  # y = the weights

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.25, is_causal=True)

    compiled = torch.compile(attend, backend="loom")
    weights = torch.softmax((q @ k.transpose(-1, -2) / math.sqrt(8)).masked_fill(
        torch.ones(16, 16, dtype=torch.bool).triu(1), float("-inf")), -1)
    ys = []
    for _ in range(3):
        y = compiled(q, k, v)
        y.sum().backward()
        kept = y != 0
        torch.testing.assert_close(y[kept], (weights / 0.75)[kept])
        ys.append(kept)
    assert not torch.equal(ys[1], ys[2])
    assert 0.6 < ys[2][weights > 0].float().mean().item() < 0.9


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile needs torch >= 2.0")
def test_torch_compile_draws_fresh_random_numbers_every_call():
    """A graph run as traced once still draws new random numbers each call (dropout)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.Dropout(0.5))
    compiled = torch.compile(model, backend="loom")
    x = torch.randn(32, 64)
    kept = []
    for _ in range(5):
        y = compiled(x)
        y.sum().backward()
        kept.append((y != 0).float())
        # dropout's scaling: y is 0 or twice the linear layer's output
        z = model[0](x).detach() * 2
        torch.testing.assert_close(torch.where(y != 0, y.detach(), z), z)
    for i in range(1, 5):
        assert not torch.equal(kept[i], kept[i - 1])
        assert 0.45 < kept[i].mean().item() < 0.55


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile needs torch >= 2.0")
def test_torch_compile_inputs_are_read_in_place_and_saved_ones_copied():
    """The loom backend reads CPU inputs without copying them; an input the forward keeps for
    the backward is loom's own copy, so changing the CPU tensor in between does not change the
    gradient (eager's gradient at the forward's values)."""
    def f(x, w):
        return (x * w).sum()

    torch._dynamo.reset()
    c = torch.compile(f, backend="loom")
    x = torch.randn(5, requires_grad=True)
    w = torch.randn(5, dtype=torch.float32)
    want = w.clone()
    y = c(x, w)
    torch.testing.assert_close(y, (x * want).sum())
    with torch.no_grad():
        w.add_(1)
    y.backward()
    torch.testing.assert_close(x.grad, want)


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile needs torch >= 2.0")
def test_torch_compile_outputs_are_handed_over_unless_their_memory_is_shared():
    """Outputs come back over loom's memory, but one whose memory loom keeps for the backward
    (exp's result) or another output has (the same value returned twice) is a copy: writing
    the returned tensors changes neither the gradient nor the other output."""
    def f(x):
        y = torch.exp(x)
        return y, y * 1.0, (x * 3).sum()

    torch._dynamo.reset()
    c = torch.compile(f, backend="loom")
    x = torch.randn(6, requires_grad=True)
    want = torch.exp(x.detach())
    y, y1, s = c(x)
    torch.testing.assert_close(y.detach(), want)
    with torch.no_grad():
        y.add_(100)
    torch.testing.assert_close(y1.detach(), want)
    (y1.sum() + s).backward()
    torch.testing.assert_close(x.grad, want + 3)


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile needs torch >= 2.0")
def test_torch_compile_graph_breaks_and_recompiles_are_counted():
    """A print splits the function into two graphs (one graph break); a new shape recompiles
    both: the counters and the report say so, and the values are eager's."""
    def f(x):
        y = torch.tanh(x) * 2
        print("between the graphs")
        return y.sum(0) + 1

    torch._dynamo.reset()
    before = lt.compile_counters()
    c = torch.compile(f, backend="loom")
    for n in (4, 4, 5):
        x = torch.randn(n, 3)
        torch.testing.assert_close(c(x), f(x))
    after = lt.compile_counters()
    assert after["fx_graphs"] - before["fx_graphs"] == 4  # 2 graphs, then both for shape 5
    assert after["graph_breaks"] - before["graph_breaks"] >= 1
    assert any("print" in r or "builtin" in r for r in after["graph_break_reasons"]), after
    assert after["dynamo_frames"] > before["dynamo_frames"]
    assert "graph breaks" in lt.metrics_report()


class _Factories(nn.Module):
    """Tensors made inside the forward, on the input's device (the CPU under torch.compile):
    nanoGPT's arange, ones, full, a 0-d zeros, a tensor constant, *_like, a copy to the index's
    device; their backward recomputes some (Inductor's partition)."""

    def __init__(self):
        super().__init__()
        self.emb, self.pos, self.lin = nn.Embedding(8, 4), nn.Embedding(5, 4), nn.Linear(4, 8)

    def forward(self, idx, y):
        pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device)
        h = self.emb(idx) + self.pos(pos) + torch.ones(4, device=idx.device)
        h = torch.where(h > 0.5, h, torch.zeros((), device=h.device)) + torch.full_like(h, 0.5)
        h = h * torch.tensor([1.0, 2.0, 3.0, 4.0]) + torch.full((4,), 0.25, device=h.device)
        h = h.amax(-1, keepdim=True) * h.to(idx.device) + torch.zeros_like(h)
        logits = self.lin(h)
        return F.cross_entropy(logits.view(-1, 8), y.view(-1))


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile needs torch >= 2.0")
def test_torch_compile_makes_the_graphs_tensors_on_loom():
    """A tensor a compiled graph makes on the CPU (the model's device) is made on loom, forward
    and backward: values and gradients as eager (was: 'got a cpu tensor')."""
    class AddOnes(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(4, 4)

        def forward(self, x):
            return self.l(x) + torch.ones(4, device=x.device)

    torch._dynamo.reset()
    m = AddOnes()
    x = torch.randn(2, 4)
    torch.testing.assert_close(torch.compile(m, backend="loom")(x), m(x))
    torch.manual_seed(0)
    model = _Factories()
    ref = copy.deepcopy(model)
    idx, y = torch.randint(0, 8, (3, 5)), torch.randint(0, 8, (3, 5))
    loss = torch.compile(model, backend="loom")(idx, y)
    loss.backward()
    want = ref(idx, y)
    want.backward()
    torch.testing.assert_close(loss.detach(), want.detach())
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=lambda m: f"{name}: {m}")


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile needs torch >= 2.0")
def test_torch_compile_trains_nanogpt_as_eager():
    """nanoGPT on the CPU under torch.compile(backend="loom") (its pos = torch.arange(...,
    device=idx.device) is made in the graph; its attention is the CPU flash kernel's op):
    step 0's gradients and three AdamW steps' losses as eager."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = GPT()
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="loom")
    opts = [nanogpt_adamw(m, 1e-2) for m in (model, ref)]
    for step, (idx, tg) in enumerate(batches(3)):
        losses = []
        for m in (compiled, ref):
            loss = m(idx, tg)
            loss.backward()
            losses.append(loss.item())
        assert losses[0] == pytest.approx(losses[1], rel=1e-5), step
        if step == 0:
            for (name, p), q in zip(model.named_parameters(), ref.parameters()):
                torch.testing.assert_close(p.grad, q.grad, rtol=1.3e-6,
                                           atol=1e-5 * q.grad.abs().max().item(),
                                           msg=lambda m: f"{name}: {m}")
        for o in opts:
            o.step()
            o.zero_grad()


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile needs torch >= 2.0")
def test_torch_compile_error_names_the_users_line():
    """A loom.Error raised inside a compiled graph names the line of the program the op came
    from (the FX node's stack trace), not only the generated graph's."""
    def f(x):
        y = x * 2
        return torch.histc(y, bins=4)  # no lowering: loom.Error

    torch._dynamo.reset()
    with pytest.raises(loom.Error, match=r"(?s)aten.histc.default has no lowering.*"
                                         r"test_loom_torch.py\", line \d+, in f.*torch.histc"):
        torch.compile(f, backend="loom")(torch.randn(8))


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile needs torch >= 2.0")
def test_torch_compile_of_a_model_on_loom_runs_it_lazily():
    """torch.compile(backend="loom") of a model already on loom's device runs it as loom.torch
    does (one graph per step at lt.sync()): Dynamo compiles no frame and breaks no graph (it
    cannot trace loom's tensor subclass), no warning; values and gradients as eager. A compiled
    function called with loom tensors, and the decorator form, likewise."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 1))
    model = copy.deepcopy(ref).to(dev)
    before = lt.compile_counters()
    x = torch.randn(3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = torch.compile(model, backend="loom")(x.to(dev))
        out.sum().backward()
        f = torch.compile(lambda a, b: torch.tanh(a) * b, backend="loom")
        got = f(x.to(dev), torch.ones(4, device=dev))

        @torch.compile(backend="loom")
        def g(a):
            return a.exp().sum(0)
        summed = g(x.to(dev))
    after = lt.compile_counters()
    assert after["dynamo_frames"] == before["dynamo_frames"]
    assert after["graph_breaks"] == before["graph_breaks"]
    want = ref(x)
    want.sum().backward()
    torch.testing.assert_close(lt.to_torch(out), want.detach())
    torch.testing.assert_close(lt.to_torch(model[0].weight.grad), ref[0].weight.grad)
    torch.testing.assert_close(lt.to_torch(got), torch.tanh(x))
    torch.testing.assert_close(lt.to_torch(summed), x.exp().sum(0))


def test_copy_from_loom_into_a_cpu_tensor():
    """cpu.copy_(loom) writes the CPU tensor in place (the same object; casting and
    broadcasting as torch, into a view too), as torch's copy_ moves values across devices;
    param.data.copy_ under no_grad too. Another in-place op writing a CPU tensor from loom ones
    is refused, naming the written-to tensor."""
    src = torch.arange(6.0).view(2, 3)
    dst = torch.zeros(2, 3)
    assert dst.copy_(src.to(dev) * 2) is dst
    torch.testing.assert_close(dst, src * 2)
    wide = torch.zeros(2, 2, 3, dtype=torch.float64)
    wide[1].copy_(src.to(dev)[0])  # a view of a CPU tensor, a float64 from float32, broadcast
    want = torch.zeros(2, 2, 3, dtype=torch.float64)
    want[1].copy_(src[0])
    torch.testing.assert_close(wide, want)
    p = nn.Parameter(torch.zeros(3))
    with torch.no_grad():
        p.data.copy_(torch.ones(3, device=dev) + 1)
    torch.testing.assert_close(p.detach(), torch.full((3,), 2.0))
    with pytest.raises(loom.Error, match=r"aten.add_.Tensor writes into a cpu tensor "
                                         r"torch.float32\[3\]"):
        torch.zeros(3).add_(torch.ones(3, device=dev))


def test_load_state_dict_of_a_checkpoint_mapped_to_loom_into_a_cpu_model():
    """nanoGPT's resume: torch.load(ckpt, map_location=lt.device()) gives loom tensors, and a
    model on the CPU takes them with load_state_dict (copy_ loom -> CPU, into its own parameter
    objects): the loaded model computes what the saved one does."""
    torch.manual_seed(0)
    saved = GPT()
    buf = io.BytesIO()
    torch.save({"model": saved.state_dict()}, buf)
    buf.seek(0)
    ckpt = torch.load(buf, map_location=lt.device())
    assert all(isinstance(v, lt.LoomTensor) for v in ckpt["model"].values())
    torch.manual_seed(1)
    fresh = GPT()
    params = [id(p) for p in fresh.parameters()]
    fresh.load_state_dict(ckpt["model"])
    assert [id(p) for p in fresh.parameters()] == params
    assert not any(isinstance(p, lt.LoomTensor) for p in fresh.parameters())
    for (name, p), q in zip(fresh.named_parameters(), saved.parameters()):
        assert torch.equal(p.detach(), q.detach()), name
    idx, tg = batches(1)[0]
    torch.testing.assert_close(fresh(idx, tg), saved(idx, tg))


def test_module_to_cpu_moves_in_place_as_torch():
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
    model[1].weight = model[0].weight
    assert model.to(dev) is model and isinstance(model[0].weight, lt.LoomTensor)
    assert model.to("cpu") is model
    assert type(model[0].weight) is nn.Parameter and model[1].weight is model[0].weight


def test_split_pieces_write_back_and_gradients_accumulate_over_expands():
    def program(d):
        w = torch.ones(3, device=d).requires_grad_()
        x = torch.arange(6.0, device=d).view(2, 3)
        # w's gradient accumulates over an expand's, a sum's and a stack's backward
        ((w.expand(2, 3) * x).sum() + w.sum() * 2 + torch.stack([w, w]).sum()).backward()
        y = torch.arange(8.0, device=d)
        a, b = y.split(4)
        b.mul_(10)
        y.unbind(0)[1].add_(100)
        return w.grad, y, a
    for got, want in zip(program(dev), program("cpu")):
        torch.testing.assert_close(lt.to_torch(got), want.detach())


@pytest.mark.parametrize("cls,kw", [
    (nn.LSTM, dict(num_layers=2, batch_first=True)),
    (nn.LSTM, dict(bidirectional=True, proj_size=3)),
    (nn.GRU, dict(num_layers=2, batch_first=True)),
    (nn.GRU, dict(bidirectional=True)),
    (nn.RNN, dict(nonlinearity="relu", num_layers=2)),
    (nn.RNN, dict(batch_first=True, bias=False)),
], ids=["lstm", "lstm-bidir-proj", "gru", "gru-bidir", "rnn-relu", "rnn-nobias"])
def test_recurrent_modules_train_as_on_torch(cls, kw):
    """nn.LSTM/GRU/RNN keep their own list of weights (_flat_weights), which moving the module
    to loom's device refreshes; their zero state is made on loom (torch 2.x makes it on the
    input's device, 'meta' for loom's tensors), GRU's and RNN's input.transpose_ reshapes in
    place. Output, final state and every gradient against eager, with and without a given
    state."""
    torch.manual_seed(0)
    m = cls(4, 6, **kw)
    x = torch.randn(2, 5, 4)
    ref = copy.deepcopy(m)
    out_ref, h_ref = ref(x)
    first = lambda h: h[0] if isinstance(h, tuple) else h  # noqa: E731
    (out_ref.square().sum() + first(h_ref).sum()).backward()
    m.to(dev)
    out, h = m(x.to(dev))
    (out.square().sum() + first(h).sum()).backward()
    torch.testing.assert_close(lt.to_torch(out), out_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lt.to_torch(first(h)), first(h_ref), atol=1e-5, rtol=1e-5)
    for (name, p), q in zip(m.named_parameters(), ref.parameters()):
        torch.testing.assert_close(lt.to_torch(p.grad), q.grad, atol=1e-5, rtol=1e-5, msg=name)
    # A given state: the module's second call continues from the first's.
    torch.testing.assert_close(lt.to_torch(m(x.to(dev), lt.to_loom(h_ref) if not isinstance(
        h_ref, tuple) else tuple(lt.to_loom(t.detach()) for t in h_ref))[0]),
        ref(x, h_ref if not isinstance(h_ref, tuple) else tuple(t.detach() for t in h_ref))[0],
        atol=1e-5, rtol=1e-5)


def test_sort_argsort_and_a_large_topk_as_eager():
    """torch.sort (stable), argsort, msort and topk past 16 on loom's device: values, indices
    and the gradient through torch's autograd (sort's backward scatters), as eager."""
    torch.manual_seed(3)
    x = torch.randn(4, 50)
    x[0, :5] = 0.5  # ties
    for descending in (False, True):
        xl = x.to(dev).requires_grad_()
        xe = x.clone().requires_grad_()
        v, i = torch.sort(xl, dim=1, descending=descending, stable=True)
        ve, ie = torch.sort(xe, dim=1, descending=descending, stable=True)
        torch.testing.assert_close(lt.to_torch(v), ve.detach())
        assert lt.to_torch(i).tolist() == ie.tolist()
        w = torch.randn(4, 50)
        (v * w.to(dev)).sum().backward()
        (ve * w).sum().backward()
        torch.testing.assert_close(lt.to_torch(xl.grad), xe.grad)
        assert lt.to_torch(xl.argsort(dim=0, descending=descending)).tolist() == \
            torch.sort(xe, dim=0, descending=descending, stable=True)[1].tolist()
    torch.testing.assert_close(lt.to_torch(torch.msort(x.to(dev))), torch.msort(x))
    v, i = torch.topk(x[1:].to(dev), 30)
    ve, ie = torch.topk(x[1:], 30)
    torch.testing.assert_close(lt.to_torch(v), ve)
    assert lt.to_torch(i).tolist() == ie.tolist()


def test_torch_load_with_map_location_loom():
    """torch.load(f, map_location=lt.device()) gives loom tensors (a state dict and a bare
    tensor) with the saved values; other map_locations are torch's."""
    model = nn.Linear(3, 2)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "t": torch.arange(4.0)}, buf)
    buf.seek(0)
    got = torch.load(buf, map_location=lt.device())
    assert isinstance(got["t"], lt.LoomTensor)
    assert isinstance(got["model"]["weight"], lt.LoomTensor)
    torch.testing.assert_close(lt.to_torch(got["model"]["weight"]), model.weight.detach())
    torch.testing.assert_close(lt.to_torch(got["t"]), torch.arange(4.0))
    fresh = nn.Linear(3, 2).to(dev)
    fresh.load_state_dict(got["model"])
    torch.testing.assert_close(lt.to_torch(fresh.bias), model.bias.detach())
    buf.seek(0)
    assert not isinstance(torch.load(buf, map_location="cpu")["t"], lt.LoomTensor)


def test_nonzero_and_boolean_masks_as_eager():
    """Data-dependent shapes: nonzero (and as_tuple, one-argument where), x[mask] on the leading
    dims and on dim 1, masked_select with its gradient (masked_scatter), x[mask] = a vector of
    values and += with accumulate: values and gradients as eager, each computing the mask at
    once (counted in metrics_report)."""
    torch.manual_seed(4)
    x = torch.randn(4, 5)
    xl = x.to(dev)
    assert lt.to_torch(torch.nonzero(xl > 0)).tolist() == torch.nonzero(x > 0).tolist()
    for got, want in zip(torch.nonzero(xl > 0.5, as_tuple=True), torch.nonzero(x > 0.5,
                                                                              as_tuple=True)):
        assert lt.to_torch(got).tolist() == want.tolist()
    assert lt.to_torch(torch.where(xl < 0)[1]).tolist() == torch.where(x < 0)[1].tolist()
    m = x > 0
    a, b = x.clone().requires_grad_(), x.to(dev).requires_grad_()
    w = torch.randn(int(m.sum()))
    (a[m] * w).sum().backward()
    (b[m.to(dev)] * w.to(dev)).sum().backward()
    torch.testing.assert_close(lt.to_torch(b.grad), a.grad)
    cols = torch.tensor([True, False, True, True, False])
    torch.testing.assert_close(lt.to_torch(xl[:, cols.to(dev)]), x[:, cols])
    a, b = x.clone().requires_grad_(), x.to(dev).requires_grad_()
    torch.masked_select(a, m[0]).square().sum().backward()  # the mask broadcast over rows
    got = torch.masked_select(b, m[0].to(dev))
    got.square().sum().backward()
    torch.testing.assert_close(lt.to_torch(got), torch.masked_select(x, m[0]))
    torch.testing.assert_close(lt.to_torch(b.grad), a.grad)
    y, yl = x.clone(), x.to(dev)
    vals = torch.arange(float(m.sum()))
    y[m] = vals
    yl[m.to(dev)] = vals.to(dev)
    torch.testing.assert_close(lt.to_torch(yl), y)
    y.index_put_((m,), vals, accumulate=True)
    yl.index_put_((m.to(dev),), vals.to(dev), accumulate=True)
    torch.testing.assert_close(lt.to_torch(yl), y)
    assert "data-dependent shapes" in lt.metrics_report()
    nothing = xl > 10
    assert tuple(xl[nothing].shape) == (0,)


def test_a_boolean_mask_assignment_and_its_limits():
    """nanoGPT's top-k filter, logits[logits < v] = -inf, as eager (a where: no graph cut); a
    list index writes as eager; values that do not fit the selection raise torch's error."""
    torch.manual_seed(1)
    x = torch.randn(3, 7)
    v, _ = torch.topk(x, 2)
    want = x.clone()
    want[want < v[:, [-1]]] = -float("inf")
    got = x.to(dev)
    vv, _ = torch.topk(got, 2)
    got[got < vv[:, [-1]]] = -float("inf")
    torch.testing.assert_close(lt.to_torch(got), want)
    got[:, [0, 2]] = 1.0
    want[:, [0, 2]] = 1.0
    torch.testing.assert_close(lt.to_torch(got), want)
    with pytest.raises(RuntimeError, match="shape mismatch"):  # torch's error, and loom's
        want[want > 0] = torch.ones(2)
    with pytest.raises(loom.ShapeError, match="shape mismatch: value tensor of shape \\[2\\]"):
        got[got > 0] = torch.ones(2, device=dev)


def test_variance_any_all_and_max_over_a_dim_as_torch():
    """var/std/var_mean/std_mean with every overload's arguments (unbiased, correction,
    keepdim, dims), any/all over dims and of 0-d tensors, max/min over a dim (values and the
    first index on ties) and over everything, against torch on the CPU."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 5, dtype=torch.float64, generator=g)
    ties = torch.tensor([[1., 3., 3., 0.], [2., 2., -1., -1.], [5., 5., 5., 5.]])
    cases = [
        (x, lambda t: t.var()), (x, lambda t: t.var(1)), (x, lambda t: t.var(1, unbiased=False)),
        (x, lambda t: torch.var(t, (0, 2), correction=2, keepdim=True)),
        (x, lambda t: t.std(dim=-1)), (x, lambda t: torch.var_mean(t, 2)),
        (x, lambda t: torch.std_mean(t, (0, 1), keepdim=True)),
        (x, lambda t: (t > 0).any()), (x, lambda t: (t > 0).all(1)),
        (x, lambda t: t.any(dim=2, keepdim=True)), (torch.tensor(0.0), lambda t: t.all(0)),
        (torch.tensor(2.0), lambda t: t.any(-1)),
        (ties, lambda t: t.max(1)), (ties, lambda t: t.min(0, keepdim=True)),
        (ties, lambda t: t.max()), (ties, lambda t: torch.min(t, t * 0.5)),
    ]
    for k, (t, f) in enumerate(cases):
        want, got = f(t), f(t.to(dev))
        want = want if isinstance(want, tuple) else (want,)
        got = got if isinstance(got, tuple) else (got,)
        for w, gv in zip(want, got):
            torch.testing.assert_close(lt.to_torch(gv), w, msg=lambda m: f"case {k}: {m}")


def test_scatter_and_the_backward_of_max_over_a_dim_as_torch():
    """aten.scatter (.src over a smaller index, .value) and what max/min's backward records
    with it (and isnan, logical_and_/or_), against torch on the CPU."""
    z = torch.zeros(4, 5)
    idx = torch.tensor([[0, 1, 2], [3, 0, 1]])
    src = torch.arange(1.0, 10.0).reshape(3, 3)
    torch.testing.assert_close(lt.to_torch(z.to(dev).scatter(0, idx.to(dev), src.to(dev))),
                               z.scatter(0, idx, src))
    torch.testing.assert_close(lt.to_torch(z.to(dev).scatter(1, idx.to(dev), 7.0)),
                               z.scatter(1, idx, 7.0))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 4, 5, dtype=torch.float64, generator=g)
    for f in (lambda t: t.max(1).values, lambda t: t.min(2, keepdim=True)[0], lambda t: t.max()):
        lx, tx = lt.to_loom(x).requires_grad_(), x.clone().requires_grad_()
        (f(lx) * 2).sum().backward()
        (f(tx) * 2).sum().backward()
        torch.testing.assert_close(lt.to_torch(lx.grad), tx.grad)
    a, b = torch.tensor([True, False, True]), torch.tensor([True, True, False])
    torch.testing.assert_close(lt.to_torch(torch.logical_xor(a.to(dev), b.to(dev))),
                               torch.logical_xor(a, b))
    n = torch.tensor([1.0, float("nan"), float("inf")])
    for f in (torch.isnan, torch.isinf, torch.isfinite):
        torch.testing.assert_close(lt.to_torch(f(n.to(dev))), f(n))


class CharLSTM(nn.Module):  # pytorch/examples' word_language_model, char-level
    def __init__(self, ntoken=28, ninp=8, nhid=12):
        super().__init__()
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, 2, dropout=0.0)
        self.decoder = nn.Linear(nhid, ntoken)

    def forward(self, x, hidden):
        out, hidden = self.rnn(self.encoder(x), hidden)
        return F.log_softmax(self.decoder(out).view(-1, self.decoder.out_features), 1), hidden


def test_truncated_bptt_windows_of_a_device_dataset_share_one_graph():
    """word_language_model's loop: the whole token stream on the device, batchified, a window
    `source[i:i + bptt]` a step (and its targets `source[i + 1:...]`, narrow() too), the
    hidden state carried with .detach(). A window's offset is a host scalar, not part of the
    graph: after the first windows no step compiles (a static slice compiled one graph per
    offset). Losses, final weights and a windowed slice's gradient as eager's."""
    data = torch.tensor([VOCAB.index(c) for c in TEXT])
    source = data[:len(data) // 4 * 4].view(4, -1).t().contiguous()  # batchify(data, 4)
    bptt, losses, compiles = 6, {}, []
    for where in ("cpu", "loom"):
        torch.manual_seed(0)
        model = CharLSTM()
        src = source
        if where == "loom":
            model.to(dev)
            src = source.to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        hidden, out = None, []
        for epoch in range(2):
            for i in range(0, src.size(0) - 1 - bptt, bptt):  # full windows only
                x, y = src[i:i + bptt], src.narrow(0, i + 1, bptt).reshape(-1)
                hidden = None if hidden is None else tuple(h.detach() for h in hidden)
                opt.zero_grad()
                output, hidden = model(x, hidden)
                loss = F.nll_loss(output, y)
                loss.backward()
                opt.step()
                out.append(loss.item())
                if where == "loom":
                    compiles.append(lt.metrics().compiles)
        losses[where] = (out, model)
    assert len(losses["cpu"][0]) > 10
    torch.testing.assert_close(torch.tensor(losses["loom"][0]), torch.tensor(losses["cpu"][0]),
                               rtol=1e-5, atol=1e-6)
    for p, q in zip(losses["loom"][1].parameters(), losses["cpu"][1].parameters()):
        torch.testing.assert_close(lt.to_torch(p), q.detach(), rtol=1e-4, atol=1e-5)
    # windows 3.. of an epoch compile nothing (the first, at offset 0, is a static slice;
    # Adam's first steps make their state): a constant count, not one per offset
    n = len(compiles) // 2
    assert n >= 8 and len(set(compiles[3:n])) == 1 and len(set(compiles[n:])) == 1, compiles
    # a window of a leaf with a gradient, negative bounds, windows along dim 1
    w = torch.randn(7, 5, requires_grad=True)
    wl = lt.to_loom(w.detach()).requires_grad_()
    for key in ((slice(2, 5), slice(1, None)), (slice(-4, -1),), (slice(None), slice(3, 5))):
        ref, got = w[key], wl[key]
        (ref * torch.arange(ref.numel()).view(ref.shape)).sum().backward()
        (got * lt.to_loom(torch.arange(got.numel()).view(got.shape))).sum().backward()
        torch.testing.assert_close(lt.to_torch(got), ref.detach())
    torch.testing.assert_close(lt.to_torch(wl.grad), w.grad)
    torch.testing.assert_close(lt.to_torch(lt.to_loom(data).narrow(0, 5, 9)), data.narrow(0, 5, 9))


def test_batches_indexed_from_a_device_tensor_share_one_graph():
    """`xs[i]` of a pre-batched tensor on the device, a step per i: the index is a host scalar
    (a static select compiled a graph per i). Losses and weights as eager."""
    torch.manual_seed(0)
    xs, ys = torch.randn(6, 4, 3), torch.randn(6, 4, 2)
    ref = nn.Linear(3, 2)
    m = copy.deepcopy(ref).to(dev)
    opts = [torch.optim.SGD(p.parameters(), lr=0.1, momentum=0.9) for p in (ref, m)]
    xl, yl = xs.to(dev), ys.to(dev)
    compiles = []
    for i in [1, 2, 3, 4, 5, -1, -6]:
        for model, opt, x, y in ((ref, opts[0], xs, ys), (m, opts[1], xl, yl)):
            loss = F.mse_loss(model(x[i]), y[i])
            opt.zero_grad()
            loss.backward()
            opt.step()
            if model is ref:
                want = loss.item()
            else:
                assert abs(loss.item() - want) <= 1e-5 * abs(want), (i, loss.item(), want)
        compiles.append(lt.metrics().compiles)
    assert len(set(compiles[2:])) == 1, compiles
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(lt.to_torch(p), q.detach())
    torch.testing.assert_close(lt.to_torch(xl[:, 2]), xs[:, 2])
    with pytest.raises((IndexError, RuntimeError, loom.Error)):
        xl[6]


def test_equal_allclose_and_a_given_gradient_as_torch():
    """torch.equal, torch.allclose (rtol/atol, inf, nan, equal_nan) and is_same_size answer
    Python bools as eager's; loss.backward(gradient) and autograd.grad with grad_outputs
    (torch 1.13's autograd asks is_same_size) give eager's gradients."""
    a = torch.tensor([1.0, 2.0, float("inf"), float("nan")])
    for b in (a.clone(), a + 1e-6, a + 1e-3, torch.tensor([1.0, 2.0, float("inf"), 0.0]),
              torch.tensor([1.0, 2.0, -float("inf"), float("nan")])):
        for kw in ({}, {"equal_nan": True}, {"rtol": 1e-2, "atol": 0.0}):
            assert torch.allclose(lt.to_loom(a), lt.to_loom(b), **kw) == \
                torch.allclose(a, b, **kw), (b, kw)
        assert torch.equal(lt.to_loom(a[:3]), lt.to_loom(b[:3])) == torch.equal(a[:3], b[:3])
    assert torch.equal(lt.to_loom(a), lt.to_loom(a)) == torch.equal(a, a)  # nan: False
    assert not torch.equal(lt.to_loom(a), lt.to_loom(a[:2]))
    assert lt.to_loom(a).is_same_size(lt.to_loom(a + 1)) and \
        not lt.to_loom(a).is_same_size(lt.to_loom(a[:2]))
    x, g = torch.randn(3, 4, requires_grad=True), torch.randn(3, 4)
    xl = lt.to_loom(x.detach()).requires_grad_()
    (x * 2).sin().backward(g)
    (xl * 2).sin().backward(lt.to_loom(g))
    torch.testing.assert_close(lt.to_torch(xl.grad), x.grad)
    (gx,) = torch.autograd.grad(x.exp(), x, grad_outputs=g)
    (gl,) = torch.autograd.grad(xl.exp(), xl, grad_outputs=lt.to_loom(g))
    torch.testing.assert_close(lt.to_torch(gl), gx)


def test_torch_manual_seed_repeats_loom_draws_and_dropout_masks():
    """torch.manual_seed(s) seeds loom's generator too: as on torch's CPU, the same seed gives
    the same rand/randn values and dropout masks again (a training run repeats), another seed
    other ones; the masks keep torch's dropout semantics (kept elements scaled by 1/(1-p))."""
    def draws(seed):
        torch.manual_seed(seed)
        r = torch.rand(64, device=dev)
        n = torch.randn(8, 8, device=dev)
        d = F.dropout(torch.ones(256, device=dev), 0.25)
        return [lt.to_torch(t) for t in (r, n, d)]
    a, b, c = draws(3), draws(3), draws(4)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
    assert all(not torch.equal(x, y) for x, y in zip(a, c))
    # the CPU's stream is seeded as before: torch.manual_seed(3) then torch.rand as eager
    assert isinstance(torch.manual_seed(3), torch.Generator)
    cpu = torch.rand(5)
    assert torch.equal(cpu, torch.rand(5, generator=torch.Generator().manual_seed(3)))
    kept = a[2][a[2] != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 1 / 0.75))
    assert 0.5 < kept.numel() / 256 < 0.95


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3),
    lambda ps: torch.optim.Adam(ps, lr=1e-2),
    lambda ps: torch.optim.AdamW(ps, lr=1e-2, amsgrad=True),
], ids=["sgd-nesterov", "adam", "adamw-amsgrad"])
def test_resume_from_an_optimizer_checkpoint_as_eager(make):
    """A checkpoint (model, optimizer and scheduler state_dicts, torch.save to a BytesIO) made
    mid-training on loom, loaded into a fresh model and optimizer on loom: the optimizer's
    state (momentum buffers, moments) lands on loom (torch 2.x's Optimizer.load_state_dict
    casts it to param.device, 'meta' for a loom parameter, which made data-less meta tensors),
    and the resumed steps' losses and weights equal eager's resumed from eager's checkpoint."""
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    data = [(torch.randn(5, 4), torch.randint(0, 3, (5,))) for _ in range(6)]
    results = {}
    for where in ("cpu", "loom"):
        d = dev if where == "loom" else "cpu"
        model = copy.deepcopy(base).to(d)
        opt = make(model.parameters())
        sched = torch.optim.lr_scheduler.StepLR(opt, 2, gamma=0.5)

        def train(model, opt, sched, batches):
            out = []
            for x, y in batches:
                loss = F.cross_entropy(model(x.to(d)), y.to(d))
                opt.zero_grad()
                loss.backward()
                opt.step()
                sched.step()
                out.append(loss.item())
            return out
        train(model, opt, sched, data[:3])
        buf = io.BytesIO()
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                    "sched": sched.state_dict()}, buf)
        buf.seek(0)
        ckpt = torch.load(buf)
        model2 = copy.deepcopy(base).to(d)
        with warnings.catch_warnings():  # torch 2.x warned a copy into a 'meta' parameter
            warnings.simplefilter("error")  # was a no-op (it is not: loom's copy_)
            model2.load_state_dict(ckpt["model"])
        opt2 = make(model2.parameters())
        opt2.load_state_dict(ckpt["opt"])
        sched2 = torch.optim.lr_scheduler.StepLR(opt2, 2, gamma=0.5)
        sched2.load_state_dict(ckpt["sched"])
        if where == "loom":
            for st in opt2.state.values():
                for k, v in st.items():
                    if isinstance(v, torch.Tensor) and k != "step":
                        assert isinstance(v, lt.LoomTensor), (k, type(v), v.device)
        results[where] = (train(model2, opt2, sched2, data[3:]), model2)
    torch.testing.assert_close(torch.tensor(results["loom"][0]), torch.tensor(results["cpu"][0]),
                               rtol=1e-5, atol=1e-6)
    for p, q in zip(results["loom"][1].parameters(), results["cpu"][1].parameters()):
        torch.testing.assert_close(lt.to_torch(p), q.detach(), rtol=1e-5, atol=1e-6)


def test_out_variants_write_their_out_as_torch():
    """out= overloads (AdamW(amsgrad=True) runs torch.maximum(m, v, out=m)): the result is
    written into out, its base and its views, cast to out's dtype; values as eager's."""
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    for f in (lambda x, y, o: torch.maximum(x, y, out=o), lambda x, y, o: torch.add(x, y, out=o),
              lambda x, y, o: torch.mul(x, 2.5, out=o), lambda x, y, o: torch.exp(x, out=o)):
        ref_base = torch.zeros(2, 3, 4)
        f(a, b, ref_base[1])
        base = lt.to_loom(torch.zeros(2, 3, 4))
        view = base[1]
        assert f(lt.to_loom(a), lt.to_loom(b), view) is view
        torch.testing.assert_close(lt.to_torch(base), ref_base)
        torch.testing.assert_close(lt.to_torch(view), ref_base[1])
    ref = torch.zeros(3, 4, dtype=torch.float64)
    got = lt.to_loom(ref.clone())
    torch.add(a, b, out=ref)
    torch.add(lt.to_loom(a), lt.to_loom(b), out=got)
    assert got.dtype == torch.float64
    torch.testing.assert_close(lt.to_torch(got), ref)


@pytest.mark.skipif(not hasattr(torch, "compile"),
                    reason="the warning needs torch >= 2.0's global optimizer hook")
def test_an_optimizer_made_before_the_move_to_loom_is_told():
    """torch keeps a module's Parameter objects when it moves it to CUDA; loom's .to() makes
    new ones, so an optimizer made before the move would step the CPU ones: said once."""
    m = nn.Linear(4, 2)
    stale = torch.optim.SGD(m.parameters(), lr=0.1)
    m.to(dev)
    m(torch.randn(3, 4, device=dev)).sum().backward()
    with pytest.warns(UserWarning, match=r"SGD holds a model's parameters from before "
                                         r"module\.to\(lt\.device\(\)\)"):
        stale.step()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stale.step()  # once per optimizer
        fresh = torch.optim.SGD(m.parameters(), lr=0.1)
        fresh.step()


def test_factories_made_on_loom_take_torchs_dtypes_and_shapes():
    """The aten factories loom makes itself (a backward's, a compiled graph's): torch's own
    result dtype and shape for each, the default dtype and the fill's and bounds' types."""
    from loom.torch import _dispatch
    aten = torch.ops.aten
    cases = [(aten.scalar_tensor.default, (3,)), (aten.full.default, ([2], 1)),
             (aten.full.default, ([2], 1.5)), (aten.full.default, ([2], True)),
             (aten.arange.default, (3,)), (aten.arange.start, (0.0, 3.0)),
             (aten.zeros.default, ([2, 3],)), (aten.ones.default, ([4],)),
             (aten.empty_strided.default, ([2], [1]))]
    for func, args in cases:
        made, want = _dispatch.factory_op(func, args, {}), func(*args)
        assert made.dtype == want.dtype and made.shape == want.shape, (func, args)
    assert _dispatch.factory_op(aten.add.Tensor, (torch.ones(1), torch.ones(1)), {}) is None
