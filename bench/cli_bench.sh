#!/usr/bin/env bash
# Times the end-to-end commands whose speed the issues set goals for (docs/performance.md):
#   memsim run (embedded default)                       goal: well under 1 s
#   memsim run <llama2-70b ... pp8, 64 micro-batches>   goal: under 2 s
#   memsim check configs/*.json                         goal: under 5 s
#   memsim run <qwen3-30b-a3b ... pp4 ep4>              goal: under 1 s (issue 12)
# Usage: bench/cli_bench.sh [BUILD_DIR] [REPEATS]. Prints best and median wall seconds of
# REPEATS runs each. Not a test: nothing is asserted.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
repeats=${2:-5}
memsim="$build/memsim"
[ -x "$memsim" ] || { echo "build memsim first ($memsim not found)"; exit 2; }
seventy=$(ls configs/*70b*pp8*.json | head -n 1)
qwen_moe=$(ls configs/qwen3-30b-a3b*.json | head -n 1)

measure() {
  local name=$1; shift
  local times=()
  for _ in $(seq "$repeats"); do
    local start end
    start=$(date +%s%N)
    "$@" > /dev/null
    end=$(date +%s%N)
    times+=("$(( (end - start) / 1000000 ))")
  done
  local sorted
  sorted=$(printf '%s\n' "${times[@]}" | sort -n)
  local best median
  best=$(echo "$sorted" | head -n 1)
  median=$(echo "$sorted" | sed -n "$(( (repeats + 1) / 2 ))p")
  awk -v n="$name" -v b="$best" -v m="$median" \
    'BEGIN { printf "%-45s best %6.3f s   median %6.3f s\n", n, b / 1000, m / 1000 }'
}

measure "run (embedded default)" "$memsim" run
measure "run $seventy" "$memsim" run "$seventy"
measure "run $qwen_moe" "$memsim" run "$qwen_moe"
measure "check configs/*.json ($(ls configs/*.json | wc -l) configs)" "$memsim" check configs/*.json
