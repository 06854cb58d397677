"""The seed's six examples as Python programs (examples/python/) print the seed's values and
the trace and compile counts the seed claims."""
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
EX = ROOT / "examples/python"


def run(name, *args, folder=EX):
    env = dict(os.environ)
    r = subprocess.run([sys.executable, str(folder / name), *args], capture_output=True,
                       text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_example1_traced_once():
    out = run("example1_assume_pure.py")
    assert "First call: traced and cached" in out
    assert "Result shape: loom.Size([4, 4])" in out
    assert "do_math traced 1 time(s) for 1000 calls; cached calls: 999" in out


def test_example2_module_traced_once():
    pytest.importorskip("loom.nn")
    out = run("example2_assume_pure_module.py")
    assert "Output shape: loom.Size([5, 10])" in out
    assert "forward traced 1 time(s) for 1000 steps; cached calls: 999" in out


def test_example3_scan_layers_single_compilation():
    pytest.importorskip("loom.nn")
    for layers in ("6", "24"):  # what is traced and compiled does not grow with the depth
        out = run("example3_scan_layers.py", layers)
        assert "Output shape: loom.Size([4, 512, 512])" in out
        assert "1 bodies traced (the first layer's forward, as the scan's body), " \
               "1 compilation(s)" in out


def test_example4_cumsum():
    out = run("example4_scan_cumsum.py")
    assert "Final sum: tensor([15.])" in out
    history = out.split("History: ")[1].split("body traced")[0]
    assert history.split() == "tensor([[ 1.], [ 3.], [ 6.], [10.], [15.]])".split()
    assert "body traced 1 time(s) for 5 steps; 1 compilation(s)" in out


def test_example5_dict_pytree():
    out = run("example5_scan_pytree.py")
    assert "Final carry: {'sum': tensor([15.]), 'count': tensor([5.])}" in out
    means = out.split("Means over time: ")[1].split("body traced")[0]
    assert means.split() == ("tensor([[1.0000], [1.5000], [2.0000], [2.5000], "
                             "[3.0000]])").split()
    assert "1 compilation(s)" in out


def test_example6_while_loop():
    out = run("example6_while_loop.py")
    assert "Result: tensor(13)" in out
    assert "1 compilation(s)" in out


def test_train_lm_loss_falls_with_one_trace():
    out = run("train_lm.py", "60")
    losses = [float(line.split("loss")[1]) for line in out.splitlines() if "loss" in line]
    assert len(losses) == 3 and losses[-1] < 0.6 * losses[0], out
    assert "compiles 2," in out  # as examples/train_lm.cpp: the step, traced once
    assert "bodies traced 1" in out  # the first block, once, as the C++ train_lm
    assert 'sample: "It was the best of times' in out


# The same six examples as torch_xla users wrote them (examples/torch/), run on loom.torch.
TORCH_EX = ROOT / "examples/torch"


def run_torch(name, *args):
    return run(name, *args, folder=TORCH_EX)


def test_torch_examples_print_the_seed_values():
    out = run_torch("example1_assume_pure.py")
    assert "Result shape: torch.Size([4, 4])" in out
    assert "do_math traced 1 time(s) for 1000 calls; cached calls: 999" in out
    out = run_torch("example2_assume_pure_module.py")
    assert "Output shape: torch.Size([5, 10])" in out and "cached calls: 1998" in out
    out = run_torch("example3_scan_layers.py", "6")
    assert "Output shape: torch.Size([4, 512, 512])" in out
    out = run_torch("example4_scan_cumsum.py")
    assert "Final sum: tensor([15.]" in out
    assert "[ 1.],\n        [ 3.],\n        [ 6.],\n        [10.],\n        [15.]]" in out
    assert "body traced 1 time(s) for 5 steps" in out
    out = run_torch("example5_scan_pytree.py")
    assert "'sum': tensor([15.]" in out and "'count': tensor([5.]" in out
    assert "[1.0000],\n        [1.5000],\n        [2.0000],\n        [2.5000],\n        [3.0000]]" \
        in out
    assert "Result: tensor(13" in run_torch("example6_while_loop.py")


def test_torch_gpt_trains_on_loom_as_on_eager():
    out = run_torch("gpt.py", "30")
    curve = [line.split() for line in out.splitlines() if line.split()[:1] and
             line.split()[0].isdigit()]
    assert [int(c[0]) for c in curve] == [0, 10, 20, 29], out
    for _, got, want in curve:  # loom.torch beside torch eager, step by step
        assert abs(float(got) - float(want)) <= 1e-4 * float(want), out
    assert float(curve[-1][2]) < 0.75 * float(curve[0][2]), out  # it learns
    assert float(out.split("max relative loss difference: ")[1].split()[0]) < 1e-4, out
    compiled = out.split("loom: ")[1]
    assert int(compiled.split()[0]) <= 2 and "in 30 steps, 0 after step 1" in compiled, out
