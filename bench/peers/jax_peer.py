"""JAX (XLA:CPU) versions of loom-bench's peer workloads; run by `loom-bench --peers` with
LOOM_PEER_JAX=path/to/venv/bin/python (JAX 0.12, JAX_PLATFORMS=cpu).

The decoder as a Python loop under jax.jit (the unrolled form) and as lax.scan over stacked
weights; compile times are the AOT `lowered.compile()` alone (loom's compile_ms excludes
tracing too); every timed region ends with block_until_ready().
"""
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from common import (BATCH, CUMSUM_N, DIM, GPT_BETAS, GPT_EPS, GPT_HEADS,  # noqa: E402
                    GPT_LAYERS, GPT_LR, GPT_WEIGHT_DECAY, MLP_BATCH, SEQ, best_rate, emit,
                    gpt_batches, gpt_params, median_ms, parse_args, run_gpt)


def layer(h, w, b):
    return jax.nn.gelu(h @ w.T + b, approximate=False) + h


def layer_norm(h, g, beta):
    mu = h.mean(-1, keepdims=True)
    var = ((h - mu) ** 2).mean(-1, keepdims=True)
    return (h - mu) / jnp.sqrt(var + 1e-5) * g + beta


def decoder(layers):
    rng = np.random.default_rng(0)
    put = jax.device_put
    w = put(rng.normal(0, 0.02, (layers, DIM, DIM)).astype(np.float32))
    b = put(rng.normal(0, 0.02, (layers, DIM)).astype(np.float32))
    norm = (put(np.ones(DIM, np.float32)), put(np.zeros(DIM, np.float32)))
    x = put(rng.standard_normal((BATCH, SEQ, DIM)).astype(np.float32))
    ws = [put(np.asarray(w[i])) for i in range(layers)]
    bs = [put(np.asarray(b[i])) for i in range(layers)]

    def loop(params, x):
        ws, bs, norm = params
        h = x
        for wi, bi in zip(ws, bs):
            h = layer(h, wi, bi)
        return layer_norm(h, *norm)

    def scan(params, x):
        w, b, norm = params
        h, _ = jax.lax.scan(lambda h, wb: (layer(h, *wb), None), x, (w, b))
        return layer_norm(h, *norm)

    return (loop, (ws, bs, norm)), (scan, (w, b, norm)), x


def gpt_loss(p, idx, targets):
    """nanoGPT's forward (no dropout) and mean cross entropy; p by common.gpt_params' names,
    the LM head tied to wte."""
    B, T = idx.shape
    x = p["wte.weight"][idx] + p["wpe.weight"][:T]
    C = x.shape[-1]
    for i in range(GPT_LAYERS):
        h = lambda name: p[f"h.{i}.{name}"]  # noqa: E731
        qkv = layer_norm(x, h("ln_1.weight"), h("ln_1.bias")) @ h("attn.c_attn.weight").T
        q, k, v = jnp.split((qkv + h("attn.c_attn.bias")).reshape(B, T, 3 * GPT_HEADS, -1), 3,
                            axis=2)
        y = jax.nn.dot_product_attention(q, k, v, is_causal=True).reshape(B, T, C)
        x = x + y @ h("attn.c_proj.weight").T + h("attn.c_proj.bias")
        u = layer_norm(x, h("ln_2.weight"), h("ln_2.bias")) @ h("mlp.c_fc.weight").T
        u = jax.nn.gelu(u + h("mlp.c_fc.bias"), approximate=False)
        x = x + u @ h("mlp.c_proj.weight").T + h("mlp.c_proj.bias")
    logits = layer_norm(x, p["ln_f.weight"], p["ln_f.bias"]) @ p["wte.weight"].T
    logp = jax.nn.log_softmax(logits.reshape(B * T, -1))
    return -jnp.mean(jnp.take_along_axis(logp, targets.reshape(-1, 1), 1))


def gpt_step(p, m, v, t, x, y):
    """A training step: value_and_grad, then AdamW as torch.optim.AdamW's (decay on the
    matrices only, as nanoGPT's configure_optimizers)."""
    loss, g = jax.value_and_grad(gpt_loss)(p, x, y)
    (b1, b2), t = GPT_BETAS, t + 1
    bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
    for n in p:
        wd = GPT_WEIGHT_DECAY if p[n].ndim >= 2 else 0.0
        m[n] = b1 * m[n] + (1 - b1) * g[n]
        v[n] = b2 * v[n] + (1 - b2) * g[n] * g[n]
        p[n] = p[n] * (1 - GPT_LR * wd) - (GPT_LR / bc1) * m[n] / (
            jnp.sqrt(v[n]) / jnp.sqrt(bc2) + GPT_EPS)
    return p, m, v, t, loss


def gpt():
    """The whole training step under one jax.jit (parameters and moments donated)."""
    batches, vocab = gpt_batches()
    put = jax.device_put
    init = gpt_params(vocab)
    state = {"p": {n: put(a) for n, a in init},
             "m": {n: put(np.zeros_like(a)) for n, a in init},
             "v": {n: put(np.zeros_like(a)) for n, a in init}, "t": put(np.float32(0))}
    step = jax.jit(gpt_step, donate_argnums=(0, 1, 2))

    def run(x, y):
        s = state
        s["p"], s["m"], s["v"], s["t"], loss = step(s["p"], s["m"], s["v"], s["t"], put(x),
                                                    put(y))
        return float(loss)

    run_gpt(run, batches)


def train(fn):
    return jax.grad(lambda params, x: fn(params, x).mean())


def compile_ms(fn, *args):
    lowered = jax.jit(fn).trace(*args).lower()
    t0 = time.perf_counter()
    lowered.compile()
    return (time.perf_counter() - t0) * 1e3


def main():
    args = parse_args(__doc__)
    print("version", jax.__version__)
    if args.work == "gpt":
        gpt()
        return
    if args.work == "attention":  # only torch's SDPA is the attention issue's peer
        print("unsupported 1")
        return
    if args.work in ("decoder_forward", "decoder_train_step", "scan_layers_compile"):
        (loop, lp), (scan, sp), x = decoder(args.layers)
        if args.work == "decoder_forward":
            f = jax.jit(loop)
            emit("forward_ms", median_ms(lambda: f(lp, x).block_until_ready(), 7, 2))
            f = jax.jit(scan)
            emit("scan_forward_ms", median_ms(lambda: f(sp, x).block_until_ready(), 7, 2))
        elif args.work == "decoder_train_step":
            g = jax.jit(train(loop))
            emit("train_step_ms",
                 median_ms(lambda: jax.block_until_ready(g(lp, x)), args.reps, 2))
            g = jax.jit(train(scan))
            emit("scan_train_step_ms",
                 median_ms(lambda: jax.block_until_ready(g(sp, x)), args.reps, 2))
        else:
            emit("scan_compile_ms", compile_ms(train(scan), sp, x))
            emit("loop_compile_ms", compile_ms(train(loop), lp, x))
    elif args.work == "cumsum_scan":
        xs = jax.device_put(np.arange(1, CUMSUM_N + 1, dtype=np.float32))
        f = jax.jit(lambda xs: jax.lax.scan(lambda c, x: (c + x, c + x), jnp.float32(0), xs))
        total, _ = f(xs)
        assert float(total) == CUMSUM_N * (CUMSUM_N + 1) / 2
        ms = median_ms(lambda: jax.block_until_ready(f(xs)), 21, 3)
        emit("ns_per_iteration", ms * 1e6 / CUMSUM_N)
    else:
        rng = np.random.default_rng(0)
        put = jax.device_put
        params = [put(rng.standard_normal((784, 256)).astype(np.float32) * 0.03),
                  put(np.zeros(256, np.float32)),
                  put(rng.standard_normal((256, 10)).astype(np.float32) * 0.06),
                  put(np.zeros(10, np.float32))]
        x = put(rng.standard_normal((MLP_BATCH, 784)).astype(np.float32))
        y = put(rng.integers(0, 10, MLP_BATCH))

        def loss_fn(p, x, y):
            h = jax.nn.relu(x @ p[0] + p[1]) @ p[2] + p[3]
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(h), y[:, None], 1))

        def _step(p, x, y):
            loss, g = jax.value_and_grad(loss_fn)(p, x, y)
            return [a - 0.01 * b for a, b in zip(p, g)], loss

        step = jax.jit(_step, donate_argnums=0)
        state = {"p": params, "loss": None}

        def run(block):
            state["p"], state["loss"] = step(state["p"], x, y)
            if block:
                state["loss"].block_until_ready()

        emit("steps_per_s", best_rate(lambda: run(True), 200))
        emit("steps_per_s_pipelined",
             best_rate(lambda: run(False), 200, finish=lambda: state["loss"].block_until_ready()))


if __name__ == "__main__":
    main()
