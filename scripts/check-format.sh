#!/usr/bin/env bash
# Fails when a C++ file of the tree differs from what clang-format-19 makes of it
# (.clang-format: 2 spaces, 100 columns). `scripts/check-format.sh --fix` rewrites them.
set -euo pipefail
cd "$(dirname "$0")/.."
CLANG_FORMAT=${CLANG_FORMAT:-clang-format-19}
mapfile -t files < <(git ls-files '*.h' '*.cpp' | grep -v '^tests/fixtures/')
if [ "${1:-}" = "--fix" ]; then
  "$CLANG_FORMAT" -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  if ! "$CLANG_FORMAT" --dry-run -Werror "$f" >/dev/null 2>&1; then bad+=("$f"); fi
done
if ((${#bad[@]})); then
  printf 'check-format: %s is not formatted (scripts/check-format.sh --fix)\n' "${bad[@]}"
  exit 1
fi
echo "check-format: ${#files[@]} files formatted"
