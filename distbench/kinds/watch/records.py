"""What one watch cycle measured (Cycle, ProbeResult), what was judged of it (Judgement) and who
each rank is (RankInfo). Torch-free: the worker loop fills them, judge.Tracker reads them, and
watch.jsonl, watch.csv and the textfile are written from them."""

from __future__ import annotations

import statistics
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
    """A probe measured in one cycle. Its time is the back-to-back loop's (the slowest rank's,
    timed as `collective` times it), and busbw comes from it. Apart from that, each rank times
    each op inside the call (on a GPU between CUDA events around it): a rank that arrives late
    waits for nobody, while every other rank waits inside the call for it. So the rank the
    others wait for, a straggler, is the one whose in-call time is shortest, by about how late
    it came; a slow link instead slows every rank alike, and shows in busbw, not here."""

    probe: Probe
    status: str  # "ok" (measured), "skipped" (cannot run here) or "failed"
    time_us: float | None = None  # one op in the back-to-back loop: the slowest rank's mean
    busbw_gbps: float | None = None  # from time_us, as `collective` computes it
    rank_time_us: tuple[float, ...] = ()  # each rank's mean in-call time, indexed by rank
    note: str = ""
    # the rank the others waited for, and for how long (the loop gives them from each op's
    # in-call times, arrivals(); without them, from the means)
    late_rank: int | None = None
    lateness_us: float | None = None
    # the median op's time (its longest in-call time), what lateness_us is a share of: like
    # the lateness, moved little by one op a hiccup held, where time_us, a mean, is not
    op_us: float | None = None

    def __post_init__(self) -> None:
        if self.late_rank is None and len(self.rank_time_us) >= 2:
            rank, by = arrivals([[t] for t in self.rank_time_us])
            object.__setattr__(self, "late_rank", rank)
            object.__setattr__(self, "lateness_us", by)

    @property
    def spread(self) -> float | None:
        """The longest in-call time over the shortest, less 1."""
        t = [x for x in self.rank_time_us if x > 0]
        return max(t) / min(t) - 1 if len(t) >= 2 else None


def arrivals(calls_us: list[list[float]]) -> tuple[int, float]:
    """(the rank the others waited for, how long) from every rank's in-call time of each op
    (calls_us[rank][op]): each rank's lateness is the median over the ops of how much shorter
    its call was than the median of the others'; the latest rank is the one with the most. A
    median over the ops, not their mean: one op that a rank was descheduled in (a hiccup) moves
    it little, while a straggler is late in every op."""
    world, ops = len(calls_us), min(len(c) for c in calls_us)

    def late_by(rank: int) -> float:
        by = []
        for i in range(ops):
            others = sorted(calls_us[r][i] for r in range(world) if r != rank)
            by.append(others[len(others) // 2] - calls_us[rank][i])
        return statistics.median(by)

    lateness = [late_by(r) for r in range(world)]
    rank = max(range(world), key=lateness.__getitem__)
    return rank, lateness[rank]


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
    # each straggler's last lateness: the probe it was late in (Probe.key) and by how many us
    late_why: dict[int, tuple[str, float]] = field(default_factory=dict)
