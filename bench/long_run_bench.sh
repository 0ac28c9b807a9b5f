#!/usr/bin/env bash
# Does `memsim run` cost what its simulated iterations cost, whatever train_iters is? For every
# shipped config, times `memsim run CONFIG --no-chart --iterations N` for N = 4, 1,000 and
# 1,000,000 and prints CPU seconds (user + system, from /usr/bin/time: steadier than wall time
# on a shared machine) with the ratios 1,000,000 / 4 and 1,000,000 / 1,000 (docs/performance.md,
# 'Long runs cost their simulated iterations').
# Usage: bench/long_run_bench.sh [BUILD_DIR] [REPEATS]. Best of REPEATS runs each. Not a test:
# nothing is asserted.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
repeats=${2:-3}
memsim="$build/memsim"
[ -x "$memsim" ] || { echo "build memsim first ($memsim not found)"; exit 2; }

# Best CPU seconds of $repeats runs of memsim with the given arguments.
cpu_seconds() {
  local best=""
  for _ in $(seq "$repeats"); do
    local t tfile
    tfile=$(mktemp)
    /usr/bin/time -o "$tfile" -f "%U %S" "$memsim" "$@" > /dev/null 2> /dev/null
    t=$(tail -n 1 "$tfile" | awk '{ printf "%.2f", $1 + $2 }')
    rm -f "$tfile"
    if [ -z "$best" ] || awk -v a="$t" -v b="$best" 'BEGIN { exit !(a < b) }'; then best=$t; fi
  done
  echo "$best"
}

printf '%-45s %8s %8s %8s %9s %9s\n' config "4 it" "1e3 it" "1e6 it" "1e6/4" "1e6/1e3"
for config in configs/*.json; do
  a=$(cpu_seconds run "$config" --no-chart --iterations 4)
  b=$(cpu_seconds run "$config" --no-chart --iterations 1000)
  c=$(cpu_seconds run "$config" --no-chart --iterations 1000000)
  awk -v n="$(basename "$config")" -v a="$a" -v b="$b" -v c="$c" 'BEGIN {
    r1 = a > 0 ? c / a : 0; r2 = b > 0 ? c / b : 0
    printf "%-45s %8.2f %8.2f %8.2f %9.2f %9.2f\n", n, a, b, c, r1, r2 }'
done
