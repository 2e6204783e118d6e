"""The per-iteration samples file beside a CSV: for every measured row, the slowest rank's time
of each timed iteration, so a later comparison can test whether two runs differ (compare.py).
Torch-free: report and compare read it without starting a worker.

One JSON object per line, written as the row is: {"row": i, "us": [t0, t1, ...]}, where i is
the row's index among the CSV's data rows (0 for the first row under the header) and each time
is in microseconds to 4 significant digits. Skipped rows have no line. A loop of more than
MAX_KEPT iterations keeps MAX_KEPT of them, evenly spaced, so a long calibrated loop on a fast
GPU (10,000 iterations) keeps the file near 3.5 kB a row.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from distbench.reading import ReadError

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


def encode(row: int, samples_us: Sequence[float]) -> str:
    """One line of the file, newline included."""
    cells = ",".join(format(v, ".4g") for v in thin(samples_us))
    return f'{{"row": {row}, "us": [{cells}]}}\n'


def read(path: Path) -> dict[int, list[float]]:
    """Row index -> samples (us). A missing file is an empty mapping (a run made before samples
    were kept, or an nccl-tests log); a line cut short by a crash or a full disk is ignored."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as e:
        raise ReadError(path, f"cannot read the samples file ({e})") from None
    out: dict[int, list[float]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        try:
            item = json.loads(line)
            out[int(item["row"])] = [float(v) for v in item["us"]]
        except (ValueError, KeyError, TypeError):
            if number == len(text.splitlines()) and not text.endswith("\n"):
                continue  # the last line, cut short
            raise ReadError(path, f"line {number} is not a samples line "
                            '(expected {"row": N, "us": [...]})') from None
    return out
