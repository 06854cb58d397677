"""The Python train_lm step against the C++ one, in alternating pairs of runs.

    PYTHONPATH=build/python .venv/bin/python bench/python/train_lm_pairs.py [pairs] [steps]

Runs build/examples/loom-train-lm and examples/python/train_lm.py one after the other, `pairs`
times (default 5, 300 steps each), and reads each run's steady step time and its time outside
execute (the host's share: batches, the compiled call, the loss read). This machine's speed
drifts by tens of percent between minutes, so each ratio is taken within a pair and the
median reported; the outside-execute difference is the Python overhead itself. Prints
"key value" lines."""
import pathlib
import re
import statistics
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
STEADY = re.compile(r"steady: ([0-9.]+) ms/step .*outside execute: ([0-9.]+) us/step")


def run(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT).stdout
    m = STEADY.search(out)
    if not m:
        raise SystemExit(f"no steady line in the output of {cmd}:\n{out}")
    return float(m.group(1)), float(m.group(2))


def main():
    pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    steps = sys.argv[2] if len(sys.argv) > 2 else "300"
    cpp = [str(ROOT / "build/examples/loom-train-lm"), steps]
    py = [sys.executable, str(ROOT / "examples/python/train_lm.py"), steps]
    ratios, c_out, p_out = [], [], []
    for _ in range(pairs):
        c_ms, c_us = run(cpp)
        p_ms, p_us = run(py)
        ratios.append(p_ms / c_ms)
        c_out.append(c_us)
        p_out.append(p_us)
        print(f"pair_ms {c_ms:.2f} {p_ms:.2f} ratio {p_ms / c_ms:.3f}", flush=True)
    print(f"ratio_python_over_cpp_median {statistics.median(ratios):.3f}")
    print(f"ratio_range {min(ratios):.3f}-{max(ratios):.3f}")
    print(f"cpp_outside_execute_us {statistics.median(c_out):.0f}")
    print(f"python_outside_execute_us {statistics.median(p_out):.0f}")


if __name__ == "__main__":
    main()
