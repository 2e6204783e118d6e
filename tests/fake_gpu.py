"""A simulated GPU for the timing tests: a host that launches ops into a queue of bounded depth,
a GPU that runs them in order, events stamped with the GPU's clock. It counts the host's waits
for the GPU (`syncs`), so a test can hold a timed loop to one wait at its end."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

import torch
import torch.distributed as dist

from distbench.bench import timing


class FakeGPU:
    """Host and GPU clocks in seconds. Every launch (an op, an event's record, a graph's replay)
    takes a queue slot until the GPU has run it; a full queue blocks the host."""

    def __init__(self, launch_s: float, op_s: float, depth: int = 1024):
        self.launch_s, self.op_s, self.depth = launch_s, op_s, depth
        self.host = 0.0
        self.gpu_free = 0.0  # when the GPU has run everything queued so far
        self.queue: deque[float] = deque()  # completion times of the queued launches
        self.syncs = 0  # the host's waits for the GPU (a device or an event synchronize)

    def enqueue(self, work_s: float) -> float:
        while self.queue and self.queue[0] <= self.host:
            self.queue.popleft()
        if len(self.queue) >= self.depth:
            self.host = self.queue.popleft()  # the host waits for the oldest slot to free
        self.gpu_free = max(self.host, self.gpu_free) + work_s
        self.queue.append(self.gpu_free)
        return self.gpu_free

    def op(self, ops: int = 1) -> None:
        self.host += self.launch_s
        self.enqueue(ops * self.op_s)

    def install(self, monkeypatch) -> None:
        gpu = self

        class Event:
            def __init__(self, enable_timing=False):
                self.t = 0.0

            def record(self):
                self.t = gpu.enqueue(0.0)

            def synchronize(self):
                gpu.syncs += 1
                gpu.host = max(gpu.host, self.t)

            def elapsed_time(self, other) -> float:
                return (other.t - self.t) * 1e3

        def synchronize(device=None):
            gpu.syncs += 1
            gpu.host = max(gpu.host, gpu.gpu_free)

        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
        monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=lambda: gpu.host))
        monkeypatch.setattr(dist, "barrier", lambda *a, **k: synchronize())
