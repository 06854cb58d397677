#!/usr/bin/env bash
# Installs every Debian package loom needs to build, test and benchmark. Idempotent: apt-get
# skips what is already installed. Run as root (or with sudo available).
set -euo pipefail
packages=(
  build-essential cmake ninja-build ccache lld
  llvm-19-dev libzstd-dev
  libopenblas-dev libdnnl-dev libgloo-dev
  libgtest-dev libbenchmark-dev
  libxxhash-dev nlohmann-json3-dev clang-format-19
  python3-dev python3-venv python3-numpy python3-torch
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
else
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The Python venv .venv: Debian's python3 with its site packages visible (python3-numpy,
# python3-torch 1.13, the tests' oracle) plus the pinned PyPI build and test tools. Quick when
# the pins are already installed.
cd "$(dirname "$0")/.."
PY_PINS=(nanobind==2.9.2 scikit-build-core==0.11.6 pytest==8.3.5 safetensors==0.8.0 expecttest==0.2.1)
if [ ! -x .venv/bin/python ]; then
  /usr/bin/python3 -m venv --system-site-packages .venv
fi
if ! .venv/bin/python - "${PY_PINS[@]}" <<'PY' 2>/dev/null; then
import sys
from importlib.metadata import version
sys.exit(any(version(p.split("==")[0]) != p.split("==")[1] for p in sys.argv[1:]))
PY
  .venv/bin/python -m pip install -q --disable-pip-version-check "${PY_PINS[@]}"
fi
echo "install-deps: .venv has ${PY_PINS[*]}"
