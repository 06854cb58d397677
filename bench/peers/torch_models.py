"""The seed decoder (Example 3) in torch, for torch_peer.py and torch_xla_peer.py: LAYERS x
[Linear(DIM, DIM) -> exact GELU -> + residual], then LayerNorm(DIM). `scan`, when given, runs
the layers instead of the loop (torch_xla's scan_layers)."""
import torch.nn as nn


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
