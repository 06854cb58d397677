#!/usr/bin/env bash
# The main job: install dependencies, build, run the examples report and the benchmarks.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
build/examples/loom-examples
echo
build/examples/loom-train-lm
echo
build/bench/loom-bench all
