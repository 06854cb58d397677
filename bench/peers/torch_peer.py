"""PyTorch 2.9 versions of loom-bench's peer workloads, eager (`--mode eager`) and through
torch.compile (Inductor's C++ code generation; `--mode compile`); run by `loom-bench --peers`
with LOOM_PEER_TORCH=path/to/venv/bin/python (the PyTorch/XLA venv's torch 2.9.0 serves).

torch's default thread settings, as the peers choose them on this machine. torch.compile's
compile time is its first step less a steady step (Inductor compiles inside the first call).
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch_models import GPT, Decoder  # noqa: E402
from common import (ATT_B, ATT_D, ATT_H, ATT_T, BATCH, CUMSUM_N, DIM, GPT_BETAS,  # noqa: E402
                    GPT_DIM, GPT_EPS, GPT_HEADS, GPT_LAYERS, GPT_LR, GPT_T, GPT_WEIGHT_DECAY,
                    MLP_BATCH, SEQ, best_rate, emit, gpt_batches, gpt_params, median_ms,
                    parse_args, run_gpt)


def gpt(wrap):
    """nanoGPT's training step (forward through `wrap`, as nanoGPT compiles the model; backward,
    AdamW with decay on the matrices, as its configure_optimizers) from common's weights and
    batches."""
    batches, vocab = gpt_batches()
    model = GPT(vocab, GPT_DIM, GPT_HEADS, GPT_LAYERS, GPT_T)
    params = dict(model.named_parameters())  # lm_head.weight is wte.weight: listed once
    init = gpt_params(vocab)
    assert sorted(params) == sorted(n for n, _ in init), "torch_models.GPT's names changed"
    with torch.no_grad():
        for name, value in init:
            params[name].copy_(torch.from_numpy(value))
    groups = [{"params": [p for p in params.values() if p.dim() >= 2],
               "weight_decay": GPT_WEIGHT_DECAY},
              {"params": [p for p in params.values() if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=GPT_LR, betas=GPT_BETAS, eps=GPT_EPS)
    fn = wrap(model)

    def step(x, y):
        loss = fn(torch.from_numpy(x), torch.from_numpy(y))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    run_gpt(step, batches)


def main():
    mode = "eager"
    if "--mode" in sys.argv:
        i = sys.argv.index("--mode")
        mode = sys.argv[i + 1]
        del sys.argv[i:i + 2]
    if mode not in ("eager", "compile"):
        raise SystemExit(f"torch_peer.py: --mode must be eager or compile, not {mode!r}")
    args = parse_args(__doc__)
    print("version", torch.__version__)
    wrap = torch.compile if mode == "compile" else (lambda m: m)
    if args.work == "gpt":
        gpt(wrap)
    elif args.work in ("decoder_forward", "decoder_train_step", "scan_layers_compile"):
        torch.manual_seed(0)
        model = Decoder(DIM, args.layers)
        fn = wrap(model)
        x = torch.randn(BATCH, SEQ, DIM)

        def train_step():
            model.zero_grad()
            fn(x).mean().backward()

        if args.work == "decoder_forward":
            with torch.no_grad():
                emit("forward_ms", median_ms(lambda: fn(x), 7, 2))
        elif args.work == "decoder_train_step":
            emit("train_step_ms", median_ms(train_step, args.reps, 2))
        elif mode == "compile":
            t0 = time.perf_counter()
            train_step()
            first = (time.perf_counter() - t0) * 1e3
            emit("loop_compile_ms", first - median_ms(train_step, 3, 1))
        else:
            print("unsupported 1")
    elif args.work == "attention":
        if mode == "compile":  # torch.compile runs the same SDPA kernel
            print("unsupported 1")
            return
        for T, reps in zip(ATT_T, (5, 3)):
            torch.manual_seed(1)
            q, k, v, w = (torch.randn(ATT_B, ATT_H, T, ATT_D) for _ in range(4))

            def step():
                leaves = [t.detach().requires_grad_() for t in (q, k, v)]
                y = nn.functional.scaled_dot_product_attention(*leaves)
                (y * w).sum().backward()

            emit(f"fwd_bwd_T{T}_ms", median_ms(step, reps, 1))
    elif args.work == "cumsum_scan":
        if mode == "compile":
            print("unsupported 1")
            return
        xs = torch.arange(1, CUMSUM_N + 1, dtype=torch.float32).reshape(-1, 1)

        def loop():
            acc = torch.zeros(1)
            out = []
            for x in xs:
                acc = acc + x
                out.append(acc)
            return torch.stack(out)

        emit("ns_per_iteration", median_ms(loop, 9, 1) * 1e6 / CUMSUM_N)
    else:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
        fn = wrap(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(MLP_BATCH, 784)
        y = torch.randint(0, 10, (MLP_BATCH,))

        def step():
            opt.zero_grad()
            nn.functional.cross_entropy(fn(x), y).backward()
            opt.step()

        emit("steps_per_s", best_rate(step, 300))


if __name__ == "__main__":
    main()
