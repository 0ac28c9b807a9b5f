#!/usr/bin/env bash
# Does `memsim run` cost what its simulated iterations cost, whatever train_iters is? For every
# shipped config (configs/*.json), times `memsim run CONFIG --no-chart --iterations N` for
# N = 4 and 1,000,000, and, when the long run simulates S > 4 iterations to show its steady state
# (its "simulated S of 1000000 iterations" line; docs/config.md 'Long runs'), for N = S too.
# Prints CPU seconds (user + system, from /usr/bin/time: steadier than wall time on a shared
# machine) and the ratios 1,000,000 / 4 and 1,000,000 / S: the second is what "cost independent
# of train_iters" compares, a run of S iterations being what the long run must simulate
# (docs/performance.md, 'Long runs cost their simulated iterations').
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

# The iterations a run of 1,000,000 simulates (its text report's "simulated S of ..." line).
simulated_iterations() {
  "$memsim" run "$1" --no-chart --iterations 1000000 2> /dev/null |
    sed -n 's/.*simulated \([0-9][0-9]*\) of 1000000 iterations.*/\1/p' | head -n 1
}

printf '%-38s %7s %4s %7s %7s %7s %7s\n' config "4 it" S "S it" "1e6 it" "1e6/4" "1e6/S"
for config in configs/*.json; do
  s=$(simulated_iterations "$config")
  s=${s:-4}
  a=$(cpu_seconds run "$config" --no-chart --iterations 4)
  if [ "$s" -gt 4 ]; then b=$(cpu_seconds run "$config" --no-chart --iterations "$s"); else b=$a; fi
  c=$(cpu_seconds run "$config" --no-chart --iterations 1000000)
  awk -v n="$(basename "$config" .json)" -v a="$a" -v s="$s" -v b="$b" -v c="$c" 'BEGIN {
    r1 = a > 0 ? c / a : 0; r2 = b > 0 ? c / b : 0
    printf "%-38s %7.2f %4d %7.2f %7.2f %7.2f %7.2f\n", n, a, s, b, c, r1, r2 }'
done
