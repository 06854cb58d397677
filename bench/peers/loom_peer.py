"""loom's Python package on the peers' workloads that have a Python program (gpt); run by
`loom-bench --peers` with the build's interpreter and PYTHONPATH=build/python (or
LOOM_PEER_LOOM_PYTHON, with the package importable).

gpt: the model of bench/gpt_bench.cpp written with loom.nn (nn.CausalSelfAttention, the fused
attention), its whole training step under loom.compile(trace_once=True), from common's
weights and batches.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loom  # noqa: E402
import loom.nn as nn  # noqa: E402
import loom.nn.functional as F  # noqa: E402
from common import (GPT_BATCH, GPT_BETAS, GPT_DIM, GPT_EPS, GPT_HEADS, GPT_LAYERS,  # noqa: E402
                    GPT_LR, GPT_T, GPT_WEIGHT_DECAY, gpt_batches, gpt_params, parse_args,
                    run_gpt)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(GPT_DIM)
        self.attn = nn.CausalSelfAttention(GPT_DIM, GPT_HEADS)
        self.ln_2 = nn.LayerNorm(GPT_DIM)
        self.c_fc = nn.Linear(GPT_DIM, 4 * GPT_DIM)
        self.c_proj = nn.Linear(4 * GPT_DIM, GPT_DIM)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.wte = nn.Embedding(vocab, GPT_DIM)
        self.wpe = nn.Embedding(GPT_T, GPT_DIM)
        self.h = nn.ModuleList([Block() for _ in range(GPT_LAYERS)])
        self.ln_f = nn.LayerNorm(GPT_DIM)

    def forward(self, idx):  # [B, T] -> logits [B, T, vocab], the head tied to wte
        x = self.wte(idx) + self.wpe(loom.arange(GPT_T))
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)


# common.gpt_params' names (nanoGPT's) -> this model's
RENAME = (("attn.c_attn.", "attn.qkv."), ("attn.c_proj.", "attn.proj."), ("mlp.", ""))


def gpt():
    batches, vocab = gpt_batches()
    model = GPT(vocab)
    init = {}
    for name, value in gpt_params(vocab):
        for a, b in RENAME:
            name = name.replace(a, b)
        init[name] = value
    model.load_state_dict(init)
    params = list(model.parameters())
    opt = loom.optim.AdamW([{"params": [p for p in params if p.ndim >= 2],
                             "weight_decay": GPT_WEIGHT_DECAY},
                            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}],
                           lr=GPT_LR, betas=GPT_BETAS, eps=GPT_EPS)

    @loom.compile(name="gpt_step", trace_once=True)
    def train_step(x, y):
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(GPT_BATCH * GPT_T, vocab),
                               y.reshape(GPT_BATCH * GPT_T))
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    run_gpt(lambda x, y: train_step(loom.from_numpy(x), loom.from_numpy(y)).item(), batches)


def main():
    args = parse_args(__doc__)
    print("version", loom.__version__ if hasattr(loom, "__version__") else "dev")
    if args.work == "gpt":
        gpt()
    else:
        print("unsupported 1")


if __name__ == "__main__":
    main()
