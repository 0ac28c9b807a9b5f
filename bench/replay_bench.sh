#!/usr/bin/env bash
# Replay benchmark (issue 17; results in docs/performance.md): `memsim replay` end to end (read,
# parse, replay, print) of the seeded training-like trace of replay/synthetic.h written as a CSV
# trace by `alloc_bench --write-csv`, and the same with --csv. Prints, per binary and run, the
# user CPU seconds, wall seconds and peak RSS from /usr/bin/time, and operations per user second.
# Then a JSON snapshot made from the same trace (each malloc an `alloc` entry, each free a
# `free_requested` + `free_completed` pair, frames included as PyTorch writes them), replayed with
# `memsim replay`: its peak RSS shows whether the snapshot is held as a document.
# A second memsim binary (e.g. one built from main) is run alternately with the first, so both
# see the same machine load. Not a test: nothing is asserted.
# Usage: bench/replay_bench.sh [BUILD_DIR] [OPERATIONS] [RUNS] [OTHER_MEMSIM]
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
ops=${2:-2000000}
runs=${3:-3}
other=${4:-}
[ -x "$build/memsim" ] && [ -x "$build/alloc_bench" ] || {
  echo "build memsim and alloc_bench first ($build)"; exit 2; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$build/alloc_bench" --write-csv "$dir/trace.csv" "$ops" || exit 2
lines=$(($(wc -l < "$dir/trace.csv") - 1))
echo "trace: $lines operations, $(($(stat -c %s "$dir/trace.csv") / 1000000)) MB"

# one LABEL MEMSIM ARGS...: one run under /usr/bin/time.
one() {
  local label=$1 memsim=$2; shift 2
  /usr/bin/time -f '%U %e %M' -o "$dir/time" "$memsim" replay "$dir/trace.csv" "$@" > /dev/null ||
    { echo "$label: failed"; return; }
  read -r user wall kb < "$dir/time"
  awk -v l="$label" -v u="$user" -v w="$wall" -v k="$kb" -v n="$lines" \
    'BEGIN { printf "%-22s %6.2f s user %6.2f s wall %8.1f MB  %6.2f M ops/user s\n", l, u, w, k / 1024, n / (u > 0 ? u : 0.01) / 1e6 }'
}

for ((i = 0; i < runs; ++i)); do
  one "this" "$build/memsim"
  [ -n "$other" ] && one "other" "$other"
  one "this --csv" "$build/memsim" --csv "$dir/out.csv"
  [ -n "$other" ] && one "other --csv" "$other" --csv "$dir/out.csv"
done

# The snapshot from the trace's first 200,000 lines (a DOM of it takes about 2 GB).
head -n 200001 "$dir/trace.csv" > "$dir/head.csv"
python3 - "$dir/head.csv" "$dir/trace.json" <<'PY'
import sys
addr, live, n = {}, 1 << 40, 0
with open(sys.argv[1]) as f, open(sys.argv[2], "w") as out:
    out.write('{"segments": [], "device_traces": [[\n')
    first = True
    next(f)  # header
    for line in f:
        op, tid, size, stream = line.rstrip("\n").split(",")
        if op == "malloc":
            live += 1 << 21
            addr[tid] = live
            es = [("alloc", live, size)]
        elif op == "free" and tid in addr:
            a = addr.pop(tid)
            es = [("free_requested", a, 0), ("free_completed", a, 0)]
        else:
            continue
        for action, a, sz in es:
            out.write(("" if first else ",\n") + '{"action": "%s", "addr": %d, "size": %s, '
                      '"stream": %s, "time_us": %d, "frames": [{"name": "f", '
                      '"filename": "model.py", "line": 1}]}' % (action, a, sz, stream, n, ))
            first = False
            n += 1
    out.write("\n]]}\n")
PY
echo "snapshot: $(($(stat -c %s "$dir/trace.json") / 1000000)) MB"
mv "$dir/trace.json" "$dir/trace.csv"  # `one` replays trace.csv; the content tells the format
one "this snapshot" "$build/memsim"
[ -n "$other" ] && one "other snapshot" "$other"
