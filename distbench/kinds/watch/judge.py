"""Judging a stream of watch cycles: rolling statistics, a baseline, hysteresis and stragglers.
Pure and torch-free: `Tracker.observe` takes a records.Cycle and returns a records.Judgement.
Memory is bounded by the options, never by how long watch runs (it runs for weeks): every
history is a deque with a maxlen.

The rules:
- **Rolling statistics** per probe over its last `window` measured cycles: median, p95 and the
  coefficient of variation (stdev over mean).
- **Baseline** per probe: the one given (an accept run's or a --baseline watch run's time and
  noise), else the median of the probe's own first `warm` measured cycles (WARM, 20: fewer
  understate a noisy machine's noise), with their spread (slowest over fastest, less 1) as its
  noise. Until a probe has a baseline it is "unknown", and
  the verdict is "unknown" while no probe is judged: a verdict on nothing measured is never "ok".
- **A bad cycle.** "Worse" is noise.judge's rule, the one accept's rows use (compare judges two
  runs' repetitions by noise.call instead, which a cycle's one time does not have): the
  time over the baseline's must pass the tolerance and the noise by noise.MARGIN. Worse at twice
  the tolerance is fail-bad, else warn-bad. A probe whose status is "failed" is fail-bad (no
  baseline needed to fail); "skipped", or a probe missing from the cycle, changes nothing.
- **Hysteresis.** A probe goes up to warn or fail only when at least k of its last n cycles are
  bad at that level or worse; it steps down only after k consecutive cycles below its level
  (fail -> warn after k cycles none fail-bad, -> ok after k clean ones). One cycle, or k-1 of n,
  moves nothing: a noisy machine flaps otherwise (soperator issue 1840).
- **Verdict**: the worst judged state (fail > warn > ok), and at least warn while a straggler
  is named (a rank late in k of n cycles is a fault though every probe's time stays within its
  noise: with a noisy warm-up, a 10 ms straggler on a 2 ms probe can); "unknown" only when
  nothing is judged and no straggler named.
- **Stragglers.** In a cycle, a measured probe's late_rank counts as late when the others waited
  for it (records.arrivals: the median over the cycle's ops) more than a share of its median
  op's time (an op a hiccup held moves neither): noise.limit(tolerance, skew) - 1, kept within
  [LATE_FLOOR, LATE_CAP]. skew is the largest such share in the probe's cycles before its
  baseline (the skew this machine shows when healthy: some rank is always last by a hair, and
  naming it would be a false alarm); 0 with a given baseline, where LATE_FLOOR stands. Not the
  time's noise from cycle to cycle: a gloo cycle that swings 3x between cycles still has its
  ranks arrive within microseconds of each other. LATE_CAP bounds it from above, so no warm-up,
  however noisy, switches naming off: a rank late by more than LATE_CAP counts as late in the
  cycles before the baseline too (against the others in the same cycle), and such a cycle's
  share is no part of the skew. So a rank slow from the first cycle is named. A rank late (in
  any probe) in at least k of the last n cycles is a straggler; it stops being one after k
  consecutive cycles not late. Cycles that measured nothing do not count either way.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

from distbench.core import noise
from distbench.core.sizes import format_size
from distbench.kinds.watch.records import Cycle, Judgement, Probe, ProbeResult, ProbeState

LEVELS = ("ok", "warn", "fail")  # a judged probe's states, by level 0, 1, 2
# Cycles a probe's own baseline is the median of, their spread its noise. Not 3: a few cycles of
# a noisy machine often agree by chance, and understate the noise. Seeded streams of 150 cycles
# under tests/unit/kinds/watch/test_watch_judge.py's A/A model raised a false warn or fail, at
# +-10% noise, in 41 of 300 streams with 3 cycles, 13 of 300 with 5, 2 of 2000 with 10; at +-15%,
# in 97 of 300 with 3, 5 of 2000 with 10, none of 2000 with 20.
WARM = 20
# The share of a probe's time the others must wait for a rank, at the least and at the most,
# for it to count as late in a cycle (the module docstring's rule). On this project's 2-core VM
# (gloo, 64 KiB all-reduce, --iters 10, 2026-11-28, other work beside it), healthy cycles'
# shares were at most 0.13 (30 cycles at 2 ranks) and 0.03 (30 at 4 ranks); a rank slowed 10
# ms an op kept the others waiting 0.87-0.94 of the op at 2 ranks, 0.73-0.83 at 3, and
# 0.35-0.69 at 4 (where the op itself takes longer). benchmarks/watch_health.py measures both.
LATE_FLOOR = 0.3
LATE_CAP = 0.4


def label(probe: Probe) -> str:
    """How a probe reads in a change line: "all_reduce 1 MiB cluster"."""
    return f"{probe.op} {format_size(probe.size_bytes)} {probe.scope}"


@dataclass
class _History:
    """What the tracker keeps of one probe: all bounded."""

    times: deque[float]  # the last `window` measured times
    levels: deque[int]  # the last n judged cycles: 0 clean, 1 warn-bad, 2 fail-bad
    warm: list[float] = field(default_factory=list)  # up to `warm` times, then emptied
    baseline: float | None = None
    noise: float | None = None
    level: int = 0
    judged: bool = False  # a cycle was judged against the baseline: "ok" means something
    source: str = ""  # where the baseline came from, for the change line
    # how late the last rank came, over the probe's time, in the cycles before the baseline:
    # the largest is the arrival skew this machine shows when healthy
    skew_warm: list[float] = field(default_factory=list)
    skew: float = 0.0

    @property
    def state(self) -> str:
        if self.level == 0 and not self.judged:
            return "unknown"
        return LEVELS[self.level]


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x) and x > 0


class Tracker:
    """Judges cycles one by one (see the module docstring for the rules)."""

    def __init__(self, probes: list[Probe], world: int, *, window: int = 20, k: int = 3,
                 n: int = 5, tolerance: float = 0.15, warm: int = WARM,
                 baseline: dict[str, tuple[float, float | None]] | None = None,
                 learn: bool = True) -> None:
        keys = [p.key for p in probes]
        if len(set(keys)) != len(keys):
            raise ValueError(f"probes repeat: {keys}")
        if world < 1 or window < 1 or warm < 1 or not 1 <= k <= n:
            raise ValueError(f"need world, window, warm >= 1 and 1 <= k <= n, got world={world} "
                             f"window={window} warm={warm} k={k} n={n}")
        if not (math.isfinite(tolerance) and tolerance > 0):
            raise ValueError(f"tolerance must be above 0, got {tolerance}")
        self.probes = {p.key: p for p in probes}
        self.world, self.window, self.k, self.n = world, window, k, n
        self.tolerance, self.warm = tolerance, warm
        # False (--once): a probe with no given baseline stays unknown; its own cycle would be
        # its baseline, and judging a cycle against itself reads "ok" on nothing
        self.learn = learn
        self._hist = {key: _History(deque(maxlen=window), deque(maxlen=n)) for key in keys}
        for key, (time_us, spread) in (baseline or {}).items():
            if key not in self._hist:
                raise ValueError(f"baseline names {key}, which is not a probe here")
            if not _finite(time_us) or (spread is not None
                                        and not (math.isfinite(spread) and spread >= 0)):
                raise ValueError(f"baseline for {key}: time {time_us}, noise {spread} "
                                 "(a time above 0 and a noise of 0 or more, or none)")
            h = self._hist[key]
            h.baseline, h.noise, h.source = float(time_us), spread, "given"
        self._late = [deque(maxlen=n) for _ in range(world)]  # per rank: late in each cycle?
        self._stragglers: set[int] = set()
        # each rank's last lateness: the probe it was late in (its key) and by how many us
        self._late_why: dict[int, tuple[str, float]] = {}

    # -- one probe -------------------------------------------------------------------------
    def _bad(self, h: _History, time_us: float) -> int:
        """0, 1 (warn-bad) or 2 (fail-bad): noise.judge's "worse" at the tolerance and at
        twice it."""
        assert h.baseline is not None
        ratio, spreads = time_us / h.baseline, [h.noise]
        if noise.judge(ratio, 2 * self.tolerance, spreads).mark == "worse":
            return 2
        return 1 if noise.judge(ratio, self.tolerance, spreads).mark == "worse" else 0

    def _step(self, h: _History, bad: int) -> None:
        """Hysteresis: up when k of the last n are at a level or worse, down a level only
        after k consecutive cycles below it."""
        h.levels.append(bad)
        up = max((lv for lv in (1, 2) if sum(b >= lv for b in h.levels) >= self.k), default=0)
        if up > h.level:
            h.level = up
            return
        last = list(h.levels)[-self.k:]
        if h.level and len(last) == self.k and max(last) < h.level:
            h.level = 0 if max(last) == 0 else 1

    def _why(self, h: _History, r: ProbeResult, old: str) -> str:
        before = LEVELS.index(old) if old != "unknown" else -1
        if h.level > max(before, 0):
            worse = sum(b >= h.level for b in h.levels)
            start = f"{worse} of the last {len(h.levels)} cycles {LEVELS[h.level]}-bad"
        elif before == -1:
            noisy = "unknown" if h.noise is None else f"{h.noise:.0%}"
            given = f"the first {self.warm} cycles'" if h.source == "warm" else "given"
            start = f"baseline {h.baseline:.4g} us, noise {noisy}, {given}"
        elif h.level == 1:
            start = f"{self.k} cycles in a row not fail-bad"
        elif h.state == "unknown":
            start = f"{self.k} cycles in a row measured, no baseline yet"
        else:
            start = f"{self.k} cycles in a row clean"
        if r.status == "failed":
            return f"{start}; this one failed{': ' + r.note if r.note else ''}"
        if h.baseline is not None and _finite(r.time_us):
            return (f"{start}; this one {r.time_us / h.baseline:.2f}x the baseline "
                    f"{h.baseline:.4g} us")
        return start

    def _probe(self, r: ProbeResult) -> str | None:
        """Takes one probe's result; returns its change line, if its state changed."""
        h = self._hist[r.probe.key]
        old = h.state
        if r.status == "failed":
            self._step(h, 2)
        elif r.status == "ok" and _finite(r.time_us):
            t = float(r.time_us)
            h.times.append(t)
            if h.baseline is None:
                if self.learn:
                    h.warm.append(t)
                if len(h.warm) == self.warm:
                    h.baseline, h.noise = statistics.median(h.warm), noise.spread(h.warm)
                    h.source, h.warm, h.judged = "warm", [], True
                self._step(h, 0)  # measured fine: clean, though not judged against anything
            else:
                h.judged = True
                self._step(h, self._bad(h, t))
        else:  # skipped, or nothing measured: no news either way
            return None
        if h.state == old:
            return None
        return f"{label(r.probe)}: {old} -> {h.state} ({self._why(h, r, old)})"

    def _stats(self, h: _History) -> ProbeState:
        t = list(h.times)
        if not t:
            return ProbeState(h.state, baseline_us=h.baseline)
        ordered = sorted(t)
        p95 = _p95(ordered) if len(t) >= 2 else t[0]
        cv = _stdev(t) / statistics.fmean(t) if len(t) >= 2 else None
        return ProbeState(h.state, _median(ordered), p95, cv, h.baseline)

    # -- ranks -----------------------------------------------------------------------------
    def _late_ranks(self, cycle: Cycle) -> dict[int, tuple[str, float]] | None:
        """The ranks late in this cycle, each with the probe (its key) and by how many us;
        None when the cycle measured nothing that could tell."""
        late: dict[int, tuple[str, float]] = {}
        told = False
        for r in cycle.results:
            rank, by = r.late_rank, r.lateness_us
            if r.status != "ok" or not _finite(r.time_us) or rank is None or by is None:
                continue
            if rank >= self.world:
                raise ValueError(f"{r.probe.key}: {len(r.rank_time_us)} rank times in a world "
                                 f"of {self.world}")
            told = True
            h = self._hist[r.probe.key]
            ratio = by / float(r.op_us if _finite(r.op_us) else r.time_us)
            if h.baseline is None:  # still learning the skew: late only past the cap
                if ratio <= LATE_CAP:
                    h.skew_warm.append(ratio)
                    continue
                threshold = LATE_CAP
            else:
                if h.skew_warm:
                    h.skew, h.skew_warm = max(h.skew_warm), []
                threshold = self.late_threshold(h.skew)
            # against the skew, not the time's noise from cycle to cycle: how late a rank comes
            # within a cycle does not grow when the whole cycle swings
            if ratio > threshold and rank not in late:
                late[rank] = (r.probe.key, by)
        return late if told else None

    def late_threshold(self, skew: float) -> float:
        """The share of a probe's time the others must wait for a rank, once the probe has a
        baseline, for it to count as late."""
        return min(LATE_CAP, max(LATE_FLOOR, noise.limit(self.tolerance, skew) - 1))

    def _late_text(self, late: tuple[str, float]) -> str:
        key, by = late
        return f"{by:.4g} us late in {label(self.probes[key])}"

    def _ranks(self, cycle: Cycle) -> list[str]:
        late = self._late_ranks(cycle)
        if late is None:
            return []
        changes = []
        self._late_why.update(late)
        for rank, seen in enumerate(self._late):
            seen.append(rank in late)
            count = sum(seen)
            if rank not in self._stragglers and count >= self.k:
                self._stragglers.add(rank)
                changes.append(f"rank {rank}: named a straggler (late in {count} of the last "
                               f"{len(seen)} cycles; this one {self._late_text(late[rank])})")
            elif rank in self._stragglers and len(seen) >= self.k \
                    and not any(list(seen)[-self.k:]):
                self._stragglers.discard(rank)
                changes.append(f"rank {rank}: no longer a straggler ({self.k} cycles in a row "
                               "not late)")
        return changes

    # -- a cycle ---------------------------------------------------------------------------
    def observe(self, cycle: Cycle) -> Judgement:
        changes = []
        for r in cycle.results:
            if r.probe.key not in self._hist:
                raise ValueError(f"cycle {cycle.index} measured {r.probe.key}, not a probe here")
            if (line := self._probe(r)) is not None:
                changes.append(line)
        changes += self._ranks(cycle)
        states = {key: self._stats(h) for key, h in self._hist.items()}
        judged = [s.state for s in states.values() if s.state != "unknown"]
        verdict = max(judged, key=LEVELS.index) if judged else "unknown"
        if self._stragglers and verdict in ("ok", "unknown"):
            verdict = "warn"  # a rank the others waited for, cycle after cycle, is not ok
        counts = {rank: sum(seen) for rank, seen in enumerate(self._late) if any(seen)}
        named = tuple(sorted(self._stragglers))
        return Judgement(states, verdict, named, counts, tuple(changes),
                         {rank: self._late_why[rank] for rank in named})


def _p95(ordered: list[float]) -> float:
    """statistics.quantiles(t, n=20, method="inclusive")[18], its arithmetic to the bit, of
    `ordered` (sorted, two or more): the one cut point read of the nineteen it works out, which
    cost a fifth of each cycle's judgement."""
    j, delta = divmod(19 * (len(ordered) - 1), 20)
    return (ordered[j] * (20 - delta) + ordered[j + 1] * delta) / 20


def _median(ordered: list[float]) -> float:
    """statistics.median of `ordered` (sorted, one or more), without sorting it again."""
    half = len(ordered) // 2
    return ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2


def _stdev(t: list[float]) -> float:
    """The sample standard deviation in floats: statistics.stdev's exact fractions cost two
    thirds of each cycle's judgement, for digits a spread of timings does not have."""
    mean = math.fsum(t) / len(t)
    return math.sqrt(math.fsum((x - mean) ** 2 for x in t) / (len(t) - 1))
