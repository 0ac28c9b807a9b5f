#!/usr/bin/env python3
"""ctest export.snapshot_python: pickle.load of `memsim run --snapshot` finds the fields
pytorch.org/memory_viz reads (torch/utils/viz/MemoryViz.js; torch/cuda/memory.py _snapshot).
Usage: check_snapshot.py MEMSIM OUTDIR"""
import os
import pickle
import subprocess
import sys

memsim, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
path = os.path.join(out, "default.pickle")
# The default config shortened to 4 micro-batches and 3 iterations (the pickle's size grows with
# the run, its structure does not).
subprocess.run([memsim, "run", "--set", "training.global_batch_size=16", "--iterations", "3",
                "--no-chart", "--snapshot", path], check=True,
               stdout=subprocess.DEVNULL)
with open(path, "rb") as f:
    snap = pickle.load(f)
assert isinstance(snap, dict), type(snap)
segments = snap["segments"]
assert segments, "no segments"
for s in segments:
    for key in ("device", "address", "total_size", "stream", "segment_type", "allocated_size",
                "active_size", "blocks"):
        assert key in s, ("segment", key)
    assert s["device"] == 0
    assert sum(b["size"] for b in s["blocks"]) == s["total_size"]
    for b in s["blocks"]:
        for key in ("size", "requested_size", "state", "address"):
            assert key in b, ("block", key)
        assert b["state"] in ("active_allocated", "active_pending_free", "inactive"), b["state"]
traces = snap["device_traces"]
assert isinstance(traces, list) and len(traces) == 1
actions = set()
for e in traces[0]:
    for key in ("action", "addr", "size", "stream", "time_us", "frames"):
        assert key in e, ("entry", key)
    actions.add(e["action"])
    if e["action"] == "alloc":
        assert e["frames"] and e["frames"][0]["name"] and e["frames"][0]["filename"], e
assert {"segment_alloc", "alloc", "free_requested", "free_completed"} <= actions, actions
print("ok: %d segments, %d trace entries, actions %s" % (len(segments), len(traces[0]),
                                                          sorted(actions)))
