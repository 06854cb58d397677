"""The seed's compile-time table from Python: the Example 3 decoder (50 layers, dim 512,
x [4,512,512]), forward + backward, as a for loop and with scan_layers; compile time of the
first step and the steady step time. With LOOM_PEER_TORCH_XLA=path/to/python (a PyTorch/XLA
2.9 venv, recipe in ../shared/reference/peers_setup.md) the same table for PyTorch/XLA on the
CPU, from the seed's own code, in the same run.

    PYTHONPATH=build/python .venv/bin/python examples/python/seed_table.py [LAYERS] [STEPS]
"""
import os
import statistics
import subprocess
import sys
import time

import loom
import loom.nn as nn
from loom import scan_layers

LAYERS = int(sys.argv[1]) if len(sys.argv) > 1 else 50
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 3


class DecoderLayer(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.linear = nn.Linear(dim, dim)
        self.act = nn.GELU()

    def forward(self, x):
        return self.act(self.linear(x)) + x  # residual


class Decoder(nn.Module):
    def __init__(self, dim, num_layers, scan):
        super().__init__()
        self.layers = nn.ModuleList([DecoderLayer(dim) for _ in range(num_layers)])
        self.norm = nn.LayerNorm(dim)
        self.scan = scan

    def forward(self, x):
        if self.scan:
            x = scan_layers(self.layers, x, is_layer_pure=True)
        else:
            for layer in self.layers:
                x = layer(x)
        return self.norm(x)


def measure(scan):
    loom.manual_seed(0)
    model = Decoder(512, LAYERS, scan)
    x = loom.randn(4, 512, 512)
    loom.sync()

    def step():
        model.zero_grad()
        loom.mean(model(x)).backward()
        loom.sync()

    loom.reset_metrics()
    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    compile_s = loom.metrics().compile_seconds
    times = []
    for _ in range(STEPS):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return compile_s, first, statistics.median(times)


XLA_SCRIPT = r"""
import statistics, sys, time
import torch, torch.nn as nn, torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met
from torch_xla.experimental.scan_layers import scan_layers
layers, steps, use_scan = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "scan"
class DecoderLayer(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.linear = nn.Linear(dim, dim)
        self.act = nn.GELU()
    def forward(self, x):
        return self.act(self.linear(x)) + x
class Decoder(nn.Module):
    def __init__(self, dim, num_layers):
        super().__init__()
        self.layers = nn.ModuleList([DecoderLayer(dim) for _ in range(num_layers)])
        self.norm = nn.LayerNorm(dim)
    def forward(self, x):
        if use_scan:
            x = scan_layers(self.layers, x, is_layer_pure=True)
        else:
            for layer in self.layers:
                x = layer(x)
        return self.norm(x)
dev = torch_xla.device()
model = Decoder(512, layers).to(dev)
x = torch.randn(4, 512, 512, device=dev)
torch_xla.sync(wait=True); xm.wait_device_ops()
def step():
    model.zero_grad()
    loss = model(x).mean()
    loss.backward()
    torch_xla.sync(wait=True); xm.wait_device_ops()
met.clear_all()
t0 = time.perf_counter(); step(); first = time.perf_counter() - t0
compile_s = met.metric_data("CompileTime")[1] / 1e9 if met.metric_data("CompileTime") else 0.0
ts = []
for _ in range(steps):
    t0 = time.perf_counter(); step(); ts.append(time.perf_counter() - t0)
print(compile_s, first, statistics.median(ts))
"""


def measure_xla(py, scan):
    env = dict(os.environ, PJRT_DEVICE="CPU")
    env.pop("XLA_PERSISTENT_CACHE_PATH", None)
    r = subprocess.run([py, "-c", XLA_SCRIPT, str(LAYERS), str(STEPS),
                        "scan" if scan else "loop"], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip().splitlines()[-1] if r.stderr else "failed")
    c, f, s = (float(v) for v in r.stdout.split()[-3:])
    return c, f, s


def row(name, figures):
    c, f, s = figures
    return f"| {name:<22} | {c * 1e3:>10.0f} | {f * 1e3:>14.0f} | {s * 1e3:>12.0f} |"


def main():
    print(f"Seed decoder from Python: {LAYERS} layers, dim 512, x [4,512,512], forward + backward")
    print("| loom                   | compile ms | first step ms | step ms (median of "
          f"{STEPS}) |")
    print("|---|---|---|---|")
    loop = measure(False)
    scan = measure(True)
    print(row("for loop", loop))
    print(row("scan_layers", scan))
    py = os.environ.get("LOOM_PEER_TORCH_XLA")
    if not py:
        print("PyTorch/XLA: not measured; set LOOM_PEER_TORCH_XLA=path/to/venv/bin/python "
              "(recipe: ../shared/reference/peers_setup.md) for its table in the same run")
        return
    try:
        xloop, xscan = measure_xla(py, False), measure_xla(py, True)
    except RuntimeError as e:
        print(f"PyTorch/XLA: failed ({e})")
        return
    print("| PyTorch/XLA 2.9 (CPU)  | compile ms | first step ms | step ms |")
    print("|---|---|---|---|")
    print(row("for loop", xloop))
    print(row("scan_layers", xscan))
    print(f"loom/XLA compile: for loop {loop[0] / xloop[0]:.3f}, scan_layers "
          f"{scan[0] / xscan[0]:.3f}; step: for loop {loop[2] / xloop[2]:.2f}, scan_layers "
          f"{scan[2] / xscan[2]:.2f}")


if __name__ == "__main__":
    main()
