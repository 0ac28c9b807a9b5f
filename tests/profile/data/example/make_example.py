#!/usr/bin/env python3
"""Writes the README's compare example (deterministic; no torch needed):
  trace.json.gz  -- a PyTorch profiler Chrome trace shaped like one GPU of a Llama-style run
                    (32 layers, 3 profiled steps ProfilerStep#2..4, new Kineto time base), with
                    the small allocations and the unsorted event order of a real trace;
  simulated.csv  -- a memsim-csv timeline of the same run as the simulator would predict it.
The "measured" activations are 4% larger than the simulated ones and its reserved memory
grows by a 1 GiB segment in the first two profiled steps (fragmentation), so the comparison has
something to say.
"""
import gzip
import json
import random

MiB = 1 << 20
LAYERS = 32


def iteration_events(rng, start_us, static, act_mib, reserved, grow, fragmentation=0):
    """(ts_us, allocated, reserved) samples of one iteration; returns (samples, end_us, reserved)."""
    t, alloc, out = start_us, static, []

    def emit(delta, dt):
        nonlocal t, alloc, reserved
        t += dt
        alloc += delta
        while alloc > reserved:
            reserved += 2048 * MiB if grow else 1024 * MiB
        out.append((t, alloc, reserved))

    for _ in range(LAYERS):  # forward: saved activations + a temporary per layer
        emit(int(act_mib * MiB), 900 + rng.randint(0, 200))
        emit(96 * MiB + rng.randint(0, 8) * 512, 300)
        emit(-(96 * MiB + 0), 250)
    emit(1000 * MiB, 400)  # logits
    emit(-1000 * MiB, 600)
    for _ in range(LAYERS):  # backward: gradient temporaries, activations freed
        emit(192 * MiB, 1500 + rng.randint(0, 300))
        emit(-192 * MiB - int(act_mib * MiB), 600)
    reserved += fragmentation  # a new segment: the step's temporaries did not fit the cache
    emit(2048 * MiB, 800)  # optimizer step temporaries
    emit(-2048 * MiB, 1200)
    return out, t, reserved


def main():
    rng = random.Random(7)
    static = 14080 * MiB
    events, steps = [], []
    t, reserved = 1_000_000.0, 16384 * MiB
    for step in range(2, 5):
        samples, end, reserved = iteration_events(rng, t, static, 187.2, reserved, grow=step < 4,
                                                  fragmentation=1024 * MiB if step < 4 else 0)
        steps.append((step, t - 5.0, end - t + 10.0))
        events += samples
        t = end + 2000
    trace = {"schemaVersion": 1,
             "deviceProperties": [{"id": 0, "name": "GPU-80G", "totalGlobalMem": 85899345920}],
             "displayTimeUnit": "ms", "baseTimeNanoseconds": 1751328000000000000, "traceEvents": []}
    ev = trace["traceEvents"]
    for step, ts, dur in steps:
        ev.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#%d" % step,
                   "pid": 812, "tid": 812, "ts": "%.3f" % ts, "dur": "%.3f" % dur, "args": {}})
    mem = [{"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 812,
            "tid": 812, "ts": round(ts, 3),
            "args": {"Device Type": 1, "Device Id": 0, "Addr": 140000000000000 + 512 * i,
                     "Bytes": 0, "Total Allocated": a, "Total Reserved": r}}
           for i, (ts, a, r) in enumerate(events)]
    rng.shuffle(mem)  # Kineto appends memory events out of order
    ev += mem
    with gzip.GzipFile("trace.json.gz", "wb", mtime=0) as f:
        f.write(json.dumps(trace, separators=(",", ":")).encode())

    # The simulation: init, then 4 iterations with 180 MiB of activations per layer and the
    # reserved pool settled after iteration 1.
    rows, t, reserved = [], 0.0, 0
    for k in range(4):
        alloc = (k + 1) * 3520 * MiB
        t += 5000
        reserved = max(reserved, alloc)
        rows.append((t, 0, "init", alloc, reserved))
    reserved = 16384 * MiB
    for k in range(1, 5):
        samples, end, reserved = iteration_events(random.Random(k), t, static, 180.0, reserved, False)
        n_fwd = 3 * LAYERS + 2
        for i, (ts, a, r) in enumerate(samples):
            phase = "forward" if i < n_fwd else "backward" if i < n_fwd + 2 * LAYERS else "optimizer_step"
            rows.append((ts, k, phase, a, r))
        t = end + 1500
    with open("simulated.csv", "w") as f:
        f.write("time_us,iteration,phase,allocated_bytes,reserved_bytes,active_bytes,device_bytes\n")
        for ts, k, phase, a, r in rows:
            f.write("%.3f,%d,%s,%d,%d,,%d\n" % (ts, k, phase, a, r, r + 1100 * MiB))


if __name__ == "__main__":
    main()
