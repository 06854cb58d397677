#!/usr/bin/env bash
# Configures and builds loom into BUILD_DIR (default: build). Extra arguments go to cmake.
# With the venv .venv (scripts/install-deps.sh) it also builds the Python package into
# BUILD_DIR/python:  PYTHONPATH=build/python .venv/bin/python -c 'import loom'
#   LOOM_SANITIZE=1 builds with -fsanitize=address,undefined (Debug, into build-asan).
#   LOOM_SANITIZE=thread builds loom_tests with -fsanitize=thread (RelWithDebInfo, into
#   build-tsan; no bench or examples: TSan is for the threads suite, see scripts/test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
targets=()
case "${LOOM_SANITIZE:-0}" in
  0) BUILD_DIR=${BUILD_DIR:-build}
     # The module whenever the venv has nanobind: CMake caches the option's default from the
     # first configure, which may have run before install-deps made the venv.
     if .venv/bin/python -m nanobind --cmake_dir >/dev/null 2>&1; then
       set -- -DLOOM_BUILD_PYTHON=ON "$@"
     fi ;;
  1) BUILD_DIR=${BUILD_DIR:-build-asan}
     set -- -DLOOM_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug "$@" ;;
  thread) BUILD_DIR=${BUILD_DIR:-build-tsan}
     set -- -DLOOM_SANITIZE=thread -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOOM_BUILD_BENCH=OFF \
       -DLOOM_BUILD_EXAMPLES=OFF "$@"
     targets=(--target loom_tests) ;;
  *) echo "build.sh: LOOM_SANITIZE must be 0, 1 or thread, got '${LOOM_SANITIZE}'" >&2; exit 2 ;;
esac
cmake -S . -B "$BUILD_DIR" -G Ninja "$@" >/dev/null
cmake --build "$BUILD_DIR" -j "${JOBS:-$(nproc)}" "${targets[@]}"
