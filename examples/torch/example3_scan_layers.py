"""Seed Example 3 as a torch_xla user wrote it, on loom: 50 layers, dim 512."""
import sys
import time

import torch
import torch.nn as nn
import loom
import loom.torch as lt
from loom.torch import scan_layers


class DecoderLayer(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.linear = nn.Linear(dim, dim)
        self.act = nn.GELU()

    def forward(self, x):
        return self.act(self.linear(x)) + x  # residual


class Decoder(nn.Module):
    def __init__(self, dim, num_layers):
        super().__init__()
        self.layers = nn.ModuleList([
            DecoderLayer(dim) for _ in range(num_layers)
        ])
        self.norm = nn.LayerNorm(dim)

    # AFTER: scan_layers — single compilation
    def forward(self, x):
        x = scan_layers(self.layers, x, is_layer_pure=True)
        return self.norm(x)


layers = int(sys.argv[1]) if len(sys.argv) > 1 else 50
# Usage
model = Decoder(dim=512, num_layers=layers).to(lt.device())
x = torch.randn(4, 512, 512, device=lt.device())
loom.reset_metrics()
t0 = time.perf_counter()
output = model(x)
lt.sync()
first = time.perf_counter() - t0
t0 = time.perf_counter()
output = model(x)
lt.sync()
steady = time.perf_counter() - t0
m = lt.metrics()
print(f"Output shape: {output.shape}")
print(f"{layers} layers: layer traced {m.bodies_traced} time(s); {m.compiles} compilation(s); "
      f"first call {first * 1e3:.0f} ms, second {steady * 1e3:.0f} ms")
