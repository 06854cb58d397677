"""python -m loom.launch: starts N local ranks of a program with their environment.

    python -m loom.launch -n N [--store DIR|HOST:PORT] [--rank-offset K] [--world-size W]
                          [--timeout SECONDS] PROGRAM ARGS...

The C++ launcher `loom-launch` under its Python name: a PROGRAM that is a Python file runs with
this interpreter, `-m MODULE` runs the module with it, anything else is an executable; the rest
is loom-launch's (the package's loom/bin/loom-launch, else $LOOM_LAUNCH, else loom-launch on
PATH). Each rank gets LOOM_RANK (K + i), LOOM_LOCAL_RANK (i), LOOM_WORLD_SIZE (W, default
K + N) and LOOM_STORE (DIR or HOST:PORT; default a fresh temporary directory, removed at the
end; with HOST:PORT, rank 0 serves a TCP store bound to HOST); --timeout sets
LOOM_DIST_TIMEOUT (seconds a collective waits for the other ranks). Every line a rank prints
is prefixed with "[rank R] " (stdout to stdout, stderr to stderr). When a rank fails (non-zero
exit or a signal), the others are ended (SIGTERM, then SIGKILL after 3 s) and the launcher
exits with the failing rank's status (128 + signal for a signal).

Multi-host: the same command on every host, with the same store (a directory every host sees,
or --store HOSTA:PORT where HOSTA is the address of the host that runs rank 0), the total
--world-size, --rank-offset = the ranks started before this host, and LOOM_DIST_ADDR = this
host's address (Gloo binds it; 127.0.0.1 reaches local ranks only).
"""
import os
import shutil
import sys

_VALUED = {"-n", "--nproc", "--store", "--rank-offset", "--world-size", "--timeout"}


def launcher():
    """The loom-launch binary this package runs."""
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "loom-launch")
    for path in (here, os.environ.get("LOOM_LAUNCH"), shutil.which("loom-launch")):
        if path and os.access(path, os.X_OK):
            return path
    raise SystemExit("loom.launch: the loom-launch binary was not found (looked for "
                     f"{here}, $LOOM_LAUNCH and PATH); build loom with its tools "
                     "(scripts/build.sh) or set LOOM_LAUNCH")


def command(argv):
    """loom-launch's argument list for `python -m loom.launch ARGV`."""
    out, i = [], 0
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "-m":
        flag = argv[i]
        name = flag.split("=", 1)[0]
        out.append("-n" if name == "--nproc" else name)
        if "=" in flag:
            out.append(flag.split("=", 1)[1])
        elif name in _VALUED and i + 1 < len(argv):
            i += 1
            out.append(argv[i])
        i += 1
    prog = argv[i:]
    if prog[:1] == ["-m"]:
        prog = [sys.executable, "-m"] + prog[1:]
    elif prog and prog[0].endswith(".py"):
        prog = [sys.executable] + prog
    return out + prog


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    exe = launcher()
    os.execv(exe, [exe] + command(argv))


if __name__ == "__main__":
    main()
