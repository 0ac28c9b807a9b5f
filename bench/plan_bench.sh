#!/usr/bin/env bash
# Candidates a second of `memsim plan` (issue 36 goal: at least 1,000 candidates judged in under
# 10 s of wall time on the 2-core machine, for Llama-3-8B on 8 H100, global batch 256, sequence
# 8192; docs/performance.md, 'memsim plan'). Runs the default space of that case (288 layouts:
# 108 refused by the rules, 180 simulated in full) REPEATS times and prints, for the best run:
# wall, CPU (user and sys) seconds, the wall time two idle cores would take (CPU / 2: the
# candidates run on one thread each), layouts judged a second (every verdict, rules included) and layouts
# simulated a second. Extra arguments go to `memsim plan` (e.g. --iterations 2, --vary mbs=1,2,4,8).
# Usage: bench/plan_bench.sh [BUILD_DIR] [REPEATS] [PLAN ARGS...]. Not a test: nothing is asserted.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
repeats=${2:-1}
shift $(( $# < 2 ? $# : 2 ))
memsim="$build/memsim"
[ -x "$memsim" ] || { echo "build memsim first ($memsim not found)"; exit 2; }
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

best_wall=""
for _ in $(seq "$repeats"); do
  start=$(date +%s%N)
  cpu=$( { /usr/bin/env time -f '%U %S' "$memsim" plan --model llama3-8b --device h100-80g \
      --devices 8 --global-batch-size 256 --seq-length 8192 --max-candidates 100000 \
      --json "$scratch/plan.json" "$@" > /dev/null; } 2>&1 | tail -n 1)
  end=$(date +%s%N)
  wall=$(( (end - start) / 1000000 ))
  if [ -z "$best_wall" ] || [ "$wall" -lt "$best_wall" ]; then best_wall=$wall; best_cpu=$cpu; fi
done
read -r enumerated simulated fitting < <(python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
print(j["enumerated"], j["simulated"], j["fitting"])' "$scratch/plan.json")
awk -v w="$best_wall" -v c="$best_cpu" -v e="$enumerated" -v s="$simulated" -v f="$fitting" \
  -v cpus="$(nproc)" -v load="$(cut -d" " -f1 /proc/loadavg)" 'BEGIN {
    split(c, t, " "); cpu = t[1] + t[2]; wall = w / 1000
    printf "llama3-8b on 8 x h100-80g, gbs 256, seq 8192 (%d CPUs, load %s)\n", cpus, load
    printf "layouts %d, simulated in full %d, fitting %d\n", e, s, f
    printf "wall %.2f s, CPU %.2f s (user %.2f s, sys %.2f s)\n", wall, cpu, t[1], t[2]
    printf "on 2 idle cores (CPU / 2, candidates on 2 threads) about %.1f s: %.1f judged a second\n",
      cpu / 2, e / (cpu / 2)
    printf "judged a second (wall) %.1f; simulated a second (wall) %.1f; CPU s a simulation %.3f\n",
      e / wall, s / wall, cpu / s
  }'
