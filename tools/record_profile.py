#!/usr/bin/env python3
"""Record per-iteration device memory from a PyTorch or torch_npu training loop into a file that
`memsim compare --format memsim-csv` reads (docs/profiles.md).

Add three lines to the training loop:

    from record_profile import MemoryRecorder
    rec = MemoryRecorder("memory.csv")          # torch.npu if torch_npu is loaded, else torch.cuda
    for iteration, batch in enumerate(loader, start=1):
        rec.phase(iteration, "forward");        loss = model(batch)
        rec.phase(iteration, "backward");       loss.backward()
        rec.phase(iteration, "optimizer_step"); optimizer.step(); optimizer.zero_grad()
    rec.close()

Each call records a sample (time, iteration, phase, memory_allocated, memory_reserved, and
device-level usage from mem_get_info) at the phase boundary. With track_peaks=True (default) it
first records the peak the allocator reached during the phase that ends (max_memory_allocated /
max_memory_reserved), then resets the peak counters, so short-lived peaks inside a phase are not
lost. That reset also affects other users of max_memory_allocated (e.g. Megatron's
report_memory): pass track_peaks=False to keep them. rec.watch(model) adds a sample after every
module's forward for a denser curve. Call rec.phase(0, "init") before building the model to
record the initialisation.

Columns (docs/interfaces.md, 'CSV timeline'): time_us,iteration,phase,allocated_bytes,
reserved_bytes,active_bytes,device_bytes. time_us counts from the recorder's creation; a value
the backend cannot give is left empty. The file is flushed after every sample, so a crashed run still leaves its samples.
"""

import argparse
import os
import sys
import time

PHASES = ("init", "forward", "backward", "optimizer_step", "unknown")
HEADER = "time_us,iteration,phase,allocated_bytes,reserved_bytes,active_bytes,device_bytes"


def _backend():
    """torch.npu when torch_npu is imported and usable, else torch.cuda."""
    import torch  # noqa: F401  (imported here so the module loads without torch)
    if "torch_npu" in sys.modules and hasattr(torch, "npu") and torch.npu.is_available():
        return torch.npu
    if torch.cuda.is_available():
        return torch.cuda
    raise RuntimeError("record_profile: neither torch.npu nor torch.cuda is available")


class MemoryRecorder:
    def __init__(self, path, device=None, track_peaks=True, record_device=True, backend=None):
        self._mem = backend if backend is not None else _backend()
        self._device = device if device is not None else self._mem.current_device()
        self._track_peaks = track_peaks
        self._record_device = record_device and hasattr(self._mem, "mem_get_info")
        self._start_ns = time.perf_counter_ns()
        self._iteration = -1
        self._phase = "unknown"
        tmp = path
        self._file = open(tmp, "w", newline="\n")
        self._file.write("# memsim-csv written by tools/record_profile.py; device %s\n" % self._device)
        self._file.write(HEADER + "\n")
        self._file.flush()
        if self._track_peaks:
            self._mem.reset_peak_memory_stats(self._device)

    def _now_us(self):
        return (time.perf_counter_ns() - self._start_ns) / 1000.0

    def _device_used(self):
        if not self._record_device:
            return None
        free, total = self._mem.mem_get_info(self._device)
        return total - free

    def _write(self, time_us, allocated, reserved, active, device):
        def field(v):
            return "" if v is None else str(int(v))
        self._file.write("%.3f,%d,%s,%s,%s,%s,%s\n" % (
            time_us, self._iteration, self._phase, field(allocated), field(reserved),
            field(active), field(device)))
        self._file.flush()

    def sample(self):
        """Records the current values under the current iteration and phase."""
        stats = self._mem.memory_stats(self._device) if hasattr(self._mem, "memory_stats") else {}
        active = stats.get("active_bytes.all.current")
        self._write(self._now_us(), self._mem.memory_allocated(self._device),
                    self._mem.memory_reserved(self._device), active, self._device_used())

    def phase(self, iteration, name):
        """Marks the start of phase `name` ("init", "forward", "backward", "optimizer_step") of
        `iteration` (0 = init, 1 = first training iteration)."""
        if name not in PHASES:
            raise ValueError("record_profile: phase must be one of %s, got %r" % (PHASES, name))
        now = self._now_us()
        if self._track_peaks and self._iteration >= 0:
            # The peak of the phase that ends, just before the boundary.
            self._write(max(now - 0.001, 0.0), self._mem.max_memory_allocated(self._device),
                        self._mem.max_memory_reserved(self._device), None, None)
            self._mem.reset_peak_memory_stats(self._device)
        self._iteration = int(iteration)
        self._phase = name
        self.sample()

    def watch(self, model):
        """Samples after every leaf module's forward (a denser curve during forward)."""
        handles = []
        for module in model.modules():
            if next(module.children(), None) is None:
                handles.append(module.register_forward_hook(lambda *_: self.sample()))
        return handles

    def close(self):
        if self._file is not None:
            if self._iteration >= 0:
                self.phase(self._iteration, self._phase)  # the last phase's peak and end
            self._file.close()
            self._file = None


class _FakeBackend:
    """A scripted allocator for --selftest: forward adds 4 x 256 MiB, backward frees them."""
    MiB = 1 << 20

    def __init__(self):
        self.allocated, self.reserved, self.peak_alloc, self.peak_res = 0, 0, 0, 0

    def current_device(self):
        return 0

    def set(self, allocated):
        self.allocated = allocated
        self.reserved = max(self.reserved, -(-allocated // (512 * self.MiB)) * 512 * self.MiB)
        self.peak_alloc = max(self.peak_alloc, self.allocated)
        self.peak_res = max(self.peak_res, self.reserved)

    def memory_allocated(self, _):
        return self.allocated

    def memory_reserved(self, _):
        return self.reserved

    def max_memory_allocated(self, _):
        return self.peak_alloc

    def max_memory_reserved(self, _):
        return self.peak_res

    def reset_peak_memory_stats(self, _):
        self.peak_alloc, self.peak_res = self.allocated, self.reserved

    def memory_stats(self, _):
        return {"active_bytes.all.current": self.allocated}

    def mem_get_info(self, _):
        total = 65536 * self.MiB
        return total - self.reserved - 3000 * self.MiB, total


def _selftest(path):
    fake = _FakeBackend()
    rec = MemoryRecorder(path, backend=fake)
    rec.phase(0, "init")
    fake.set(2048 * fake.MiB)
    for iteration in range(1, 4):
        rec.phase(iteration, "forward")
        for _ in range(4):
            fake.set(fake.allocated + 256 * fake.MiB)
        rec.phase(iteration, "backward")
        fake.set(fake.allocated - 1024 * fake.MiB)
        rec.phase(iteration, "optimizer_step")
        fake.set(fake.allocated + 512 * fake.MiB)
        fake.set(fake.allocated - 512 * fake.MiB)
    rec.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--selftest", metavar="OUT",
                        help="write a profile of a scripted fake allocator to OUT (no torch needed)")
    args = parser.parse_args()
    if args.selftest:
        _selftest(args.selftest)
    else:
        parser.print_help()
