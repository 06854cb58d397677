"""torch's own OpInfo samples (op_db: float32 and float64, forward, and the input's gradient
where torch differentiates) on loom.torch against torch eager, for every op whose samples the
lowering table runs without a "no lowering" error. Needs expecttest (op_db imports it; a
pinned test tool of scripts/install-deps.sh)."""
import collections

import pytest
import torch
from torch.utils._pytree import tree_flatten, tree_map

import loom
import loom.torch as lt

pytest.importorskip("expecttest")
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402

dev = lt.device()
SAMPLES_PER_DTYPE = 6
# Ops left out, each with its reason.
SKIP = {
    "byte": "loom has no uint8", "char": "loom has no int8", "short": "loom has no int16",
    "chalf": "loom has no complex dtypes",
    "sparse.sampled_addmm": "sparse CSR inputs; loom's tensors are dense",
    "corrcoef": "torch makes a tensor on the input's device inside the op: on 1.13 a "
                "data-less meta tensor that no loom tensor takes part in",
    "tensor_split": "indices_or_sections given as a tensor must be on the CPU for torch",
    "_batch_norm_with_update": "its fourth output (cuDNN's reserve) is uint8: loom has no uint8",
}
SKIP_PREFIXES = {"fft.": "the FFTs compute in complex dtypes, which loom does not have"}
UNINITIALIZED = {"empty", "empty_like", "new_empty", "new_empty_strided"}


def skipped(name):
    return name in SKIP or any(name.startswith(p) for p in SKIP_PREFIXES)


def to_l(x):
    return lt.to_loom(x) if isinstance(x, torch.Tensor) else x


def tensors(x):
    return [t for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor)]


def check_sample(op, s, dtype):
    """'pass', 'nolower', or what failed."""
    want = op(s.input, *s.args, **s.kwargs)
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-7, atol=1e-9)
    try:
        got = lt.to_torch(op(to_l(s.input), *tree_map(to_l, list(s.args)),
                             **tree_map(to_l, dict(s.kwargs))))
    except loom.Error as e:
        return ["nolower" if "no lowering" in str(e) else f"error: {e}"]
    if op.name in UNINITIALIZED:
        same = [(t.shape, t.dtype) for t in tensors(got)] == [(t.shape, t.dtype)
                                                             for t in tensors(want)]
        return ["pass" if same else "fail: shape or dtype"]
    try:
        torch.testing.assert_close(got, want, equal_nan=True, check_device=False, **tol)
    except AssertionError as e:
        return [f"fail: {str(e)[:200]}"]
    if not (op.supports_autograd and isinstance(s.input, torch.Tensor)):
        return ["pass"]
    grad = check_gradient(op, s, tol)
    return ["pass"] if grad is None else ["pass", grad]


def check_gradient(op, s, tol):
    x = s.input.detach().clone().requires_grad_()
    out = [t for t in tensors(op(x, *s.args, **s.kwargs))
           if t.dtype.is_floating_point and t.requires_grad]
    if not out:
        return "pass"
    g = torch.Generator().manual_seed(0)
    ws = [torch.randn(t.shape, dtype=t.dtype, generator=g) for t in out]
    try:
        want, = torch.autograd.grad(sum((t * w).sum() for t, w in zip(out, ws)), x,
                                    allow_unused=True)
    except RuntimeError as e:  # torch has no derivative here (scatter with reduce=): no oracle
        if "derivative" in str(e) and "not implemented" in str(e):
            return None
        raise
    if want is None:
        return "pass"
    try:
        lx = lt.to_loom(s.input.detach()).requires_grad_()
        lout = [t for t in tensors(op(lx, *tree_map(to_l, list(s.args)),
                                      **tree_map(to_l, dict(s.kwargs))))
                if t.dtype.is_floating_point and t.requires_grad]
        got, = torch.autograd.grad(sum((t * lt.to_loom(w)).sum() for t, w in zip(lout, ws)),
                                   lx, allow_unused=True)
        torch.testing.assert_close(lt.to_torch(got), want, equal_nan=True, check_device=False,
                                   rtol=tol["rtol"] * 10, atol=tol["atol"] * 10)
    except loom.Error as e:
        return "nolower (backward)" if "no lowering" in str(e) else f"backward error: {e}"
    except Exception as e:  # noqa: BLE001: a failure to report, whatever its class
        return f"backward fail: {type(e).__name__}: {str(e)[:200]}"
    return "pass"


def run_op_db():
    results = {}
    for op in op_db:
        name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
        res = []
        for dtype in (torch.float32, torch.float64):
            if dtype not in op.supported_dtypes("cpu"):
                continue
            try:
                samples = list(op.sample_inputs("cpu", dtype, requires_grad=False))
            except Exception:  # noqa: BLE001: op_db's own generator fails (1.13 on Python 3.11)
                continue
            for s in samples[:SAMPLES_PER_DTYPE]:
                try:
                    op(s.input, *s.args, **s.kwargs)
                except Exception:  # noqa: BLE001: a sample torch itself refuses
                    continue
                try:
                    res += check_sample(op, s, dtype)
                except Exception as e:  # noqa: BLE001
                    res.append(f"fail: {type(e).__name__}: {str(e)[:200]}")
        results[name] = res
    return results


def test_opinfo_samples_of_the_lowered_ops_pass():
    results = run_op_db()
    lowered = {n: r for n, r in results.items() if r and "nolower" not in r and not skipped(n)}
    total = sum(len(r) for r in lowered.values())
    passed = sum(x == "pass" for r in lowered.values() for x in r)
    failing = {n: collections.Counter(x.split(":")[0] for x in r if x != "pass")
               for n, r in lowered.items() if any(x != "pass" for x in r)}
    report = "\n".join(f"  {n}: {dict(c)}" for n, c in sorted(failing.items()))
    print(f"\n{len(lowered)} ops lowered, {passed}/{total} samples pass "
          f"({passed / total:.1%}); failing:\n{report}")
    assert len(lowered) >= 150, f"only {len(lowered)} OpInfo ops run on loom.torch"
    assert passed / total >= 0.90, report
    # Every skip still applies: a skipped op that now passes leaves the list.
    for n in SKIP:
        r = results.get(n, [])
        assert not r or any(x != "pass" for x in r), f"{n} passes now: remove it from SKIP"
