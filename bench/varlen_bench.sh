#!/usr/bin/env bash
# 1,000 steps of varying length (docs/config.md, 'Sample lengths'): the shipped Llama-3-8B LoRA
# config (configs/llama3-8b-lora-rtx4090.json) trained on the sample lengths of
# configs/data/alpaca-en-demo-llama3-lengths.txt, each micro-batch padded to its longest sample,
# so that every one of the 1,000 steps is simulated (no steady state). Prints wall and CPU
# seconds and the peak resident memory of `memsim run` (from /usr/bin/time), best of REPEATS by
# wall time, for 100 and 1,000 steps (memory bounded: the second must not hold ten times the
# first), with and without expandable_segments, and the report's step lines.
# Usage: bench/varlen_bench.sh [BUILD_DIR] [REPEATS]. Not a test: nothing is asserted.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
repeats=${2:-3}
memsim="$build/memsim"
[ -x "$memsim" ] || { echo "build memsim first ($memsim not found)"; exit 2; }
config=configs/llama3-8b-lora-rtx4090.json
data='training.data={"lengths": "data/alpaca-en-demo-llama3-lengths.txt"}'

# "wall cpu maxrss_MiB" of the best (by wall time) of $repeats runs.
measure() {
  local best="" best_line=""
  for _ in $(seq "$repeats"); do
    local tfile
    tfile=$(mktemp)
    /usr/bin/time -o "$tfile" -f "%e %U %S %M" "$memsim" "$@" > /dev/null 2> /dev/null
    local line
    line=$(tail -n 1 "$tfile" | awk '{ printf "%.2f %.2f %.0f", $1, $2 + $3, $4 / 1024 }')
    rm -f "$tfile"
    local wall=${line%% *}
    if [ -z "$best" ] || awk -v a="$wall" -v b="$best" 'BEGIN { exit !(a < b) }'; then
      best=$wall
      best_line=$line
    fi
  done
  echo "$best_line"
}

printf '%-40s %7s %7s %9s\n' run wall_s cpu_s maxrss_MiB
for steps in 100 1000; do
  for alloc in "" "allocator.expandable_segments=true"; do
    args=(run "$config" --no-chart --iterations "$steps" --set "$data")
    name="$steps steps"
    if [ -n "$alloc" ]; then
      args+=(--set "$alloc")
      name="$name, expandable_segments"
    fi
    read -r wall cpu rss < <(measure "${args[@]}")
    printf '%-40s %7s %7s %9s\n' "$name" "$wall" "$cpu" "$rss"
  done
done
echo
echo "fixed length (no data), 1000 steps: steady state after a few simulated"
read -r wall cpu rss < <(measure run "$config" --no-chart --iterations 1000)
printf '%-40s %7s %7s %9s\n' "1000 steps, max_seq_length each" "$wall" "$cpu" "$rss"
echo
"$memsim" run "$config" --no-chart --iterations 1000 --set "$data" | sed -n '/steps of varying length/,$p'
