#!/usr/bin/env bash
# Checks the architecture's layering (docs/architecture.md): each library
# links, and each module includes, only the layers below it. Uses CMake's own
# link graph (--graphviz) and the include lines of src/. Exit 1 on a breach.
set -euo pipefail
cd "$(dirname "$0")/.."

# Module -> the modules it may use (itself included).
declare -A allowed=(
  [core]="core"
  [kernels]="core kernels"
  [model]="core kernels model"
  [comm]="core comm"
  [parallel]="core kernels model parallel"
  [planner]="core kernels model parallel planner"
  [runtime]="core kernels model comm parallel planner runtime"
  [cli]="core kernels model comm parallel planner runtime cli"
)
bad=0

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cmake -S . -B "$dir/build" -G Ninja -DTESSERA_BUILD_TESTS=OFF -DTESSERA_BUILD_BENCH=OFF --graphviz="$dir/deps.dot" >/dev/null
# Edges between our libraries: "// tessera_a -> tessera_b"
while read -r from to; do
  a=${from#tessera_}; b=${to#tessera_}
  [ "$a" = "tessera" ] && continue  # the executable may link anything
  [ -n "${allowed[$a]+x}" ] || continue
  if [[ " ${allowed[$a]} " != *" $b "* ]]; then
    echo "layering: tessera_$a links tessera_$b"; bad=1
  fi
done < <(sed -n 's|.*// \(tessera_[a-z]*\) -> \(tessera_[a-z]*\)$|\1 \2|p' "$dir/deps.dot")

# Include lines: src/<module>/... may include "<other>/..." only when allowed.
for m in "${!allowed[@]}"; do
  [ -d "src/$m" ] || continue
  while IFS=: read -r file line inc; do
    target=${inc%%/*}
    [ -d "src/$target" ] || continue  # a system or third-party header
    if [[ " ${allowed[$m]} " != *" $target "* ]]; then
      echo "layering: $file:$line includes $target/ (a layer above $m)"; bad=1
    fi
  done < <(grep -rnoE '^#include "[a-z]+/' "src/$m" | sed -E 's|#include "||')
done

[ $bad -eq 0 ] && echo "layering: ok (libraries and includes)"
exit $bad
