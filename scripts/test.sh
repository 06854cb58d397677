#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test through CTest.
#   LOOM_SANITIZE=1 scripts/test.sh   runs the suite under -fsanitize=address,undefined.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
if [ "${LOOM_SANITIZE:-0}" = 1 ]; then BUILD_DIR=${BUILD_DIR:-build-asan}; else BUILD_DIR=${BUILD_DIR:-build}; fi
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "${JOBS:-$(nproc)}"
# The Python package (built into $BUILD_DIR/python; skipped under LOOM_SANITIZE, where the
# module is not built: an ASan extension needs the ASan runtime LD_PRELOADed into Python).
if [ -d "$BUILD_DIR/python/loom" ]; then
  PYTHONPATH="$BUILD_DIR/python" .venv/bin/python -m pytest -q python/tests
else
  echo "test.sh: no Python module in $BUILD_DIR (LOOM_SANITIZE or no .venv); pytest skipped"
fi
