#!/usr/bin/env bash
# The whole-process goals of issue 17 (docs/performance.md, 'Scale (issue 17)'): `memsim run` on
# the embedded default (goal 30 ms) and on configs/llama2-70b-h100-tp8-pp8.json (goal 150 ms),
# measured alternately for each binary given, so that a shared machine's load falls on all alike.
# For each command and binary: wall milliseconds (perf's 'time elapsed', best and median), CPU
# milliseconds (perf's task-clock: every thread's time added up) and page faults (medians), over
# ROUNDS rounds. A binary named
# "1cpu:PATH" runs PATH under `taskset -c 0` (AvailableCpus = 1: no thread, the sequential run).
# Needs perf. Not a test: nothing is asserted.
# Usage: bench/goals_bench.sh ROUNDS BINARY...   e.g. bench/goals_bench.sh 9 /tmp/old/memsim build/memsim 1cpu:build/memsim
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=$1; shift
command -v perf > /dev/null || { echo "needs perf"; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

run_one() {  # run_one BINARY ARGS... -> appends "wall_ms cpu_ms faults" to $out/<key>
  local bin=$1 key; shift
  key=$(echo "$bin $*" | tr -c 'A-Za-z0-9' '_')
  local cmd=("$bin")
  if [[ $bin == 1cpu:* ]]; then cmd=(taskset -c 0 "${bin#1cpu:}"); fi
  perf stat -e task-clock,page-faults -o "$out/stat" "${cmd[@]}" run "$@" > /dev/null
  awk '$2 == "msec" && $3 == "task-clock" { cpu = $1 } $2 == "page-faults" { pf = $1 }
       $3 == "time" && $4 == "elapsed" { wall = $1 * 1000 }
       END { gsub(",", "", pf); printf "%.1f %.1f %d\n", wall, cpu, pf }' "$out/stat" >> "$out/$key"
}

echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
for args in "" "configs/llama2-70b-h100-tp8-pp8.json"; do
  for _ in $(seq "$rounds"); do
    for bin in "$@"; do
      # shellcheck disable=SC2086
      run_one "$bin" $args
    done
  done
  for bin in "$@"; do
    key=$(echo "$bin $args" | tr -c 'A-Za-z0-9' '_')
    col() { cut -d' ' -f"$1" "$out/$key" | sort -n | sed -n "$2p"; }
    n=$(wc -l < "$out/$key"); m=$(( (n + 1) / 2 ))
    printf '%-44s %-30s wall best %6.1f median %6.1f ms; cpu median %6.1f ms; faults median %d\n' \
      "run ${args:-(default)}" "$bin" "$(col 1 1)" "$(col 1 "$m")" "$(col 2 "$m")" "$(col 3 "$m")"
  done
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
