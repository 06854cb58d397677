#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test through CTest.
#   LOOM_SANITIZE=1 scripts/test.sh        runs the suite under -fsanitize=address,undefined.
#   LOOM_SANITIZE=thread scripts/test.sh   runs the Threads suites, the step graph's, row
#                                          runs' and tier-up's tests under -fsanitize=thread (LLVM's and
#                                          OpenBLAS's own races, if any, are in
#                                          scripts/tsan.supp, each with its reason).
#   LOOM_TESTS=REGEX                       runs only the CTest tests matching REGEX.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
case "${LOOM_SANITIZE:-0}" in
  1) BUILD_DIR=${BUILD_DIR:-build-asan} ;;
  thread) BUILD_DIR=${BUILD_DIR:-build-tsan}; LOOM_TESTS=${LOOM_TESTS:-^Threads|^StepGraph|TheStepGraph|^RowRuns|^CpuTierUp} ;;
  *) BUILD_DIR=${BUILD_DIR:-build} ;;
esac
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/scripts/tsan.supp}
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "${JOBS:-$(nproc)}" ${LOOM_TESTS:+-R "$LOOM_TESTS"}
# The Python package (built into $BUILD_DIR/python; not under LOOM_SANITIZE, where the module
# is not built: an ASan extension needs the ASan runtime LD_PRELOADed into Python).
if [ "${LOOM_SANITIZE:-0}" != 0 ]; then
  echo "test.sh: no Python module in $BUILD_DIR (LOOM_SANITIZE); pytest skipped"
elif [ -d "$BUILD_DIR/python/loom" ]; then
  PYTHONPATH="$BUILD_DIR/python" .venv/bin/python -m pytest -q python/tests
elif .venv/bin/python -m nanobind --cmake_dir >/dev/null 2>&1; then
  echo "test.sh: .venv has nanobind but $BUILD_DIR has no Python module (configured with LOOM_BUILD_PYTHON=OFF?)" >&2
  exit 1
else
  echo "test.sh: no .venv with nanobind (scripts/install-deps.sh makes it); pytest skipped"
fi
# The same Python suite on torch 2.x where a venv with it exists (skipped, saying so, elsewhere).
if [ "${LOOM_SANITIZE:-0}" = 0 ]; then
  scripts/test-torch2.sh
fi
