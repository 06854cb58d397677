#!/usr/bin/env bash
# Runs the Python suite (python/tests) on torch 2.x, beside the default run on Debian's torch 1.13
# (scripts/test.sh). torch 2.x is never a build dependency: it lives in a venv outside the
# repository. The venv is $LOOM_TORCH2_VENV, else ~/.cache/loom-peers/torch, else
# ~/.cache/loom-peers/xla (docs: /work/shared/reference/peers_setup.md); with none this says so
# and exits 0. The extension is built for that venv's interpreter into BUILD_DIR (default
# build-torch2), taking /tmp/loom-build.lock like every build on this machine.
#   Make the venv (~7 GB, ~3 min; PyPI's torch 2.9.0 is the CUDA build, unused on the CPU):
#     python3.12 -m venv ~/.cache/loom-peers/torch
#     ~/.cache/loom-peers/torch/bin/pip install torch==2.9.0 numpy
# Extra arguments go to pytest (e.g. scripts/test-torch2.sh -k optim).
set -euo pipefail
cd "$(dirname "$0")/.."
PEERS=$HOME/.cache/loom-peers
venv=""
for v in ${LOOM_TORCH2_VENV:+"$LOOM_TORCH2_VENV"} "$PEERS/torch" "$PEERS/xla"; do
  if [ -x "$v/bin/python" ] && "$v/bin/python" - <<'PY' 2>/dev/null; then
import sys, torch
sys.exit(int(torch.__version__.split(".")[0]) < 2)
PY
    venv=$v
    break
  fi
done
if [ -z "$venv" ]; then
  echo "test-torch2: no torch 2.x venv (\$LOOM_TORCH2_VENV, $PEERS/torch or $PEERS/xla; make one:" \
       "python3.12 -m venv $PEERS/torch && $PEERS/torch/bin/pip install torch==2.9.0 numpy); skipped"
  exit 0
fi
PY=$venv/bin/python
# The pinned build and test tools (as scripts/install-deps.sh pins them for .venv).
PY_PINS=(nanobind==2.9.2 scikit-build-core==0.11.6 pytest==8.3.5 safetensors==0.8.0 expecttest==0.2.1)
if ! "$PY" - "${PY_PINS[@]}" <<'PY' 2>/dev/null; then
import sys
from importlib.metadata import version
import numpy  # noqa: F401  (the tests need it too)
sys.exit(any(version(p.split("==")[0]) != p.split("==")[1] for p in sys.argv[1:]))
PY
  "$PY" -m pip install -q --disable-pip-version-check "${PY_PINS[@]}" numpy
fi
BUILD_DIR=${BUILD_DIR:-build-torch2}
echo "test-torch2: $("$PY" -c 'import sys, torch; print("Python", sys.version.split()[0], "torch", torch.__version__)') ($venv), building into $BUILD_DIR"
flock /tmp/loom-build.lock cmake -S . -B "$BUILD_DIR" -G Ninja -DLOOM_BUILD_PYTHON=ON \
  -DLOOM_PYTHON_EXECUTABLE="$PY" -DLOOM_BUILD_TESTS=OFF -DLOOM_BUILD_BENCH=OFF \
  -DLOOM_BUILD_EXAMPLES=OFF >/dev/null
flock /tmp/loom-build.lock cmake --build "$BUILD_DIR" -j "${JOBS:-$(nproc)}" --target loom_python_package
PYTHONPATH="$BUILD_DIR/python" "$PY" -m pytest -q -p no:cacheprovider python/tests "$@"
