"""train_lm from Python: a small causal transformer language model, trained character by
character on the opening of A Tale of Two Cities (data/tale_of_two_cities.txt).

Embedding + learned positions, 4 pre-norm blocks (causal self-attention and an MLP) run with
scan_layers, a final LayerNorm and a linear head; AdamW; the whole training step compiled with
loom.compile(trace_once=True), so after the first step it is neither traced nor compiled
again. The same model as examples/train_lm.cpp. Prints the loss as it falls and a sample.

    PYTHONPATH=build/python .venv/bin/python examples/python/train_lm.py [steps] [path]
"""
import pathlib
import sys
import time

import numpy as np

import loom
import loom.nn as nn
import loom.nn.functional as F

DIM, HEADS, LAYERS, CONTEXT, BATCH = 64, 4, 4, 32, 16


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(DIM)
        self.attn = nn.CausalSelfAttention(DIM, HEADS)
        self.ln2 = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, 4 * DIM)
        self.down = nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        h = x + self.attn(self.ln1(x))
        return h + self.down(F.gelu(self.up(self.ln2(h))))


class LanguageModel(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.tok = nn.Embedding(vocab, DIM)
        self.pos = nn.Embedding(CONTEXT, DIM)
        self.blocks = nn.ModuleList([Block() for _ in range(LAYERS)])
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, vocab)

    def forward(self, tokens):  # [batch, T] -> [batch, T, vocab]
        positions = loom.arange(tokens.shape[1])
        x = self.tok(tokens) + self.pos(positions)
        x = loom.scan_layers(self.blocks, x)
        return self.head(self.norm(x))


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    root = pathlib.Path(__file__).resolve().parents[2]
    path = pathlib.Path(sys.argv[2]) if len(sys.argv) > 2 else root / "data/tale_of_two_cities.txt"
    text = path.read_text()
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    vocab = len(chars)
    print(f"train_lm (Python): {len(text)} characters, vocabulary {vocab}, {LAYERS} blocks of "
          f"dim {DIM} (scan_layers)")
    loom.manual_seed(0)
    model = LanguageModel(vocab)
    opt = loom.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.99), eps=1e-8,
                           weight_decay=0.01)

    @loom.compile(name="train_lm_step", trace_once=True)
    def train_step(x, y):
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(BATCH * CONTEXT, vocab), y.reshape(BATCH * CONTEXT))
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    # The text as class indices once; a batch is a gather of BATCH random windows (numpy), its
    # inputs and targets each a contiguous array that loom.from_numpy shares. Every step's
    # window starts are drawn up front: the first numpy call after a step runs on caches the
    # step has flushed (130 us for one rng.integers here, 8 us for the next).
    ids = np.array([index[c] for c in text], dtype=np.int64)
    window = np.arange(CONTEXT)
    starts = np.random.default_rng(1).integers(0, len(text) - CONTEXT - 1, (steps, BATCH))
    loom.reset_metrics()
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        at = starts[step - 1][:, None] + window
        loss = train_step(loom.from_numpy(ids[at]), loom.from_numpy(ids[at + 1]))
        if step == 1 or step % 50 == 0 or step == steps:
            print(f"  step {step:4d}  loss {loss.item():.4f}")
        if step == 1:
            t1 = time.perf_counter()  # after the first step (traced and compiled)
            executed1 = loom.metrics().execute_seconds
    end = time.perf_counter()
    dt = end - t0
    m = loom.metrics()
    print(f"  {steps} steps in {dt:.2f} s ({dt / steps * 1e3:.1f} ms/step); compiles "
          f"{m.compiles}, compile {m.compile_seconds:.2f} s, bodies traced {m.bodies_traced}")
    if steps > 1:
        outside = (end - t1) - (m.execute_seconds - executed1)
        print(f"  steady: {(end - t1) / (steps - 1) * 1e3:.2f} ms/step (steps 2-{steps}); "
              f"outside execute: {outside / (steps - 1) * 1e6:.0f} us/step")
    sample = text[:CONTEXT]
    with loom.no_grad():
        model.eval()
        for _ in range(80):
            ctx = [index[c] for c in sample[-CONTEXT:]]
            logits = model(loom.tensor([ctx]))
            sample += chars[logits[0][CONTEXT - 1].argmax().item()]
    print(f'  sample: "{sample}"')


if __name__ == "__main__":
    main()
