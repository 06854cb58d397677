"""A nanoGPT, written as its repository writes it (torch.nn modules, F.scaled_dot_product_attention
where torch has it, tied embeddings, AdamW with weight decay on the matrices, clip_grad_norm_),
trained character by character on the opening of A Tale of Two Cities on loom.torch, beside the
same model on torch eager from the same weights and batches. The loom run differs from the
eager one only in the device. Prints both loss curves, their largest relative difference, the
steady step time of each and loom's compile count.

    PYTHONPATH=build/python .venv/bin/python examples/torch/gpt.py [steps]
"""
import copy
import math
import pathlib
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import loom
import loom.torch as lt

LAYERS, HEADS, EMBD, BLOCK, BATCH = 4, 4, 64, 32, 16


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(EMBD, 3 * EMBD)
        self.c_proj = nn.Linear(EMBD, EMBD)
        self.flash = hasattr(F, "scaled_dot_product_attention")  # torch >= 2.0
        if not self.flash:
            self.register_buffer("bias", torch.tril(torch.ones(BLOCK, BLOCK))
                                 .view(1, 1, BLOCK, BLOCK))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(EMBD, dim=2)
        k = k.view(B, T, HEADS, C // HEADS).transpose(1, 2)
        q = q.view(B, T, HEADS, C // HEADS).transpose(1, 2)
        v = v.view(B, T, HEADS, C // HEADS).transpose(1, 2)
        if self.flash:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0,
                                               is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = nn.Linear(EMBD, 4 * EMBD)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * EMBD, EMBD)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(EMBD)
        self.attn = CausalSelfAttention()
        self.ln_2 = nn.LayerNorm(EMBD)
        self.mlp = MLP()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, EMBD),
            wpe=nn.Embedding(BLOCK, EMBD),
            h=nn.ModuleList([Block() for _ in range(LAYERS)]),
            ln_f=nn.LayerNorm(EMBD),
        ))
        self.lm_head = nn.Linear(EMBD, vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * LAYERS))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets):
        device = idx.device
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas):
        params = [p for p in self.parameters() if p.requires_grad]
        optim_groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(optim_groups, lr=learning_rate, betas=betas)


def get_lr(it, steps, learning_rate=3e-3, warmup=10):
    """nanoGPT's schedule: linear warmup, then cosine decay to a tenth."""
    if it < warmup:
        return learning_rate * (it + 1) / (warmup + 1)
    ratio = (it - warmup) / max(1, steps - warmup)
    return learning_rate / 10 + 0.5 * (1 + math.cos(math.pi * ratio)) * learning_rate * 0.9


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    root = pathlib.Path(__file__).resolve().parents[2]
    text = (root / "data/tale_of_two_cities.txt").read_text()
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text], dtype=torch.long)
    g = torch.Generator().manual_seed(1337)
    batches = []
    for _ in range(steps):
        ix = torch.randint(len(data) - BLOCK, (BATCH,), generator=g)
        batches.append((torch.stack([data[i:i + BLOCK] for i in ix]),
                        torch.stack([data[i + 1:i + 1 + BLOCK] for i in ix])))

    torch.manual_seed(1337)
    ref = GPT(len(chars))
    device = lt.device()
    model = copy.deepcopy(ref).to(device)  # the only change for loom: the device
    runs = {"loom.torch": (model, device), "torch eager": (ref, "cpu")}
    opts = {k: m.configure_optimizers(0.1, 3e-3, (0.9, 0.95)) for k, (m, _) in runs.items()}
    losses = {k: [] for k in runs}
    times = {k: [] for k in runs}
    compiles = []
    loom.reset_metrics()
    for it, (x, y) in enumerate(batches):
        for name, (m, dev) in runs.items():  # interleaved: both times from the same moments
            t0 = time.perf_counter()
            for group in opts[name].param_groups:
                group["lr"] = get_lr(it, steps)
            _, loss = m(x.to(dev), y.to(dev))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            opts[name].step()
            opts[name].zero_grad(set_to_none=True)
            losses[name].append(loss.item())  # loom: the step's one graph runs here
            times[name].append(time.perf_counter() - t0)
        compiles.append(loom.metrics().compiles)

    params = sum(p.numel() for p in ref.parameters())
    print(f"nanoGPT: {LAYERS} layers, {HEADS} heads, {EMBD} wide, context {BLOCK}, batch "
          f"{BATCH}, {params / 1e3:.0f}k parameters, {len(chars)} characters; AdamW, "
          f"{steps} steps; torch {torch.__version__}")
    print(f"{'step':>5} {'loom.torch':>12} {'torch eager':>12}")
    for it in list(range(0, steps, 10)) + [steps - 1]:
        print(f"{it:>5} {losses['loom.torch'][it]:>12.6f} {losses['torch eager'][it]:>12.6f}")
    rel = max(abs(a - b) / abs(b) for a, b in zip(losses["loom.torch"], losses["torch eager"]))
    print(f"max relative loss difference: {rel:.2e}")
    warm = min(5, steps - 1)  # the first steps compile (loom) and warm up (both)
    steady = {k: statistics.median(v[warm:]) * 1e3 for k, v in times.items()}
    print(f"steady step (median of steps {warm}-{steps - 1}): loom.torch "
          f"{steady['loom.torch']:.1f} "
          f"ms, torch eager {steady['torch eager']:.1f} ms")
    print(f"loom: {compiles[-1]} compilation(s) in {steps} steps, "
          f"{compiles[-1] - compiles[min(1, steps - 1)]} "
          f"after step 1; {lt.aten_ops_lowered()} aten ops lowered")


if __name__ == "__main__":
    main()
