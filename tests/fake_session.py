"""The one stand-in for distbench.run.session.Session, for tests that run a command's body (or a
part of one) in this process, on threads acting as ranks or on a one-rank group. It states what
a body may read of a session: the attributes and methods below, each as the real one gives
them with no launcher, store or watchdog behind it. A body that reads anything else fails here
with an AttributeError, as it would have to be added to Session first."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import torch

from distbench.results import writer
from distbench.run.faults import Faults
from distbench.run.runtime import Runtime

CPU = torch.device("cpu")


def ranks_of(world: int, nnodes: int = 1, host: str = "h", device: torch.device = CPU
             ) -> list[dict]:
    """run.json's `ranks` for `world` ranks over `nnodes` nodes of equal size, in rank order, as
    the startup builds them (distbench.run.runtime)."""
    per_node = -(-world // nnodes)
    return [{"rank": r, "host": host, "node": r // per_node, "local_rank": r % per_node,
             "device": str(device)} for r in range(world)]


def fake_runtime(rank: int = 0, world: int = 1, *, nnodes: int = 1, backend: str = "gloo",
            device: torch.device = CPU, ranks: list[dict] | None = None,
            snapshots: list[dict] | None = None, peers=None) -> Runtime:
    """A real Runtime with no process group, store or launcher behind it (peers None, as the
    Runtime's own comment allows for tests): its nnodes comes from its ranks, as a real one's."""
    ranks = ranks if ranks is not None else ranks_of(world, nnodes, device=device)
    return Runtime(rank, world, ranks[rank]["local_rank"] if rank < len(ranks) else rank,
                   backend, device, ranks=ranks, snapshots=snapshots or [], peers=peers)


class Said:
    """A Console that keeps what rank 0 would show: log lines (stderr) and table lines (stdout)."""

    def __init__(self) -> None:
        self.logged: list[str] = []
        self.printed: list[str] = []

    def log(self, message: str) -> None:
        self.logged.append(message)

    def lines(self, lines: list[str]) -> None:
        self.printed.extend(lines)


class FakeSession:
    """What a command body reads of a Session. `opts` are the options it reads (keywords, or
    an Options); the phases it names (phase(what, seconds)) are kept in `phases` and the failures
    it posts (failed_here) in `failures`. With a run_dir it writes rank 0's files there, as a
    real session does; without one its sinks drop the rows, as on any other rank."""

    def __init__(self, rt: Runtime | None = None, opts=None, *, console=None,
                 faults: Faults | None = None, run_dir: Path | None = None,
                 record: writer.RunRecord | None = None, command: str = "test",
                 on_phase: Callable[[str, float], None] | None = None, **options):
        self.command = command
        self.rt = rt if rt is not None else fake_runtime()
        self.opts = opts if opts is not None else SimpleNamespace(**options)
        assert opts is None or not options, "give the options either as opts or as keywords"
        self.console = console if console is not None else Said()
        self.faults = faults if faults is not None else Faults()
        self.run_dir = run_dir
        self.record = record
        self.current = "startup"
        self.on_end: list = []
        self.on_stop: list = []
        self.phases: list[str] = []
        self.failures: list[tuple[str, str]] = []
        self._on_phase = on_phase
        self._sinks: dict = {}

    def phase(self, what: str, seconds: float) -> None:
        self.current = what
        self.phases.append(what)
        if self._on_phase is not None:
            self._on_phase(what, seconds)

    def sink(self, output) -> writer.CsvSink | writer.NullSink:
        if output.file not in self._sinks:
            self._sinks[output.file] = (
                writer.NullSink() if self.run_dir is None
                else writer.CsvSink(self.run_dir / output.file, list(output.csv)))
        return self._sinks[output.file]

    def close_sinks(self) -> None:
        """What the real session does as the run ends, however it ends."""
        for sink in self._sinks.values():
            sink.close()

    @contextlib.contextmanager
    def watching_failures(self) -> Iterator[None]:
        """No store to post a failure to: the caller agrees over the process group instead."""
        yield

    def failed_here(self, label: str, reason: str) -> None:
        self.failures.append((label, reason))

    def end_part(self) -> str | None:
        return None  # no store: as the real one says without one


class Record:
    """run.json's fields kept in memory (`meta`), for a body that only updates them: what
    writer.RunRecord.update does without a directory to write to."""

    def __init__(self) -> None:
        self.meta: dict = {}

    def update(self, **fields) -> None:
        self.meta.update(fields)
