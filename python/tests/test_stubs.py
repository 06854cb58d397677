"""The type stub is current and complete, and the public names carry docstrings."""
import ast
import pathlib
import subprocess
import sys

import loom

ROOT = pathlib.Path(__file__).resolve().parents[2]
STUB = ROOT / "python/loom/__init__.pyi"


def test_stub_is_current():
    r = subprocess.run([sys.executable, str(ROOT / "scripts/gen_stubs.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_stub_names_every_public_name():
    tree = ast.parse(STUB.read_text())
    named = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            named.add(node.name)
        elif isinstance(node, ast.Assign):
            named.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            named.add(node.target.id)
    public = {n for n in dir(loom) if not n.startswith("_")
              and not isinstance(getattr(loom, n), type(loom))}
    assert public - named == set()


def test_tracing_tools_have_help():
    for fn in (loom.scan, loom.while_loop, loom.fori_loop, loom.assume_pure, loom.compile,
               loom.grad, loom.value_and_grad, loom.sync):
        assert fn.__doc__ and len(fn.__doc__) > 40, fn
    assert "trip count" in loom.scan.__doc__
    # a wrapper carries its function's docstring and name, for help() and editors
    for wrap in (loom.assume_pure, loom.compile):
        w = wrap(_documented)
        assert w.__doc__ == _documented.__doc__ and w.__name__ == "_documented"


def _documented(x):
    """A docstring that the tracing wrappers must carry."""
    return x
