#!/bin/sh
# ctest export.snapshot_python: runs check_snapshot.py where python3 is present; exit 77 (skipped)
# otherwise. Usage: snapshot_python_test.sh MEMSIM OUTDIR
if ! command -v python3 >/dev/null 2>&1; then
  echo "skipped: no python3"
  exit 77
fi
exec python3 "$(dirname "$0")/check_snapshot.py" "$1" "$2"
