"""What one watch cycle measured (Cycle, ProbeResult), what was judged of it (Judgement) and who
each rank is (RankInfo). Torch-free: the worker loop fills them, judge.Tracker reads them, and
watch.jsonl, watch.csv and the textfile are written from them."""

from __future__ import annotations

from dataclasses import dataclass, field

SCHEMA_VERSION = 1  # of watch.jsonl's lines (distbench/schemas/watch-line.schema.json)
STATES = ("ok", "warn", "fail", "unknown")  # a probe's and the verdict's, best to worst


@dataclass(frozen=True)
class Probe:
    """One measurement repeated every cycle: a collective at one size on one scope."""

    op: str  # a collective's name, as `collective --op` takes it (all_reduce, all_gather, ...)
    size_bytes: int
    scope: str = "cluster"  # "cluster": every rank in one group
    dtype: str = "float32"

    @property
    def key(self) -> str:
        return f"{self.op}/{self.size_bytes}/{self.scope}"

    def labels(self) -> dict[str, str]:
        return {"op": self.op, "size": str(self.size_bytes), "scope": self.scope}


@dataclass(frozen=True)
class RankInfo:
    """A rank, named as the DCGM exporter names its GPU, so the two join in PromQL."""

    rank: int
    hostname: str  # DCGM's `Hostname`
    gpu: str  # DCGM's `gpu`: the local device index as text ("" on a CPU)
    uuid: str  # DCGM's `UUID` ("" where NVML gives none)

    def labels(self) -> dict[str, str]:
        return {"rank": str(self.rank), "Hostname": self.hostname, "gpu": self.gpu,
                "UUID": self.uuid}


@dataclass(frozen=True)
class ProbeResult:
    probe: Probe
    status: str  # "ok" (measured), "skipped" (cannot run here) or "failed"
    time_us: float | None = None  # the cycle's time: the slowest rank's mean
    busbw_gbps: float | None = None  # from time_us, as `collective` computes it
    rank_time_us: tuple[float, ...] = ()  # each rank's own mean, indexed by rank
    note: str = ""

    @property
    def spread(self) -> float | None:
        """The slowest rank's time over the fastest's, less 1."""
        t = [x for x in self.rank_time_us if x > 0]
        return max(t) / min(t) - 1 if len(t) >= 2 else None

    @property
    def slowest_rank(self) -> int | None:
        if not self.rank_time_us:
            return None
        return max(range(len(self.rank_time_us)), key=self.rank_time_us.__getitem__)


@dataclass(frozen=True)
class Cycle:
    index: int  # 0, 1, ...
    started: float  # unix seconds
    duration_s: float
    late: bool  # took longer than --interval
    results: tuple[ProbeResult, ...]


@dataclass(frozen=True)
class ProbeState:
    state: str  # one of STATES
    median_us: float | None = None  # over the last W cycles
    p95_us: float | None = None
    cv: float | None = None  # coefficient of variation over the last W cycles
    baseline_us: float | None = None
    why: str = ""


@dataclass(frozen=True)
class Judgement:
    probes: dict[str, ProbeState]  # by Probe.key
    verdict: str  # the worst probe state ("unknown" while nothing is judged)
    stragglers: tuple[int, ...] = ()  # ranks slowest in k of the last n cycles
    slowest_counts: dict[int, int] = field(default_factory=dict)  # in the last n cycles
    changes: tuple[str, ...] = ()  # one line per state that changed in this cycle
