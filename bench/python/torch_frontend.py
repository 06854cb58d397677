"""loom.torch's costs, each beside its baseline measured in the same run (rounds interleaved,
medians).

    PYTHONPATH=build/python .venv/bin/python bench/python/torch_frontend.py [--layers N]

- pure_call_us: a cached lt.assume_pure call of a torch function with two tensors and a static
  keyword (`f(a, b, scale=2.0)` = a @ b * scale, [16,16] float32), per call, the sync after the
  timed calls (as torch_xla's figure: its calls timed, then torch_xla.sync); beside
  loom.assume_pure of the same function in loom's own API.
- torch_trace_us_per_op: tracing through loom.torch, `x = x * 1.0001 + y` on 16-element
  LoomTensors (aten mul and add, no sync); beside the same chain in loom's own API
  (bench/python/trace_overhead.py's).
- decoder: the seed decoder (LAYERS x [Linear(512, 512) -> GELU -> + residual], LayerNorm;
  x [4, 512, 512]; bench/peers/torch_models.py), one training step (forward, mean, backward,
  SGD step, zero_grad) per round: the torch model with torch.optim.SGD on loom.torch (synced
  per step), the same model in loom's own API (loom.nn, loom.optim.SGD), torch eager and
  (torch >= 2.0) torch.compile's Inductor; steady step ms, the median of the rounds after two
  warm-up steps each; the ratio to the best peer (eager, Inductor, torch_xla).
- torch >= 2.0: torch.compile(model, backend="loom") beside torch.compile's default backend
  (Inductor) on the same decoder step (skipped with a message on 1.13).
With LOOM_PEER_TORCH_XLA=path/to/python, torch_xla's assume_pure call, per-op tracing and
decoder step (the same model, run in that venv after the others). Prints "key value" lines.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

import torch

import loom
import loom.nn
import loom.optim
import loom.torch as lt

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "peers"))
from torch_models import Decoder  # noqa: E402

DIM, BATCH, SEQ = 512, 4, 512


def emit(key, value, fmt=".3f"):
    print(f"{key} {value:{fmt}}", flush=True)


def interleaved(fns, rounds):
    """{name: median seconds of fn()} over `rounds`, one call of each fn per round."""
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def pure_calls(n=20000, rounds=5):
    def f(a, b, scale=1.0):
        return a @ b * scale

    ta, tb = torch.randn(16, 16, device=lt.device()), torch.randn(16, 16, device=lt.device())
    la, lb = loom.randn(16, 16), loom.randn(16, 16)
    torch_pure, loom_pure = lt.assume_pure(f), loom.assume_pure(f)
    torch_pure(ta, tb, scale=2.0)
    loom_pure(la, lb, scale=2.0)
    loom.sync()

    def calls(pure, a, b):
        t0 = time.perf_counter()
        for _ in range(n):
            pure(a, b, scale=2.0)
        t = time.perf_counter() - t0
        loom.sync()  # after the timing, as torch_xla's figure syncs after its calls
        return t

    times = {"torch": [], "loom": []}
    for _ in range(rounds):  # interleaved; medians (torch_xla's figure is its best of 3)
        times["torch"].append(calls(torch_pure, ta, tb))
        times["loom"].append(calls(loom_pure, la, lb))
    return (statistics.median(times["torch"]) / n * 1e6,
            statistics.median(times["loom"]) / n * 1e6)


def trace_per_op(ops=100_000, rounds=5):
    def chain(make):
        def run():
            x, y = make(), make()
            for _ in range(ops // 2):
                x = x * 1.0001 + y
            del x  # the pending graph compacts itself as the chain's tensors die
            loom.sync()
        return run

    dev = lt.device()
    t = interleaved({"torch": chain(lambda: torch.ones(16, device=dev)),
                     "loom": chain(lambda: loom.ones(16))}, rounds)
    return t["torch"] / ops * 1e6, t["loom"] / ops * 1e6


class LoomDecoderLayer(loom.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.linear = loom.nn.Linear(dim, dim)
        self.act = loom.nn.GELU()

    def forward(self, x):
        return self.act(self.linear(x)) + x


class LoomDecoder(loom.nn.Module):
    """The seed decoder in loom's own API, as torch_models.Decoder (the layers' loop)."""

    def __init__(self, dim, num_layers):
        super().__init__()
        self.layers = loom.nn.ModuleList([LoomDecoderLayer(dim) for _ in range(num_layers)])
        self.norm = loom.nn.LayerNorm(dim)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


def torch_step(model, x, opt, sync=None):
    def step():
        model(x).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if sync:
            sync()
    return step


def decoder_steps(layers, rounds):
    torch.manual_seed(0)
    ref = Decoder(DIM, layers)
    x = torch.randn(BATCH, SEQ, DIM)
    on_loom = Decoder(DIM, layers).to(lt.device())  # weights do not change the time
    loom.manual_seed(0)
    native = LoomDecoder(DIM, layers)
    lx = loom.randn(BATCH, SEQ, DIM)
    native_opt = loom.optim.SGD(native.parameters(), lr=1e-3)

    def native_step():
        native(lx).mean().backward()
        native_opt.step()
        native_opt.zero_grad()
        loom.sync()

    fns = {"loom_torch": torch_step(on_loom, x.to(lt.device()),
                                    torch.optim.SGD(on_loom.parameters(), lr=1e-3), lt.sync),
           "loom_native": native_step,
           "torch_eager": torch_step(ref, x, torch.optim.SGD(ref.parameters(), lr=1e-3))}
    if hasattr(torch, "compile"):  # Inductor, the peer the goal names with eager
        inductor = Decoder(DIM, layers)
        fns["torch_compile"] = torch_step(torch.compile(inductor), x,
                                          torch.optim.SGD(inductor.parameters(), lr=1e-3))
    for fn in fns.values():  # warm-up: the compiles, allocators, thread pools
        fn()
        fn()
    return {k: v * 1e3 for k, v in interleaved(fns, rounds).items()}


def compiled_steps(layers, rounds):
    torch.manual_seed(0)
    x = torch.randn(BATCH, SEQ, DIM)
    models = {"loom": Decoder(DIM, layers), "inductor": Decoder(DIM, layers)}
    fns = {}
    for backend, m in models.items():
        compiled = torch.compile(m, backend=backend)
        fns[backend] = torch_step(compiled, x, torch.optim.SGD(m.parameters(), lr=1e-3))
    first = {}
    for k, fn in fns.items():
        t0 = time.perf_counter()
        fn()  # compiles
        first[k] = time.perf_counter() - t0
        fn()
    steady = interleaved(fns, rounds)
    return {k: v * 1e3 for k, v in steady.items()}, {k: v * 1e3 for k, v in first.items()}


XLA_SCRIPT = r"""
import sys, time, torch, torch_xla
from torch_xla.experimental.assume_pure import assume_pure
dev = torch_xla.device()
@assume_pure
def f(a, b, scale=1.0):
    return a @ b * scale
a = torch.randn(16, 16, device=dev); b = torch.randn(16, 16, device=dev)
f(a, b, scale=2.0); torch_xla.sync(wait=True)
n = 300; best = 1e9
for _ in range(3):
    t0 = time.perf_counter()
    for _ in range(n):
        f(a, b, scale=2.0)
    best = min(best, (time.perf_counter() - t0) / n)
    torch_xla.sync(wait=True)
print("torch_xla_pure_call_us", best * 1e6)
ops = 20000; best = 1e9
for _ in range(3):
    x = torch.ones(16, device=dev); y = torch.ones(16, device=dev)
    t0 = time.perf_counter()
    for _ in range(ops // 2):
        x = x * 1.0001 + y
    best = min(best, (time.perf_counter() - t0) / ops)
    torch_xla.sync(wait=True)
print("torch_xla_trace_us_per_op", best * 1e6)
if LAYERS:  # the seed decoder's training step (torch.optim.SGD), after two warm-up steps
    sys.path.insert(0, PEERS)
    from torch_models import Decoder
    torch.manual_seed(0)
    m = Decoder(512, LAYERS).to(dev)
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    xd = torch.randn(4, 512, 512).to(dev)
    times = []
    for i in range(ROUNDS + 2):
        t0 = time.perf_counter()
        m(xd).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch_xla.sync(wait=True)
        times.append(time.perf_counter() - t0)
    times = sorted(times[2:])
    print("torch_xla_decoder_step_ms", times[len(times) // 2] * 1e3)
"""


def torch_xla_figures(layers=0, rounds=0):
    py = os.environ.get("LOOM_PEER_TORCH_XLA")
    if not py:
        print("# no PyTorch/XLA baseline: set LOOM_PEER_TORCH_XLA=path/to/venv/bin/python "
              "(recipe: ../shared/reference/peers_setup.md)")
        return {}
    peers = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "peers")
    script = f"LAYERS, ROUNDS, PEERS = {layers}, {rounds}, {peers!r}\n" + XLA_SCRIPT
    r = subprocess.run([py, "-c", script], capture_output=True, text=True,
                       env=dict(os.environ, PJRT_DEVICE="CPU"))
    if r.returncode != 0:
        print("# PyTorch/XLA baseline failed:", r.stderr.strip().splitlines()[-1:])
        return {}
    return {f[0]: float(f[1]) for f in (line.split() for line in r.stdout.splitlines())
            if len(f) == 2 and f[0].startswith("torch_xla_")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=9,
                    help="decoder steps timed per system (medians; 5 left ratios noisy here)")
    args = ap.parse_args()
    print(f"torch_version {torch.__version__}")
    print(f"torch_threads {torch.get_num_threads()}")

    pure_us, native_pure_us = pure_calls()
    emit("pure_call_us", pure_us)
    emit("baseline_loom_pure_call_us", native_pure_us)
    emit("ratio_pure_over_loom", pure_us / native_pure_us)
    op_us, native_op_us = trace_per_op()
    emit("torch_trace_us_per_op", op_us)
    emit("baseline_loom_trace_us_per_op", native_op_us)
    emit("ratio_trace_over_loom", op_us / native_op_us)
    xla = torch_xla_figures(args.layers, args.rounds)
    if xla:
        emit("baseline_torch_xla_pure_call_us", xla["torch_xla_pure_call_us"])
        emit("ratio_pure_over_torch_xla", pure_us / xla["torch_xla_pure_call_us"])
        emit("baseline_torch_xla_trace_us_per_op", xla["torch_xla_trace_us_per_op"])
        emit("ratio_trace_over_torch_xla", op_us / xla["torch_xla_trace_us_per_op"])

    print(f"decoder_layers {args.layers}")
    ms = decoder_steps(args.layers, args.rounds)
    emit("decoder_loom_torch_step_ms", ms["loom_torch"], ".1f")
    emit("baseline_decoder_loom_native_step_ms", ms["loom_native"], ".1f")
    emit("baseline_decoder_torch_eager_step_ms", ms["torch_eager"], ".1f")
    emit("ratio_loom_torch_over_native", ms["loom_torch"] / ms["loom_native"])
    emit("ratio_loom_torch_over_eager", ms["loom_torch"] / ms["torch_eager"])
    peers = {"torch_eager": ms["torch_eager"]}
    if "torch_compile" in ms:
        emit("baseline_decoder_torch_compile_step_ms", ms["torch_compile"], ".1f")
        peers["torch_compile"] = ms["torch_compile"]
    if "torch_xla_decoder_step_ms" in xla:
        emit("baseline_decoder_torch_xla_step_ms", xla["torch_xla_decoder_step_ms"], ".1f")
        peers["torch_xla"] = xla["torch_xla_decoder_step_ms"]
    best = min(peers, key=peers.get)
    emit("ratio_loom_torch_over_best_peer", ms["loom_torch"] / peers[best])
    print(f"best_peer {best}")

    if not hasattr(torch, "compile"):
        print(f"# torch.compile comparison skipped: torch {torch.__version__} has no "
              f"torch.compile (needs torch >= 2.0)")
        return
    steady, first = compiled_steps(args.layers, args.rounds)
    emit("decoder_compile_loom_step_ms", steady["loom"], ".1f")
    emit("baseline_decoder_compile_inductor_step_ms", steady["inductor"], ".1f")
    emit("ratio_compile_loom_over_inductor", steady["loom"] / steady["inductor"])
    emit("decoder_compile_loom_first_step_ms", first["loom"], ".0f")
    emit("decoder_compile_inductor_first_step_ms", first["inductor"], ".0f")


if __name__ == "__main__":
    main()
