#!/usr/bin/env bash
# Scale benchmark (issue 17; results in docs/performance.md): CPU (user) time, wall time and
# peak RSS of `memsim run` (the embedded default, llama2-7b TP2 DP4, one stage) against the
# micro-batches per iteration (global_batch_size = 4 × m at DP 4) and against train_iters.
# Prints the load average, then one line per point: m or iterations, CPU (user) seconds, wall
# seconds, peak RSS MB, user microseconds per micro-batch simulated. A point memsim
# refuses (docs/config.md, 'Limits') prints the refusal instead. Then the two whole-process
# goals of issue 17 (the embedded default, the llama2-70b PP8 config): best and median user+sys
# seconds of 5 runs, and, when valgrind is installed, the instructions each retires
# (callgrind; independent of the machine's load, so comparable between sessions).
# Not a test: nothing is asserted.
# Usage: bench/scale_bench.sh [BUILD_DIR] [MAX_M] (MAX_M: the largest micro-batch count, 16384)
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
max_m=${2:-16384}
memsim="$build/memsim"
[ -x "$memsim" ] || { echo "build memsim first ($memsim not found)"; exit 2; }

# point LABEL DIVISOR ARGS...: runs memsim once under /usr/bin/time.
point() {
  local label=$1 divisor=$2; shift 2
  local err
  err=$(mktemp)
  if /usr/bin/time -f '%U %e %M' "$memsim" run --no-chart "$@" > /dev/null 2> "$err"; then
    read -r user secs kb < <(tail -n 1 "$err")
    awk -v l="$label" -v u="$user" -v s="$secs" -v k="$kb" -v d="$divisor" \
      'BEGIN { printf "%-24s %8.2f s user %8.2f s wall %9.1f MB %10.1f us user per micro-batch\n", l, u, s, k / 1024, u * 1e6 / d }'
  else
    printf '%-24s refused: %s\n' "$label" "$(grep -v '^[0-9.]* [0-9.]* [0-9]*$' "$err" | head -n 1)"
  fi
  rm -f "$err"
}

echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "micro-batches per iteration (train_iters 4):"
for m in 16 64 256 1024 4096 16384; do
  [ "$m" -le "$max_m" ] || break
  point "m = $m" $((4 * m)) --set training.global_batch_size=$((4 * m))
done
echo "iterations (m = 16):"
for n in 4 100 1000 10000; do
  point "train_iters = $n" $((16 * n)) --set training.train_iters=$n
done
# whole LABEL ARGS...: best and median user+sys seconds of 5 runs, then callgrind's count.
whole() {
  local label=$1; shift
  local cpu=()
  for _ in 1 2 3 4 5; do
    cpu+=("$( { /usr/bin/time -f '%U %S' "$memsim" run "$@" > /dev/null; } 2>&1 | tail -n 1 |
      awk '{ printf "%.3f", $1 + $2 }')")
  done
  local sorted
  sorted=$(printf '%s\n' "${cpu[@]}" | sort -n)
  printf '%-24s best %s s, median %s s user+sys' "$label" "$(sed -n 1p <<< "$sorted")" \
    "$(sed -n 3p <<< "$sorted")"
  if command -v valgrind > /dev/null; then
    local out
    out=$(mktemp)
    valgrind --tool=callgrind --callgrind-out-file="$out" "$memsim" run "$@" > /dev/null 2>&1
    printf ', %s M instructions' "$(awk '/^summary:/ { printf "%.0f", $2 / 1e6 }' "$out")"
    rm -f "$out"
  fi
  echo
}
echo "whole process:"
whole "default"
whole "llama2-70b PP8" configs/llama2-70b-h100-tp8-pp8.json
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
