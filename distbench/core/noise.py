"""A measurement's own noise, and calling a change between two runs only beyond it. Torch-free:
compare, --baseline and accept's verdicts share it without starting a worker.

Every timed measurement runs as REPS separated repetitions (timing.measure), and keeps each
repetition's median time. How far those disagree is the noise of that measurement on that
machine at that time; the median of it over a run's rows is the noise the run shows. Per-iteration
samples of one loop cannot tell this: they are autocorrelated and share one loop's conditions,
so drift between runs (gloo on a shared 2-core machine switches between a fast and a slow mode
every few tens of milliseconds) looked hugely significant to a rank test on them.

The rule (docs/report.md, "How a row is marked"), in the spirit of asv's and pyperf's compare:
a row is better or worse only when the change exceeds the threshold and the noise by a margin. A
change within the noise, or a noise too large to resolve the threshold, is "noisy": not
comparable, never a guess. Where only spreads are known (judge: accept's and watch's baselines,
accept.csv), the change is the ratio of the figures, and the noise the largest spread known, by
MARGIN. Where both runs' repetitions are known (call: compare), the change is measured between
the nearest repetitions, the slower run's fastest over the faster run's slowest (the gap), and
the noise is what could have opened that gap without a change: the slower run's typical spread
(how often its rows sat in a slow mode throughout, which lifts even its fastest repetition) and
the faster row's own spread, by GAP_MARGIN. A slow repetition of the slower run cannot widen the
gap. A row faster in one run than the machine usually goes is drift no repetition sees, and
the margin, not the faster run's typical spread, is what covers it. Judged instead by the
medians against every spread of both runs, a tight row of a base run chaotic elsewhere (typical
200%) hid a rank slowed 2 ms an op (5x on the small rows): GAP_MARGIN's comment has the counts.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from distbench.core.tables import percent

REPS = 5
MAX_REPS = 100  # --reps: each repetition costs a barrier; more than this tells nothing new
# A change must exceed the noise by this factor on a log scale ((1 + noise) ** MARGIN): a slow
# mode that lasts a whole measurement hides from its repetitions, so they understate how far two
# runs drift apart. Measured on this project's 2-core VM (gloo, 9 runs, 72 A/A pairs, 18 pairs
# against a rank slowed 2 ms an op): at 1.0 one A/A pair in 72 called a row worse; at 1.5 none,
# and every slowed pair still had 4 of its 6 rows called worse (at 2.0, only 2).
# benchmarks/false_alarms.py measures both rates again on fresh runs.
MARGIN = 1.5
# The gap between the nearest repetitions must exceed the noise by this factor on a log scale.
# Measured on six batches of benchmarks/false_alarms.py on this project's 2-core VM, shared with
# other work (72 plain and 36 slowed runs; 396 A/A pairs judged both ways, 432 pairs of a plain
# run against one with rank 1 waiting 2 ms an op). gloo's slow mode there adds about as much time
# as that fault, and a whole row can sit in it, so no margin parts every A/A pair from every
# slowed one: 1.3 called 4 A/A pairs worse (all against one run whose 1 MiB all-reduce was slow
# throughout) and caught 431 slowed pairs; 1.8 calls none and catches 420. The rule this
# replaced (the medians against every spread of both runs, by MARGIN) called 8 and caught 404;
# it needed a margin of 2 to call none, and then caught 331.
GAP_MARGIN = 1.8


def _usable(values: Iterable[float]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(v) and v > 0]


def spread(reps: Sequence[float]) -> float | None:
    """How far a measurement's repetitions disagree: the slowest over the fastest, less 1 (0.3:
    the slowest repetition took 30% longer). None with fewer than 2 repetitions."""
    vals = _usable(reps)
    if len(vals) < 2:
        return None
    return max(vals) / min(vals) - 1


def typical(spreads: Iterable[float | None]) -> float | None:
    """The noise a run shows: the median spread of its measurements (None: none known)."""
    known = [s for s in spreads if s is not None and math.isfinite(s)]
    return statistics.median(known) if known else None


def rep_lengths(iters: int, reps: int) -> tuple[int, ...]:
    """`iters` iterations split into `reps` repetitions (fewer when there are fewer iterations
    than that), their lengths differing by one at most: how timing.measure runs them, and how
    readers split the samples back."""
    reps = max(1, min(reps, iters))
    return tuple(iters // reps + (1 if k < iters % reps else 0) for k in range(reps))


def split(samples: Sequence[float], reps: int = REPS) -> list[float]:
    """The median of each of `reps` stretches of samples in loop order, split as rep_lengths
    says: the repetitions a loop's samples hold ([] with fewer samples than that). Also how a
    run made before repetitions were kept is read."""
    if len(samples) < reps:
        return []
    out, at = [], 0
    for length in rep_lengths(len(samples), reps):
        out.append(statistics.median(samples[at:at + length]))
        at += length
    return out


MARKS = ("better", "worse", "same", "noisy")


@dataclass(frozen=True)
class Call:
    mark: str  # one of MARKS
    time_ratio: float  # the new repetitions' median time over the base's
    noise: float  # the largest relative spread that bounds what can be told (0.3: 30%)
    note: str = ""


def call(base_reps: Sequence[float], new_reps: Sequence[float], threshold: float,
         base_typical: float | None = None, new_typical: float | None = None) -> Call:
    """Two runs' repetitions of one measurement (times: lower is faster), judged: better or
    worse when the medians moved past `threshold` and the gap between the nearest repetitions
    past the noise that could have opened it (the module's docstring); the same when neither
    run's noise (its row's spread, its typical one) exceeds the threshold either; else noisy.
    `*_typical`: each run's typical spread (typical()), so a row whose few repetitions happened
    to agree is not held to a tighter noise than its run shows. Needs 2 repetitions a side
    (ValueError)."""
    b, n = _usable(base_reps), _usable(new_reps)
    if len(b) < 2 or len(n) < 2:
        raise ValueError("each side needs at least 2 repetitions")
    ratio = statistics.median(n) / statistics.median(b)
    if abs(math.log(ratio)) <= math.log1p(threshold):
        return judge(ratio, threshold, [spread(b), spread(n), base_typical, new_typical])
    (slower, slower_typical), faster = ((n, new_typical), b) if ratio > 1 else \
        ((b, base_typical), n)
    noise = largest([spread(faster), slower_typical])
    if min(slower) / max(faster) > limit(threshold, noise, GAP_MARGIN):
        return Call("worse" if ratio > 1 else "better", ratio, noise)
    return Call("noisy", ratio, noise, f"within the noise: repetitions {shown(noise, threshold)} "
                "apart")


def largest(spreads: Iterable[float | None]) -> float:
    """The noise that bounds what can be told: the largest spread known (0 where none is)."""
    return max([s for s in spreads if s is not None and math.isfinite(s)] + [0.0])


def limit(threshold: float, noise: float, margin: float = MARGIN) -> float:
    """The time ratio a change must pass (either way) to be called: past the threshold, and
    past the noise by `margin`."""
    return max(1 + threshold, (1 + noise) ** margin)


def judge(time_ratio: float, threshold: float, spreads: Iterable[float | None],
          separated: bool = True) -> Call:
    """The rule on figures already reduced: the new time over the base's, the spreads known
    (a row's and each run's; none: the threshold alone decides), and whether every repetition
    of one run lies beyond every one of the other (True where only spreads are known, as in
    accept.csv)."""
    noise = largest(spreads)
    effect = abs(math.log(time_ratio))
    if effect <= math.log1p(threshold):
        if noise <= threshold:
            return Call("same", time_ratio, noise)
        return Call("noisy", time_ratio, noise, f"noisy: repetitions {shown(noise, threshold)} "
                    f"apart, more than the {percent(threshold)} threshold")
    if effect > math.log(limit(threshold, noise)) and separated:
        return Call("worse" if time_ratio > 1 else "better", time_ratio, noise)
    return Call("noisy", time_ratio, noise,
                f"within the noise: repetitions {shown(noise, threshold)} apart")


def shown(noise: float, threshold: float) -> str:
    """The noise to as many decimals as the threshold shows: against a 0.5% threshold a noise
    of 0.7% reads 0.7%, not 1%."""
    places = len(percent(threshold)[:-1].partition(".")[2])
    return percent(noise, places)
