#!/usr/bin/env bash
# Configures and builds loom into BUILD_DIR (default: build). Extra arguments go to cmake.
# With the venv .venv (scripts/install-deps.sh) it also builds the Python package into
# BUILD_DIR/python:  PYTHONPATH=build/python .venv/bin/python -c 'import loom'
#   LOOM_SANITIZE=1 builds with -fsanitize=address,undefined (Debug, into build-asan).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${LOOM_SANITIZE:-0}" = 1 ]; then
  BUILD_DIR=${BUILD_DIR:-build-asan}
  set -- -DLOOM_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug "$@"
else
  BUILD_DIR=${BUILD_DIR:-build}
fi
cmake -S . -B "$BUILD_DIR" -G Ninja "$@" >/dev/null
cmake --build "$BUILD_DIR" -j "${JOBS:-$(nproc)}"
