"""The per-iteration samples file beside a CSV: for every measured row, the slowest rank's time
of each timed iteration and the median of each separated repetition, so a later comparison can
tell a change from the run's own noise (noise.py, compare.py). Torch-free: report and compare
read it without starting a worker.

One JSON object per line, written as the row is: {"row": i, "us": [t0, t1, ...], "reps":
[m0, m1, ...]}, where i is the row's index among the CSV's data rows (0 for the first row under
the header), "us" the iterations in order and "reps" each repetition's median (the iterations
split as noise.rep_lengths does), all in microseconds to 4 significant digits. Skipped rows
have no line; a run made before repetitions were kept has no "reps". A loop of more than
MAX_KEPT iterations keeps MAX_KEPT of them, evenly spaced, so a long calibrated loop on a fast
GPU (10,000 iterations) keeps the file near 3.5 kB a row; "reps" are of every iteration.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from distbench.core import noise
from distbench.core.errors import ReadError

MAX_KEPT = 500
SUFFIX = ".samples.jsonl"


def path_for(csv_path: Path) -> Path:
    """collective.csv -> collective.samples.jsonl, in the same directory."""
    return csv_path.with_name(csv_path.stem + SUFFIX)


def thin(values: Sequence[float], kept: int = MAX_KEPT) -> list[float]:
    """At most `kept` of the values, evenly spaced over the loop (first and last included)."""
    n = len(values)
    if n <= kept:
        return list(values)
    return [values[round(i * (n - 1) / (kept - 1))] for i in range(kept)]


def encode(row: int, samples_us: Sequence[float], reps_us: Sequence[float] = ()) -> str:
    """One line of the file, newline included."""
    cells = ",".join(format(v, ".4g") for v in thin(samples_us))
    reps = f', "reps": [{",".join(format(v, ".4g") for v in reps_us)}]' if reps_us else ""
    return f'{{"row": {row}, "us": [{cells}]{reps}}}\n'


@dataclass(frozen=True)
class Kept:
    """What the file holds for one row."""

    us: list[float]  # the iterations, thinned to MAX_KEPT
    reps: list[float]  # each repetition's median; [] in a run made before they were kept


def _times(path: Path, number: int, values, what: str) -> list[float]:
    out = [float(v) for v in values]
    bad = [v for v in out if not math.isfinite(v) or v < 0]
    if bad:
        raise ReadError(path, f"line {number}: {what} holds {bad[0]}, not a time (a NaN, "
                        "infinite or negative sample: the file was not written by distbench)")
    return out


def read(path: Path) -> dict[int, Kept]:
    """Row index -> what was kept. A missing file is an empty mapping (a run made before samples
    were kept, or an nccl-tests log); a line cut short by a crash or a full disk is ignored.
    Raises ReadError on anything else that distbench would not have written: a NaN, infinite or
    negative time, or two lines for one row."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as e:
        raise ReadError(path, f"cannot read the samples file ({e})") from None
    out: dict[int, Kept] = {}
    lines = text.splitlines()
    for number, line in enumerate(lines, 1):
        try:
            item = json.loads(line)
            row, us, reps = int(item["row"]), item["us"], item.get("reps", [])
            if not isinstance(us, list) or not isinstance(reps, list):
                raise TypeError
            kept = Kept(_times(path, number, us, "us"), _times(path, number, reps, "reps"))
        except (ValueError, KeyError, TypeError):
            if number == len(lines) and not text.endswith("\n"):
                continue  # the last line, cut short
            raise ReadError(path, f"line {number} is not a samples line "
                            '(expected {"row": N, "us": [...]})') from None
        if row in out:
            raise ReadError(path, f"line {number}: a second line for row {row}: samples must "
                            "not be counted twice")
        out[row] = kept
    return out


# The file keeps 4 significant digits and the CSV 6: what a true row's figures may differ by.
ROUNDING = 2e-3


def _off(a: float, b: float, rel: float = ROUNDING) -> bool:
    return abs(a - b) > rel * max(abs(a), abs(b))


def contradiction(row: Mapping, kept: Kept) -> str | None:
    """Why a row's samples cannot be what measured it (None: they can). `row`: the CSV row
    (iters, p50_us, time_us as numbers, or missing). distbench writes both from one loop: the
    samples' count is the row's iterations (or MAX_KEPT of them); their median is the row's p50;
    their mean, of the slowest rank per iteration, is at least the row's mean over ranks; the
    repetitions' medians are those of the iterations split in order."""
    def number(key: str) -> float | None:
        v = row.get(key)
        try:
            v = float(v)
        except (TypeError, ValueError):
            return None
        return v if math.isfinite(v) else None

    us, iters = kept.us, number("iters")
    if not us:
        return "no samples"
    if iters is not None and len(us) != min(int(iters), MAX_KEPT):
        return f"{len(us)} samples for {int(iters)} iterations"
    whole = iters is not None and len(us) == int(iters)
    p50, mean = number("p50_us"), number("time_us")
    if p50 is not None and whole and _off(statistics.median(us), p50):
        return (f"their median is {statistics.median(us):.4g} us, the row's p50 "
                f"{p50:.4g} us")
    if p50 is not None and not min(us) <= p50 <= max(us):
        return f"the row's p50 {p50:.4g} us lies outside them ({min(us):.4g} to {max(us):.4g})"
    if mean is not None and whole and statistics.fmean(us) < mean * (1 - ROUNDING):
        return (f"the row's mean {mean:.4g} us is above the mean of its slowest ranks "
                f"{statistics.fmean(us):.4g} us")
    if kept.reps and iters is not None:
        if len(kept.reps) > int(iters):
            return f"{len(kept.reps)} repetitions of {int(iters)} iterations"
        if whole:
            medians = noise.split(us, len(kept.reps))
            for k, (median, rep) in enumerate(zip(medians, kept.reps, strict=True)):
                if _off(median, rep):
                    return (f"repetition {k} says {rep:.4g} us, its iterations' median is "
                            f"{median:.4g} us")
        elif not all(min(us) <= r <= max(us) for r in kept.reps):
            return "a repetition lies outside the samples"
    return None
