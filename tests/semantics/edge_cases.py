"""The torch side and the judge of the differential test (edge_cases.cpp is the loom side).

Runs every case of the loom program in PyTorch 1.13 (Debian's python3-torch, the oracle) and
compares: dtypes and shapes exactly, values and gradients to the dtype's tolerance (nan equal
to nan), and an error in loom wherever torch raises (and none where it does not). Cases where
loom differs from torch on purpose are listed in EXPECTED_DIFFERENCES with the reason; they
must still differ (a fixed difference is reported, so the list stays true).

usage: edge_cases.py LOOM_EDGE_CASES_BINARY
"""
import json
import math
import subprocess
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("edge_cases.py: PyTorch is not importable by", sys.executable, "(need python3-torch)")
    sys.exit(77)  # CTest: skipped, not passed

nan = math.nan

# case -> (what loom does, why). Documented in docs/pytorch_differences.md.
EXPECTED_DIFFERENCES = {
    "while_grad:captured": (
        "AutodiffError", "while_loop has no reverse-mode rule (its trip count is known only at "
        "run time); torch's eager Python loop is unrolled. Use fori_loop with integer bounds "
        "or scan"),
    "while_grad:fori_tensor_bounds": (
        "AutodiffError", "fori_loop with tensor bounds is a while loop"),
    "backward_once_each:shared_trunk": (
        "value", "loom refuses a second backward() of the same tensor only: per node it would "
        "also refuse a forward recomputed before a sync, whose nodes hash-consing merges with "
        "the old ones; a backward through a part an earlier one used accumulates"),
}

def leaf(v):
    return torch.tensor(v, dtype=torch.float32, requires_grad=True)


def grad_case(v, f):
    x = leaf(v)
    y = f(x)
    y.sum().backward()
    return y, [x.grad]


def operands():
    return {
        "b": lambda: torch.tensor([True, False]),
        "i32": lambda: torch.tensor([3, -2], dtype=torch.int32),
        "i64": lambda: torch.tensor([-7, 7], dtype=torch.int64),
        "f32": lambda: torch.tensor([1.5, -2.5], dtype=torch.float32),
        "f64": lambda: torch.tensor([0.25, -3], dtype=torch.float64),
        "b0": lambda: torch.tensor(True),
        "i64_0": lambda: torch.tensor(-2, dtype=torch.int64),
        "f32_0": lambda: torch.tensor(0.5, dtype=torch.float32),
    }


HOST = {"int": 3, "float": 2.5, "bool": True}


def add_grid(c):
    tt = {
        "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
        "div": lambda a, b: a / b, "maximum": torch.maximum, "lt": lambda a, b: a < b,
    }
    ts = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
          "div": lambda a, b: a / b}
    st = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
          "div": lambda a, b: a / b}
    ops = operands()
    for an, a in ops.items():
        for bn, b in ops.items():
            for on, f in tt.items():
                c[f"grid:{on}:{an}:{bn}"] = (lambda a=a, b=b, f=f: (f(a(), b()), []))
        for sn, s in HOST.items():
            for on, f in ts.items():
                c[f"grid:{on}:{an}:host_{sn}"] = (lambda a=a, s=s, f=f: (f(a(), s), []))
            for on, f in st.items():
                c[f"grid:{on}:host_{sn}:{an}"] = (lambda a=a, s=s, f=f: (f(s, a()), []))


def twice(f):
    w = torch.ones(2, 3, requires_grad=True)
    l = f(w)
    l.backward()
    l.backward()
    return l, [w.grad]


def shared_trunk():
    w = torch.ones(3, requires_grad=True)
    h = w * w
    h.sum().backward()
    (h * 3.0).sum().backward()
    return h, [w.grad]


def recomputed_loss():
    w = torch.ones(3, requires_grad=True)
    for _ in range(3):
        l = (w * w).sum()
        l.backward()
    return l, [w.grad]


def ce(logits, target, ignore):
    n = len(target)
    x = torch.tensor(logits, dtype=torch.float32).reshape(n, -1).requires_grad_()
    l = F.cross_entropy(x, torch.tensor(target), ignore_index=ignore)
    l.backward()
    return l, [x.grad]


def while_captured():
    w = torch.tensor(2.0, requires_grad=True)
    i, x = torch.tensor(3), torch.ones(())
    while i > 0:
        i, x = i - 1, x * w
    x.backward()
    return x, [w.grad]


def cases():
    ar = lambda a, b: torch.arange(a, b, dtype=torch.float32)
    c = {
        "grad:relu": lambda: grad_case([-1, 0, 1, nan], torch.relu),
        "grad:clamp": lambda: grad_case([-1, 0, 1, 2, 3, nan], lambda x: torch.clamp(x, 0.0, 2.0)),
        "grad:clamp_min_only": lambda: grad_case([-1, 0, 1, nan], lambda x: torch.clamp(x, min=0.0)),
        "grad:clamp_max_only": lambda: grad_case([-1, 0, 1, nan], lambda x: torch.clamp(x, max=0.0)),
        "grad:clamp_min_gt_max": lambda: grad_case([0, 1, 2, 3, 5, nan], lambda x: torch.clamp(x, 3.0, 1.0)),
        # clamp with both bounds (torch.clamp: gradient 1 at the bounds; F.hardtanh, which loom
        # lacks, gives 0 there)
        "grad:clamp_pm1": lambda: grad_case([-2, -1, 0, 1, 2], lambda x: torch.clamp(x, -1.0, 1.0)),
        "grad:maximum_tensor": lambda: grad_case([-1, 0, 1, nan], lambda x: torch.maximum(x, torch.zeros(4))),
        "grad:minimum_tensor": lambda: grad_case([-1, 0, 1, nan], lambda x: torch.minimum(x, torch.zeros(4))),
        "grad:maximum_0d": lambda: grad_case([-1, 0, 1], lambda x: torch.maximum(x, torch.tensor(0.0))),
        "grad:abs": lambda: grad_case([-1, 0, 1, nan], torch.abs),
        "grad:max_all_ties": lambda: grad_case([1, 3, 3], torch.max),
        "grad:min_all_ties": lambda: grad_case([1, 1, 3], torch.min),
        "grad:amax_dim_ties": lambda: grad_case([1, 3, 3, 2, 2, 0], lambda x: torch.amax(x.reshape(2, 3), 1)),
        "grad:sqrt_at_0": lambda: grad_case([0, 4], torch.sqrt),
        "grad:pow_half_at_0": lambda: grad_case([0, 2], lambda x: torch.pow(x, 0.5)),
        "grad:where_nan": lambda: grad_case([-1, 0, 1, nan], lambda x: torch.where(x > 0, x, torch.zeros(4))),
        "clamp:int": lambda: (torch.clamp(torch.tensor([-3, 0, 5]), 0, 2), []),
        "clamp:int_float_bounds": lambda: (torch.clamp(torch.tensor([-3, 0, 5]), 0.5, 2.5), []),
        "clamp:bool": lambda: (torch.clamp(torch.tensor([True, False]), 0, 1), []),
        "relu:int": lambda: (torch.relu(torch.tensor([-3, 0, 5])), []),
        "relu:bool": lambda: (torch.relu(torch.tensor([True])), []),
        "neg:bool": lambda: (-torch.tensor([True, False]), []),
        "abs:bool": lambda: (torch.abs(torch.tensor([True, False])), []),
        "pow:bool_bool": lambda: (torch.tensor([True, False]) ** torch.tensor([True, False]), []),
        "sum:bool": lambda: (torch.tensor([True, True, False]).sum(), []),
        "matmul:f32_f64": lambda: (torch.ones(2, 2) @ torch.ones(2, 2, dtype=torch.float64), []),
        "matmul:i64_f32": lambda: (torch.ones(2, 2, dtype=torch.int64) @ torch.ones(2, 2), []),
        "matmul:i64_i64": lambda: (torch.ones(2, 2, dtype=torch.int64) @ torch.ones(2, 2, dtype=torch.int64), []),
        "pow:int_neg_int": lambda: (torch.pow(torch.tensor([1, 2, 3]), -1), []),
        "pow:int_neg_float": lambda: (torch.pow(torch.tensor([1, 2, 3]), -1.0), []),
        "pow:int_2": lambda: (torch.pow(torch.tensor([1, 2, 3]), 2), []),
        "pow:float_neg_int": lambda: (torch.pow(torch.tensor([1.0, 2, 4]), -1), []),
        # loom's arange takes its dtype as an argument, float32 by default (API.md)
        "arange:5_1": lambda: (ar(5, 1), []),
        "arange:1_1": lambda: (ar(1, 1), []),
        "arange:int64": lambda: (torch.arange(-2, 3), []),
        "view:transposed_flat": lambda: (torch.ones(2, 3).t().view(6), []),
        "view:transposed_same": lambda: (ar(0, 6).transpose(0, 0).view(6), []),
        "view:transposed_shape": lambda: (ar(0, 6).reshape(2, 3).t().view(3, 2), []),
        "view:transposed_split": lambda: (ar(0, 6).reshape(2, 3).t().view(3, 2, 1), []),
        "view:permuted_split_last": lambda: (ar(0, 24).reshape(2, 3, 4).permute(1, 0, 2).view(3, 2, 2, 2), []),
        "view:permuted_merge": lambda: (ar(0, 24).reshape(2, 3, 4).permute(1, 0, 2).view(3, 8), []),
        "view:expanded": lambda: (torch.ones(3, 1).expand(3, 4).view(12), []),
        "view:strided_slice": lambda: (ar(0, 8).reshape(2, 4)[:, 0:4:2].view(4), []),
        "view:row_slice": lambda: (ar(0, 8).reshape(4, 2)[1:3].view(4), []),
        "reshape:transposed_flat": lambda: (ar(0, 6).reshape(2, 3).t().reshape(6), []),
        "softmax:int64": lambda: (torch.softmax(torch.arange(4), 0), []),
        "log_softmax:int64": lambda: (torch.log_softmax(torch.arange(4), 0), []),
        "softmax:bool": lambda: (torch.softmax(torch.tensor([True]), 0), []),
        "backward_twice:w_times_w": lambda: twice(lambda w: (w * w).sum()),
        "backward_twice:w_times_2": lambda: twice(lambda w: (w * 2.0).sum()),
        "backward_twice:w_plus_1": lambda: twice(lambda w: (w + 1.0).sum()),
        "backward_twice:mean": lambda: twice(lambda w: w.mean()),
        "backward_twice:exp": lambda: twice(lambda w: w.exp().sum()),
        "backward_twice:reshape_sum": lambda: twice(lambda w: w.reshape(6).sum()),
        "backward_once_each:shared_trunk": shared_trunk,
        "backward_each:recomputed_loss": recomputed_loss,
        "cross_entropy:target_-100": lambda: ce([1, 2, 3, 1, 1, 1], [0, -100], -100),
        "cross_entropy:all_ignored": lambda: ce([1, 2, 3, 1, 1, 1], [-100, -100], -100),
        "cross_entropy:ignore_index_1": lambda: ce([1, 2, 3, 0, 5, 1, 2, 2, 2], [1, 2, 1], 1),
        "cross_entropy:none_ignored": lambda: ce([1, 2, 3, 0, 5, 1], [2, 0], -100),
        "cross_entropy:target_out_of_range": lambda: ce([1, 2, 3, 1, 1, 1], [0, 5], -100),
        "cross_entropy:1d_ignored": lambda: (F.cross_entropy(torch.tensor([1.0, 2, 3]), torch.tensor(-100)), []),
        "cross_entropy:prob_target_ignore_index": lambda: (
            F.cross_entropy(torch.ones(2, 3), torch.full((2, 3), 1.0 / 3), ignore_index=1), []),
        "while_grad:captured": while_captured,
        "while_grad:fori_tensor_bounds": while_captured,
        "fori_grad:int_bounds": while_captured,
    }
    add_grid(c)
    return c


def describe(t):
    if t is None:
        return None
    t = t.detach()
    return {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape),
            "values": t.to(torch.float64).reshape(-1).tolist()}


def tolerance(dtype):
    return {"float32": (1e-5, 1e-6), "float64": (1e-12, 1e-14), "float16": (1e-3, 1e-3),
            "bfloat16": (1e-2, 1e-2)}.get(dtype, (0.0, 0.0))


def compare_tensor(what, got, want):
    if (got is None) != (want is None):
        return f"{what}: loom {'none' if got is None else 'a tensor'}, torch {'none' if want is None else 'a tensor'}"
    if got is None:
        return None
    if got["dtype"] != want["dtype"]:
        return f"{what}: dtype loom {got['dtype']}, torch {want['dtype']}"
    if got["shape"] != want["shape"]:
        return f"{what}: shape loom {got['shape']}, torch {want['shape']}"
    rtol, atol = tolerance(want["dtype"])
    for i, (g, w) in enumerate(zip(got["values"], want["values"])):
        if math.isnan(w) and math.isnan(g):
            continue
        if math.isinf(w) or math.isinf(g):
            if g == w:
                continue
        elif abs(g - w) <= atol + rtol * abs(w):
            continue
        return f"{what}[{i}]: loom {g}, torch {w} (loom {got['values']}, torch {want['values']})"
    return None


def judge(name, loom, torch_run):
    """None when loom agrees with torch, else the difference."""
    t_err, t_val = torch_run
    if "error" in loom:
        if t_err is not None:
            return None
        return f"loom raised {loom['error']} ({loom['message']}) where torch returns {t_val[0]}"
    if t_err is not None:
        return f"loom returned {loom['result']} where torch raises {t_err}"
    d = compare_tensor("result", loom["result"], t_val[0])
    if d:
        return d
    if len(loom["grads"]) != len(t_val[1]):
        return f"{len(loom['grads'])} gradients in loom, {len(t_val[1])} in torch"
    for k, (g, w) in enumerate(zip(loom["grads"], t_val[1])):
        d = compare_tensor(f"grad[{k}]", g, w)
        if d:
            return d
    return None


def main():
    out = subprocess.run([sys.argv[1]], capture_output=True, text=True)
    if out.returncode != 0:
        print(out.stdout[-4000:], out.stderr[-4000:])
        print(f"edge_cases binary exited with {out.returncode}")
        return 1
    loom = {}
    for line in out.stdout.splitlines():
        r = json.loads(line)
        loom[r["case"]] = r
    torch_cases = cases()
    failures = []
    if set(loom) != set(torch_cases):
        failures.append(f"case lists differ: only loom {sorted(set(loom) - set(torch_cases))}, "
                        f"only torch {sorted(set(torch_cases) - set(loom))}")
    for name in sorted(set(loom) & set(torch_cases)):
        try:
            r = torch_cases[name]()
            run = (None, (describe(r[0]), [describe(g) for g in r[1]]))
        except Exception as e:  # noqa: BLE001 (any torch error is the oracle's answer)
            run = (f"{type(e).__name__}: {str(e).splitlines()[0][:100]}", None)
        diff = judge(name, loom[name], run)
        if name in EXPECTED_DIFFERENCES:
            want_class, why = EXPECTED_DIFFERENCES[name]
            if diff is None:
                failures.append(f"{name}: listed as an expected difference ({why}) but loom now agrees")
            elif loom[name].get("error", "value") != want_class:
                failures.append(f"{name}: expected loom's outcome {want_class} ({why}); {diff}")
            else:
                print(f"expected difference {name}: {diff[:200]}")
            continue
        if diff:
            failures.append(f"{name}: {diff}")
    print(f"{len(loom)} cases, {len(failures)} differences from torch {torch.__version__}")
    for f in failures:
        print("  " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
