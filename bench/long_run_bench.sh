#!/usr/bin/env bash
# Does `memsim run` cost what its simulated iterations cost, whatever train_iters is? For every
# shipped config (configs/*.json), times `memsim run CONFIG --no-chart --iterations N` for
# N = 4, S, 1,000 and 1,000,000, S being the iterations a run of 1,000,000 simulates to show its
# steady state (its "simulated S of 1000000 iterations" line; docs/config.md 'Long runs'; S = 4
# when the steady state shows within 4 iterations). Prints CPU seconds (user + system, from
# /usr/bin/time: steadier than wall time on a shared machine), the ratio 1,000,000 / S and a
# verdict: "ok" when the run of 1,000,000 iterations costs at most 10 % more than the run of S
# (or at most 0.02 s more: the figures have a 0.01 s resolution and vary by as much between runs
# under load), "SLOW" otherwise. The ratio
# 1,000,000 / 4 is shown for the record: where S > 4 a 4-iteration run has not reached the steady
# state, so it cannot be what a long run costs (docs/performance.md, 'Long runs cost their
# simulated iterations').
# Usage: bench/long_run_bench.sh [BUILD_DIR] [REPEATS]. Best of REPEATS runs each. Not a test:
# nothing is asserted, but the exit status is 1 when a config is SLOW.
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

printf '%-38s %6s %3s %6s %7s %7s %7s %7s %s\n' config "4 it" S "S it" "1000 it" "1e6 it" "1e6/4" "1e6/S" verdict
slow=0
for config in configs/*.json; do
  s=$(simulated_iterations "$config")
  s=${s:-4}
  a=$(cpu_seconds run "$config" --no-chart --iterations 4)
  if [ "$s" -gt 4 ]; then b=$(cpu_seconds run "$config" --no-chart --iterations "$s"); else b=$a; fi
  k=$(cpu_seconds run "$config" --no-chart --iterations 1000)
  c=$(cpu_seconds run "$config" --no-chart --iterations 1000000)
  line=$(awk -v n="$(basename "$config" .json)" -v a="$a" -v s="$s" -v b="$b" -v k="$k" -v c="$c" 'BEGIN {
    r1 = a > 0 ? c / a : 0; r2 = b > 0 ? c / b : 0
    v = (c <= 1.10 * b || c - b <= 0.02 + 1e-9) ? "ok" : "SLOW"
    printf "%-38s %6.2f %3d %6.2f %7.2f %7.2f %7.2f %7.2f %s", n, a, s, b, k, c, r1, r2, v }')
  echo "$line"
  case "$line" in *SLOW) slow=1 ;; esac
done
exit "$slow"
