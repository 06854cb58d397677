#!/usr/bin/env bash
# Installs every Debian package loom needs to build, test and benchmark. Idempotent: apt-get
# skips what is already installed. Run as root (or with sudo available).
set -euo pipefail
packages=(
  build-essential cmake ninja-build ccache lld
  llvm-19-dev libzstd-dev
  libopenblas-dev
  libgtest-dev libbenchmark-dev
  libxxhash-dev nlohmann-json3-dev
  pybind11-dev python3-dev python3-numpy
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
