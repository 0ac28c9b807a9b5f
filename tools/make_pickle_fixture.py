#!/usr/bin/env python3
"""Writes the SYNTHETIC pickled memory-snapshot fixtures of tests/replay/data/ and their JSON
twins. Not a measurement: a small hand-made allocator history shaped like what
torch.cuda.memory._dump_snapshot writes (torch/cuda/memory.py, _snapshot: segments,
device_traces, allocator_settings) and like torch_npu's variant (torch_npu/npu/memory.py:
entries without time_us, pool_id, workspace_snapshot entries), built to exercise the pickle
reader: tuples, floats, None, booleans, memo references (shared objects and repeated strings)
and addresses at or above 2^63 (LONG1 with 9 bytes).

Usage: tools/make_pickle_fixture.py [OUTDIR]   (default tests/replay/data)
The expected replay results are derived in tests/replay/pickle_test.cc."""
import json
import os
import pickle
import sys

MIB = 1 << 20
BASE = 0xFFFF800000000000  # >= 2^63: pickled as a 9-byte LONG1
STREAM = 140000000000000   # a raw cudaStream_t handle, as torch records it


def trace(npu):
    # One frame object shared by every entry: pickle writes it once and then memo references.
    frames = ({"filename": "synthetic.py", "line": 1, "name": "step"},)
    entries = []

    def entry(action, addr, size, t):
        e = {"action": action, "addr": addr, "size": size, "stream": STREAM, "frames": frames}
        if npu:
            e["pool_id"] = (0, 0)
        else:
            e["time_us"] = t
        entries.append(e)

    entry("segment_alloc", BASE, 20 * MIB, 100)
    entry("alloc", BASE, 4 * MIB, 101)
    entry("alloc", BASE + 4 * MIB, 6 * MIB, 102)
    entry("free_requested", BASE, 4 * MIB, 103)   # freed at once: free_completed follows
    entry("free_completed", BASE, 4 * MIB, 103)
    entry("free_requested", BASE + 4 * MIB, 6 * MIB, 104)  # used on another stream: deferred
    entry("alloc", BASE + 10 * MIB, 1 * MIB, 105)
    entry("free_completed", BASE + 4 * MIB, 6 * MIB, 106)
    if npu:
        entries.append({"action": "workspace_snapshot", "addr": 0, "size": 0, "stream": 0,
                        "frames": ()})
    return entries


def snapshot(npu):
    segment = {
        "device": 0, "address": BASE, "total_size": 20 * MIB, "allocated_size": 1 * MIB,
        "active_size": 1 * MIB, "requested_size": 1 * MIB, "stream": STREAM,
        "segment_type": "large", "is_expandable": False,
        "blocks": [
            {"address": BASE, "size": 10 * MIB, "requested_size": 0, "state": "inactive"},
            {"address": BASE + 10 * MIB, "size": 1 * MIB, "requested_size": 1 * MIB,
             "state": "active_allocated", "frames": ()},
            {"address": BASE + 11 * MIB, "size": 9 * MIB, "requested_size": 0,
             "state": "inactive"},
        ],
    }
    segment["segment_pool_id"] = (0, 0)
    settings = {"PYTORCH_CUDA_ALLOC_CONF": None, "garbage_collection_threshold": 0.0,
                "max_split_size": -1, "expandable_segments": False, "release_lock_on_malloc": True,
                "memory_fraction": 0.75}
    return {"segments": [segment], "device_traces": [trace(npu)], "allocator_settings": settings}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join("tests", "replay", "data")
    os.makedirs(out, exist_ok=True)
    for name, npu, protocol in (("snapshot-synthetic", False, 4),
                                ("snapshot-npu-synthetic", True, 2)):
        snap = snapshot(npu)
        with open(os.path.join(out, name + ".pickle"), "wb") as f:
            pickle.dump(snap, f, protocol=protocol)
        with open(os.path.join(out, name + ".json"), "w") as f:
            json.dump(snap, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
