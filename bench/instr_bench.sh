#!/usr/bin/env bash
# Instruction counts of the allocator model and of `memsim replay` (issue 17; results in
# docs/performance.md), for comparisons that machine load does not move: callgrind with its
# branch simulator (valgrind) counts the instructions retired and the branches (conditional and
# indirect) a simple predictor would miss. Three measures per build directory:
#   model   `alloc_bench 200000 1`, only inside replay::Replay (the 4 configurations);
#   replay  the whole `memsim replay` process on the seeded trace of `alloc_bench --write-csv`
#           (2,000,092 operations, 1 M distinct ids);
#   csv     the same with --csv.
# A second build directory (e.g. one of main) is measured the same way. Not a test: nothing is
# asserted. Takes a few minutes per build (callgrind runs about 50 times slower).
# Usage: bench/instr_bench.sh [BUILD_DIR] [OTHER_BUILD_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
command -v valgrind > /dev/null || { echo "valgrind is needed"; exit 2; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
first=${1:-build}
"$first/alloc_bench" --write-csv "$dir/trace.csv" || exit 2

# count LABEL COMMAND...: instructions and mispredicted conditional branches of one run.
count() {
  local label=$1; shift
  valgrind --tool=callgrind --branch-sim=yes --callgrind-out-file=/dev/null "$@" \
    > /dev/null 2> "$dir/log" || { echo "$label: failed"; return; }
  awk -v l="$label" '/I *refs:/ { gsub(",", "", $4); ir = $4 }
    /Mispredicts:/ { gsub(",", "", $3); mp = $3 }
    END { printf "%-28s %8.1f M instructions %6.2f M mispredicted branches\n", l, ir / 1e6, mp / 1e6 }' \
    "$dir/log"
}

for build in "$first" ${2:-}; do
  count "$build model" --toggle-collect='memsim::replay::Replay(memsim::replay::Trace const&, memsim::alloc::Allocator&, memsim::replay::ReplayRowSink*)' \
    "$build/alloc_bench" 200000 1
  count "$build replay" "$build/memsim" replay "$dir/trace.csv"
  count "$build replay --csv" "$build/memsim" replay "$dir/trace.csv" --csv "$dir/out.csv"
done
