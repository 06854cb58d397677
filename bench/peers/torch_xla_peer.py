"""PyTorch/XLA 2.9 (XLA:CPU, PJRT_DEVICE=CPU) versions of loom-bench's peer workloads; run by
`loom-bench --peers` with LOOM_PEER_TORCH_XLA=path/to/venv/bin/python.

The seed's own code: the decoder as a for loop and through torch_xla's scan_layers; compile
times from torch_xla's CompileTime metric of the first step; every timed region ends with
torch_xla.sync(wait=True) and xm.wait_device_ops().
"""
import os
import sys

os.environ.setdefault("PJRT_DEVICE", "CPU")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch_xla  # noqa: E402
import torch_xla.core.xla_model as xm  # noqa: E402
import torch_xla.debug.metrics as met  # noqa: E402
from torch_xla.experimental.scan import scan  # noqa: E402
from torch_xla.experimental.scan_layers import scan_layers  # noqa: E402
from torch_models import Decoder  # noqa: E402
from common import (BATCH, CUMSUM_N, DIM, MLP_BATCH, SEQ, best_rate, emit,  # noqa: E402
                    median_ms, parse_args)


def wait():
    torch_xla.sync(wait=True)
    xm.wait_device_ops()


def decoder(layers, use_scan):
    torch.manual_seed(0)
    dev = torch_xla.device()
    run_layers = (lambda ls, h: scan_layers(ls, h, is_layer_pure=True)) if use_scan else None
    model = Decoder(DIM, layers, run_layers).to(dev)
    x = torch.randn(BATCH, SEQ, DIM, device=dev)
    wait()
    return model, x


def train_step(model, x):
    model.zero_grad()
    model(x).mean().backward()
    wait()


def forward(model, x):
    with torch.no_grad():
        out = model(x)
        wait()
    return out


def main():
    args = parse_args(__doc__)
    print("version", torch_xla.__version__)
    # attention: only torch's SDPA is the attention issue's peer; gpt: not written for XLA yet
    if args.work in ("attention", "gpt"):
        print("unsupported 1")
        return
    if args.work == "decoder_forward":
        for key, use_scan in (("forward_ms", False), ("scan_forward_ms", True)):
            model, x = decoder(args.layers, use_scan)
            emit(key, median_ms(lambda: forward(model, x), 7, 2))
    elif args.work == "decoder_train_step":
        for key, use_scan in (("train_step_ms", False), ("scan_train_step_ms", True)):
            model, x = decoder(args.layers, use_scan)
            emit(key, median_ms(lambda: train_step(model, x), args.reps, 2))
    elif args.work == "scan_layers_compile":
        for key, use_scan in (("scan_compile_ms", True), ("loop_compile_ms", False)):
            model, x = decoder(args.layers, use_scan)
            met.clear_all()
            train_step(model, x)
            emit(key, met.metric_data("CompileTime")[1] / 1e6)
    elif args.work == "cumsum_scan":
        dev = torch_xla.device()
        xs = torch.arange(1, CUMSUM_N + 1, dtype=torch.float32, device=dev)

        def run():
            total, ys = scan(lambda c, x: (c + x, c + x), torch.zeros((), device=dev), xs)
            wait()
            return total

        assert float(run().cpu()) == CUMSUM_N * (CUMSUM_N + 1) / 2
        emit("ns_per_iteration", median_ms(run, 21, 2) * 1e6 / CUMSUM_N)
        # The wall time above is mostly scan's tracing on the host, every call; the
        # executable's own time alone:
        met.clear_all()
        median_ms(run, 21, 0)
        _, total_ns, _ = met.metric_data("ExecuteTime")[:3]
        emit("execute_ns_per_iteration", total_ns / 21 / CUMSUM_N)
    else:
        torch.manual_seed(0)
        dev = torch_xla.device()
        model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10)).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(MLP_BATCH, 784, device=dev)
        y = torch.randint(0, 10, (MLP_BATCH,), device=dev)

        def step():
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            wait()

        emit("steps_per_s", best_rate(step, 100))


if __name__ == "__main__":
    main()
