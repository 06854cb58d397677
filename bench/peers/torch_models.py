"""The seed decoder (Example 3) in torch, for torch_peer.py and torch_xla_peer.py: LAYERS x
[Linear(DIM, DIM) -> exact GELU -> + residual], then LayerNorm(DIM). `scan`, when given, runs
the layers instead of the loop (torch_xla's scan_layers). GPT: nanoGPT's model, for the gpt
work."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class DecoderLayer(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.linear = nn.Linear(dim, dim)
        self.act = nn.GELU()  # exact erf form, as loom's gelu

    def forward(self, x):
        return self.act(self.linear(x)) + x


class Decoder(nn.Module):
    def __init__(self, dim, num_layers, scan=None):
        super().__init__()
        self.layers = nn.ModuleList([DecoderLayer(dim) for _ in range(num_layers)])
        self.norm = nn.LayerNorm(dim)
        self.scan = scan

    def forward(self, x):
        if self.scan is not None:
            x = self.scan(self.layers, x)
        else:
            for layer in self.layers:
                x = layer(x)
        return self.norm(x)


class GPTBlock(nn.Module):
    """nanoGPT's Block: pre-norm causal self-attention (F.scaled_dot_product_attention) and a
    GELU MLP, each added to the residual stream."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(dim)
        self.attn = nn.Module()
        self.attn.c_attn = nn.Linear(dim, 3 * dim)
        self.attn.c_proj = nn.Linear(dim, dim)
        self.ln_2 = nn.LayerNorm(dim)
        self.mlp = nn.Module()
        self.mlp.c_fc = nn.Linear(dim, 4 * dim)
        self.mlp.c_proj = nn.Linear(4 * dim, dim)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2)
                   for t in self.attn.c_attn(self.ln_1(x)).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    """nanoGPT's GPT (no dropout): token and learned position embeddings, blocks, a final
    LayerNorm, the LM head tied to the token embedding; forward returns the mean cross entropy.
    Parameter names are common.gpt_params'."""

    def __init__(self, vocab, dim, heads, layers, block):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(block, dim)
        self.h = nn.ModuleList([GPTBlock(dim, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx, targets):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
