"""Instructions per traced op from Python (callgrind), the noise-free companion of
trace_overhead.py: `x = x * 1.0001 + y` on 16-element tensors inside a function, as there;
the difference of a 1000- and a 5000-iteration run over their 8000 ops (so start-up,
import and the warm-up compile cancel).

    PYTHONPATH=build/python .venv/bin/python bench/python/trace_instructions.py

Needs valgrind. Prints "key value" lines."""
import os
import re
import subprocess
import sys
import tempfile

LOOP = """
import sys, loom
def run(n):
    x = loom.ones(16); y = loom.ones(16)
    (x + y).numpy()  # a compile and a run first: the JIT's start-up thread has finished
    for i in range(n): x = x * 1.0001 + y
run(int(sys.argv[1]))
"""


def instructions(script, n, out):
    subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
                    script, str(n)], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    with open(out) as f:
        return int(re.search(r"^summary: (\d+)", f.read(), re.M).group(1))


def main():
    with tempfile.TemporaryDirectory() as d:
        script = os.path.join(d, "loop.py")
        with open(script, "w") as f:
            f.write(LOOP)
        a = instructions(script, 1000, os.path.join(d, "a.out"))
        b = instructions(script, 5000, os.path.join(d, "b.out"))
    print(f"python_trace_instructions_per_op {(b - a) / 8000:.0f}")


if __name__ == "__main__":
    main()
