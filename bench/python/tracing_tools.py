"""The tracing tools' cost from Python, each beside its baseline measured in the same run.

    PYTHONPATH=build/python .venv/bin/python bench/python/tracing_tools.py [--loom-bench PATH]

- pure_call_us: a cached loom.assume_pure call with two tensor arguments and a static keyword
  (`f(a, b, scale=2.0)`, [16,16] float32), per call, no sync; the baseline is the same call to
  the undecorated function (two traced ops), and, when a JAX venv is given
  (LOOM_PEER_JAX=path/to/python), jax.jit's dispatch of the same function (synchronous:
  block_until_ready per call), and with LOOM_PEER_TORCH_XLA=path/to/python torch_xla's
  assume_pure of it (calls recorded, one sync per 300).
- mlp_steps_per_s: a 784-256-10 MLP (batch 64, SGD, cross entropy; nn.Linear and optim.SGD,
  the C++ program's step) trained from Python with loom.compile(trace_once=True); the
  baselines are the C++ program's trace_once steps per second (`loom-bench mlp_train`, run as
  a child when found) and jax.jit with donate_argnums in the JAX venv, synchronous per step
  (ratio_mlp_over_jax) and pipelined (ratio_mlp_over_jax_pipelined).
Prints "key value" lines.
"""
import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import time

import loom

ROOT = pathlib.Path(__file__).resolve().parents[2]


def best_rate(step, warm, n, reps=5):
    for _ in range(warm):
        step()
    best = 0.0
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        best = max(best, n / (time.perf_counter() - t0))
    return best


def pure_call_us():
    def f(a, b, scale=1.0):
        return a @ b * scale

    pure = loom.assume_pure(f)
    a, b = loom.randn(16, 16), loom.randn(16, 16)
    loom.sync()
    n = 20000

    def timed(fn):
        out = []
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(n):
                fn(a, b, scale=2.0)
            out.append((time.perf_counter() - t0) / n)
            loom.sync()
        return statistics.median(out) * 1e6

    pure(a, b, scale=2.0)
    return timed(pure), timed(f)


def mlp_loom_steps_per_s():
    """The C++ program's step (bench/nn_bench.cpp's MlpTraining), written in Python: the same
    modules, optimizer and data, so the ratio is the Python layer's cost alone."""
    loom.manual_seed(0)
    model = loom.nn.Sequential(loom.nn.Linear(784, 256), loom.nn.ReLU(), loom.nn.Linear(256, 10))
    opt = loom.optim.SGD(model.parameters(), lr=0.01)
    x = loom.randn(64, 784)
    y = loom.argmax(loom.randn(64, 10), 1)

    @loom.compile(trace_once=True, name="mlp_step")
    def step(x, y):
        loss = loom.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return best_rate(lambda: step(x, y), 30, 200)


def cpp_mlp_steps_per_s(exe):
    if not exe or not pathlib.Path(exe).exists():
        return None
    out = subprocess.run([exe, "mlp_train"], capture_output=True, text=True).stdout
    for line in out.splitlines():  # "  trace_once_steps_per_s   1641   steps/s  ..."
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "trace_once_steps_per_s":
            return float(parts[1])
    return None


JAX_SCRIPT = r"""
import time, numpy as np, jax, jax.numpy as jnp
def f(a, b, scale=1.0):
    return a @ b * scale
jf = jax.jit(f, static_argnames=("scale",))
a = jax.device_put(np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32))
b = jax.device_put(np.random.default_rng(1).standard_normal((16, 16)).astype(np.float32))
jf(a, b, scale=2.0).block_until_ready()
n = 5000; best = 1e9
for _ in range(3):
    t0 = time.perf_counter()
    for _ in range(n):
        jf(a, b, scale=2.0).block_until_ready()
    best = min(best, (time.perf_counter() - t0) / n)
print("jax_jit_call_us", best * 1e6)
"""


XLA_SCRIPT = r"""
import time, torch, torch_xla
from torch_xla.experimental.assume_pure import assume_pure
dev = torch_xla.device()
@assume_pure
def f(a, b, scale=1.0):
    return a @ b * scale
a = torch.randn(16, 16, device=dev); b = torch.randn(16, 16, device=dev)
torch_xla.sync(wait=True)
f(a, b, scale=2.0); torch_xla.sync(wait=True)
n = 300; best = 1e9
for _ in range(3):
    t0 = time.perf_counter()
    for _ in range(n):
        f(a, b, scale=2.0)
    best = min(best, (time.perf_counter() - t0) / n)
    torch_xla.sync(wait=True)
print("torch_xla_pure_call_us", best * 1e6)
"""


def peer_figures(name, var, script, *args, **env):
    """The "key value" lines that `script` (code, or with args a file and its arguments)
    prints in the peer's venv ($var), as a dict."""
    py = os.environ.get(var)
    if not py:
        print(f"# no {name} baseline: set {var}=path/to/venv/bin/python (recipe: "
              "../shared/reference/peers_setup.md)")
        return {}
    cmd = [py, script, *args] if args else [py, "-c", script]
    r = subprocess.run(cmd, capture_output=True, text=True,
                       env=dict(os.environ, **env))
    if r.returncode != 0:
        print(f"# {name} baseline failed:", r.stderr.strip().splitlines()[-1:])
        return {}
    out = {}
    for f in (line.split() for line in r.stdout.splitlines()):
        try:
            if len(f) == 2:
                out[f[0]] = float(f[1])
        except ValueError:
            pass  # a word, like the peer's "version"
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom-bench", default=str(ROOT / "build/bench/loom-bench"))
    args = ap.parse_args()
    pure_us, plain_us = pure_call_us()
    print(f"pure_call_us {pure_us:.3f}")
    print(f"baseline_plain_call_us {plain_us:.3f}")
    xla = peer_figures("PyTorch/XLA", "LOOM_PEER_TORCH_XLA", XLA_SCRIPT, PJRT_DEVICE="CPU")
    if "torch_xla_pure_call_us" in xla:
        print(f"baseline_torch_xla_pure_call_us {xla['torch_xla_pure_call_us']:.1f}")
        print(f"ratio_pure_over_torch_xla {pure_us / xla['torch_xla_pure_call_us']:.4f}")
    mlp = mlp_loom_steps_per_s()
    print(f"mlp_steps_per_s {mlp:.1f}")
    cpp = cpp_mlp_steps_per_s(args.loom_bench)
    if cpp:
        print(f"baseline_cpp_mlp_steps_per_s {cpp:.1f}")
        print(f"ratio_python_over_cpp {mlp / cpp:.3f}")
    jax = peer_figures("JAX", "LOOM_PEER_JAX", JAX_SCRIPT, JAX_PLATFORMS="cpu")
    if "jax_jit_call_us" in jax:
        print(f"baseline_jax_jit_call_us {jax['jax_jit_call_us']:.3f}")
        print(f"ratio_pure_over_jax {pure_us / jax['jax_jit_call_us']:.3f}")
    # The MLP step of loom-bench --peers (bench/peers/jax_peer.py): jax.jit with donate_argnums,
    # synchronous per step (the goal's baseline) and pipelined (JAX's best).
    jmlp = peer_figures("JAX", "LOOM_PEER_JAX", str(ROOT / "bench/peers/jax_peer.py"),
                        "mlp_train", JAX_PLATFORMS="cpu")
    if "steps_per_s" in jmlp:  # synchronous per step, as loom's
        print(f"baseline_jax_mlp_steps_per_s {jmlp['steps_per_s']:.1f}")
        print(f"ratio_mlp_over_jax {mlp / jmlp['steps_per_s']:.3f}")
    if "steps_per_s_pipelined" in jmlp:
        print(f"baseline_jax_mlp_pipelined_steps_per_s {jmlp['steps_per_s_pipelined']:.1f}")
        print(f"ratio_mlp_over_jax_pipelined {mlp / jmlp['steps_per_s_pipelined']:.3f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
