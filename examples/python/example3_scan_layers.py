"""Seed Example 3: scan_layers for a decoder, on loom (50 layers, dim 512)."""
import sys
import time

import loom
import loom.nn as nn
from loom import scan_layers


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

    # BEFORE: unrolled for loop — long compile time
    # def forward(self, x):
    #     for layer in self.layers:
    #         x = layer(x)
    #     return self.norm(x)

    # AFTER: scan_layers — single compilation
    def forward(self, x):
        x = scan_layers(self.layers, x, is_layer_pure=True)
        return self.norm(x)


# Usage
layers = int(sys.argv[1]) if len(sys.argv) > 1 else 50
model = Decoder(dim=512, num_layers=layers)
x = loom.randn(4, 512, 512)
loom.sync()
loom.reset_metrics()
t0 = time.perf_counter()
output = model(x)
loom.sync()
dt = time.perf_counter() - t0
m = loom.metrics()
print(f"Output shape: {output.shape}")
print(f"{layers} layers: {m.bodies_traced} bodies traced (the first layer's forward, as the "
      f"scan's body), {m.compiles} compilation(s) ({m.compile_seconds * 1e3:.0f} ms), "
      f"first step {dt * 1e3:.0f} ms")
