#!/usr/bin/env python3
"""Checks that every #include follows DESIGN's direction of dependencies between rooms.

core <- ir <- {passes, autodiff} <- backend <- backend_ref <- backend_cpu <- runtime <- trace
     <- nn <- optim <- dist <- python; tools, tests, bench and examples sit on top.

A room may include its own headers (public `loom/<room>/...` and private `<room>/...` under
src/) and the public headers of the rooms it depends on (ALLOWED below, the one place the
pairs are written). A private header of another room is never allowed. Foreign headers that
only one room may see (LLVM, OpenBLAS, oneDNN, Gloo, the binding library) are checked too.
Exit status 1 lists every violation as file:line.
"""
import pathlib
import re
import sys

# room -> the rooms whose public headers it may include (besides its own).
ALLOWED = {
    "core": set(),
    "ir": {"core"},
    "passes": {"core", "ir"},
    "autodiff": {"core", "ir"},
    "backend": {"core", "ir"},
    "backend_ref": {"core", "ir", "backend"},
    "backend_cpu": {"core", "ir", "backend", "backend_ref"},
    "runtime": {"core", "ir", "passes", "autodiff", "backend", "backend_ref", "backend_cpu"},
    "trace": {"core", "ir", "autodiff", "runtime"},
    "nn": {"core", "trace"},
    "optim": {"core", "trace", "nn"},
    "dist": {"core", "ir", "runtime", "trace", "nn", "optim"},
    "python": {"core", "trace", "nn", "optim", "dist", "runtime", "umbrella"},
}
# Foreign headers (by prefix) and the only rooms that may include them.
FOREIGN = {
    "llvm/": {"backend_cpu"},
    "cblas.h": {"backend_cpu"},
    "openblas": {"backend_cpu"},
    "dnnl": {"backend_cpu"},
    "oneapi/": {"backend_cpu"},
    "gloo/": {"dist"},
    "nanobind/": {"python"},
    "pybind11/": {"python"},
}
PUBLIC_ROOM = {  # public header directory (include/loom/<dir>/) -> room
    "core": "core", "ir": "ir", "passes": "passes", "autodiff": "autodiff",
    "runtime": "runtime", "trace": "trace", "nn": "nn", "optim": "optim", "dist": "dist",
}
BACKEND_HEADERS = {"ref_backend.h": "backend_ref", "cpu_backend.h": "backend_cpu"}
SOURCE_ROOM = {"distributed": "dist"}  # src/<dir> -> room, where the names differ


def room_of_public(rel):
    """The room of a header named as included: 'loom/ir/graph.h' -> 'ir'."""
    parts = rel.split("/")
    if parts[0] != "loom":
        return None
    if len(parts) == 2:
        return "umbrella"  # loom/loom.h
    if parts[1] == "backend":
        return BACKEND_HEADERS.get(parts[2], "backend")
    return PUBLIC_ROOM.get(parts[1])


def room_of_file(path):
    """The room a source file belongs to, or None for tools/tests/bench/examples."""
    p = path.as_posix()
    m = re.match(r"(?:include/loom|src)/(backend/(?:ref|cpu)|[a-z_]+)/", p)
    if m:
        d = m.group(1)
        if d == "backend/ref":
            return "backend_ref"
        if d == "backend/cpu":
            return "backend_cpu"
        if p.startswith("include/loom/backend/"):
            return BACKEND_HEADERS.get(path.name, "backend")
        return SOURCE_ROOM.get(d, d)
    if p.startswith("python/"):
        return "python"
    return None


def private_room(rel):
    """The room of a private header named as included: 'backend/cpu/plan.h' -> 'backend_cpu'."""
    m = re.match(r"(backend/(?:ref|cpu)|[a-z_]+)/", rel)
    if not m:
        return None
    d = m.group(1)
    return {"backend/ref": "backend_ref", "backend/cpu": "backend_cpu"}.get(d, SOURCE_ROOM.get(d, d))


def main():
    root = pathlib.Path(__file__).resolve().parent.parent
    files = [p for d in ("include", "src", "python") for p in (root / d).rglob("*")
             if p.suffix in (".h", ".cpp", ".def", ".hpp", ".cc")]
    bad = []
    for f in sorted(files):
        rel_file = f.relative_to(root)
        room = room_of_file(rel_file)
        if room is None:
            continue
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            m = re.match(r'\s*#\s*include\s*[<"]([^>"]+)[>"]', line)
            if not m:
                continue
            inc = m.group(1)
            for prefix, rooms in FOREIGN.items():
                if inc.startswith(prefix) and room not in rooms:
                    bad.append(f"{rel_file}:{n}: {room} includes {inc}, which only "
                               f"{', '.join(sorted(rooms))} may see")
            target = room_of_public(inc)
            if target is not None:
                if target != room and target not in ALLOWED[room]:
                    bad.append(f"{rel_file}:{n}: {room} includes {inc} of room {target} "
                               f"(a back-edge: {room} may use {', '.join(sorted(ALLOWED[room])) or 'nothing'})")
                continue
            if '"' in line and (root / "src" / inc).exists():
                target = private_room(inc)
                if target != room:
                    bad.append(f"{rel_file}:{n}: {room} includes {inc}, a private header of "
                               f"room {target}")
    for b in bad:
        print(b)
    if bad:
        print(f"check-includes: {len(bad)} include(s) against DESIGN's direction", file=sys.stderr)
        return 1
    print(f"check-includes: {len(files)} files follow the direction of dependencies")
    return 0


if __name__ == "__main__":
    sys.exit(main())
