"""What a torch user's reading habits cost, each beside its baseline in the same run.

    PYTHONPATH=build/python .venv/bin/python bench/python/read_habits.py

- item_loop_ratio: steps per second of a training loop that reads only `loss.item()` (no
  sync), over the same loop calling `loom.sync()` before the read. Two models: a 784-256-10
  MLP (batch 64, AdamW) and a small GPT-style decoder (2 layers, dim 128, 4 heads, T 64,
  batch 8, AdamW). The read computes the loss with the optimizer's updates (the state updated
  in place), so the two loops run the same graphs.
- numpy_batch_ratio: the MLP loop fed from one refilled numpy buffer through `from_numpy`
  (a snapshot copy of the shared buffer per traced use) over the same loop fed `loom.tensor`
  copies of the buffer.
Rounds alternate between the two variants; the best of 5 rounds is kept. Prints "key value"
lines.
"""
import time

import numpy as np

import loom
import loom.nn.functional as F
from loom import nn


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.h = h

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / (d // self.h) ** 0.5)
        mask = loom.tril(loom.ones(t, t)) == 0
        att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class Gpt(nn.Module):
    def __init__(self, vocab=65, d=128, h=4, layers=2, t=64):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(t, d)
        self.blocks = nn.ModuleList([Block(d, h) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(loom.arange(idx.shape[1]))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def make(kind):
    loom.manual_seed(0)
    rng = np.random.default_rng(0)
    if kind == "mlp":
        model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
        x = rng.standard_normal((64, 784)).astype(np.float32)
        y = rng.integers(0, 10, 64)
    else:
        model = Gpt()
        x = rng.integers(0, 65, (8, 64))
        y = rng.integers(0, 65, (8, 64))
    opt = loom.optim.AdamW(model.parameters(), lr=1e-3)
    return model, opt, x, y


def loop(kind, sync, feed="tensor"):
    model, opt, x, y = make(kind)
    buf = np.empty_like(x)
    ty = loom.tensor(y)

    def step():
        buf[:] = x
        xb = loom.from_numpy(buf) if feed == "numpy" else loom.tensor(buf)
        opt.zero_grad()
        out = model(xb)
        loss = F.cross_entropy(out.view(-1, out.shape[-1]), ty.view(-1))
        loss.backward()
        opt.step()
        if sync:
            loom.sync()
        return loss.item()
    return step


def rate(step, n):
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    return n / (time.perf_counter() - t0)


def compare(a, b, n, rounds=5):
    """Best steps/s of a and b over alternating rounds (after 10 warm steps each)."""
    for s in (a, b):
        for _ in range(10):
            s()
    best_a = best_b = 0.0
    for _ in range(rounds):
        best_a = max(best_a, rate(a, n))
        best_b = max(best_b, rate(b, n))
    return best_a, best_b


def main():
    for kind, n in (("mlp", 200), ("gpt", 30)):
        item, synced = compare(loop(kind, False), loop(kind, True), n)
        print(f"{kind}_item_steps_per_s {item:.1f}")
        print(f"{kind}_sync_steps_per_s {synced:.1f}")
        print(f"{kind}_item_loop_ratio {item / synced:.3f}")
    shared, copied = compare(loop("mlp", False, "numpy"), loop("mlp", False, "tensor"), 200)
    print(f"mlp_from_numpy_steps_per_s {shared:.1f}")
    print(f"mlp_tensor_copy_steps_per_s {copied:.1f}")
    print(f"numpy_batch_ratio {shared / copied:.3f}")
    print(f"compiles {loom.metrics().compiles}")


if __name__ == "__main__":
    main()
