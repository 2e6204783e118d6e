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
    """A probe measured in one cycle. Each rank times only the time inside the collective call
    (on a GPU between CUDA events around it): a rank that arrives late waits for nobody, while
    every other rank waits inside the call for it. So the rank the others wait for, a straggler,
    is the one whose in-call time is shortest, by about how late it came; a slow link instead
    slows every rank alike, and shows in busbw, not here."""

    probe: Probe
    status: str  # "ok" (measured), "skipped" (cannot run here) or "failed"
    time_us: float | None = None  # the cycle's time of one op: the slowest rank's mean
    busbw_gbps: float | None = None  # from time_us, as `collective` computes it
    rank_time_us: tuple[float, ...] = ()  # each rank's mean in-call time, indexed by rank
    note: str = ""

    @property
    def spread(self) -> float | None:
        """The longest in-call time over the shortest, less 1."""
        t = [x for x in self.rank_time_us if x > 0]
        return max(t) / min(t) - 1 if len(t) >= 2 else None

    @property
    def late_rank(self) -> int | None:
        """The rank the others waited for: the shortest in-call time."""
        if len(self.rank_time_us) < 2:
            return None
        return min(range(len(self.rank_time_us)), key=self.rank_time_us.__getitem__)

    @property
    def lateness_us(self) -> float | None:
        """How long the others waited for late_rank: the median of their in-call times less
        its own."""
        r = self.late_rank
        if r is None:
            return None
        others = sorted(t for i, t in enumerate(self.rank_time_us) if i != r)
        return others[len(others) // 2] - self.rank_time_us[r]


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
    stragglers: tuple[int, ...] = ()  # ranks late in k of the last n cycles
    late_counts: dict[int, int] = field(default_factory=dict)  # in the last n cycles
    changes: tuple[str, ...] = ()  # one line per state that changed in this cycle
