#!/usr/bin/env python3
"""The house's counts (issue 38's measures), for a checkout: lines of the nn/optim/parallel
layers per language, files over 800 lines, functions over 80 lines, comment blocks of six or
more lines in .cpp files, and TraceContext's methods and the lines of the files that define
them. Usage: scripts/house_counts.py [ROOT] (default: this checkout)."""
import pathlib
import re
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import long_functions  # noqa: E402

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else HERE.parent).resolve()
# The layers above trace: modules, optimizers, data and tensor parallelism.
LAYERS = {
    "C++": ["src/nn/*.cpp", "src/optim/*.cpp", "src/dist*/data_parallel.cpp",
            "src/dist*/tensor_parallel.cpp"],
    "Python": ["python/loom/nn/*.py", "python/loom/optim/*.py", "python/loom/distributed.py"],
}


def tracked(*patterns):
    out = subprocess.run(["git", "ls-files", *patterns], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.split()
    return [ROOT / p for p in out]


def nlines(p):
    return len(p.read_text(encoding="utf-8").splitlines())


def comment_blocks(p, at_least=6):
    """(blocks, blocks that are not the file's opening paragraph)."""
    blocks = inner = run = 0
    for i, line in enumerate(p.read_text(encoding="utf-8").splitlines() + [""]):
        if line.lstrip().startswith("//"):
            run += 1
        else:
            if run >= at_least:
                blocks += 1
                inner += i != run  # the opening paragraph ends on line `run`
            run = 0
    return blocks, inner


def trace_context_methods():
    """Member functions declared in class TraceContext (context.h), by a name( at 2 spaces."""
    text = (ROOT / "src/trace/context.h").read_text(encoding="utf-8")
    body = text[text.index("class TraceContext {"):]
    body = body[:body.index("\n};")]
    return len(re.findall(r"^  (?!//)[\w:<>,*& ~]*?\b(\w+)\(", body, re.M))


def main():
    print(f"# {ROOT}")
    for lang, pats in LAYERS.items():
        files = tracked(*pats)
        print(f"layers above trace, {lang}: {len(files)} files, "
              f"{sum(nlines(f) for f in files)} lines")
    src = tracked("*.cpp", "*.h", "*.py")
    big = sorted((nlines(f), f.relative_to(ROOT)) for f in src if nlines(f) > 800)
    print(f"files over 800 lines: {len(big)}" + "".join(f"\n  {n} {f}" for n, f in big))
    code = tracked("src/*.cpp", "python/src/*.cpp", "tools/*.cpp")
    long = [(f.relative_to(ROOT), line, name, n) for f in code
            for line, name, n in long_functions.functions(f) if n > 80]
    print(f"functions over 80 lines (src, python/src, tools): {len(long)}" +
          "".join(f"\n  {f}:{line} {name} {n}" for f, line, name, n in long))
    cpp = tracked("*.cpp")
    per = [(comment_blocks(f), str(f.relative_to(ROOT))) for f in cpp]
    for label, keep in (("all", lambda f: True), ("src/", lambda f: f.startswith("src/"))):
        n = sum(b for (b, _), f in per if keep(f))
        inner = sum(i for (_, i), f in per if keep(f))
        print(f"comment blocks of 6+ lines in .cpp files ({label}): {n}, of which {inner} "
              f"beside code (not a file's opening paragraph)")
    ctx = [f for f in tracked("src/trace/*.cpp") if "TraceContext::" in f.read_text()]
    print(f"TraceContext: {trace_context_methods()} methods declared; defined in "
          + ", ".join(f"{f.name} ({nlines(f)})" for f in ctx))


if __name__ == "__main__":
    main()
