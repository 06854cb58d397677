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
# Distributed: the seed decoder data-parallel and train_lm tensor-parallel, 2 ranks each.
build/tools/loom-launch -n 2 build/examples/loom-dist-examples decoder-dp
echo
build/tools/loom-launch -n 2 build/examples/loom-dist-examples train-lm-tp
echo
# The seed decoder laid out by mark_sharding (column then row; then the batch dim), 2 ranks.
build/tools/loom-launch -n 2 build/examples/loom-dist-examples decoder-sharded
echo
# The same from Python: the seed's six examples, train_lm, and the seed's compile-time table.
export PYTHONPATH=build/python
for ex in examples/python/example*.py; do
  echo "== $ex"
  .venv/bin/python "$ex"
  echo
done
# The seed's six examples as torch_xla users wrote them, on loom.torch (torch 1.13 here).
for ex in examples/torch/example*.py; do
  echo "== $ex"
  .venv/bin/python "$ex"
  echo
done
# A nanoGPT trained on loom.torch beside torch eager, from the same weights and batches.
echo "== examples/torch/gpt.py"
.venv/bin/python examples/torch/gpt.py
echo
.venv/bin/python examples/python/train_lm.py
echo
.venv/bin/python examples/python/seed_table.py
echo
# The seed decoder trained data-parallel on 2 ranks (Gloo over 127.0.0.1).
echo "== examples/python/data_parallel.py on 2 ranks"
.venv/bin/python -m loom.launch -n 2 examples/python/data_parallel.py
echo
# The same decoder laid out by mark_sharding (column then row; then the batch dim), 2 ranks.
echo "== examples/python/sharding.py on 2 ranks"
.venv/bin/python -m loom.launch -n 2 examples/python/sharding.py
echo
build/bench/loom-bench all
