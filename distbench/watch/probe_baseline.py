"""A previous watch run as the baseline of a new one: each probe's median time over the cycles
it measured there, and how far its cycles ranged (the 90th percentile over the 10th, less 1) as
that run's noise. Torch-free: read while the options are checked, before any worker starts."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from distbench.core.options import OptionError

JSONL = "watch.jsonl"
EXAMPLE = "--baseline results/<an earlier watch run>"


def read_baseline(run_dir: str | Path) -> dict[str, tuple[float, float | None]]:
    """Probe.key -> (median time_us, noise). OptionError (one line) when the directory holds no
    readable watch.jsonl or it measured nothing."""
    path = Path(run_dir) / JSONL
    if not Path(run_dir).is_dir():
        raise OptionError("--baseline", f"no directory {str(run_dir)!r}", EXAMPLE)
    if not path.is_file():
        raise OptionError("--baseline", f"no {JSONL} in {str(run_dir)!r}: not a watch run",
                          EXAMPLE)
    times: dict[str, list[float]] = {}
    try:
        with path.open() as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    cycle = json.loads(line)
                    for p in cycle["probes"]:
                        if p.get("status") == "ok" and p.get("time_us"):
                            key = f"{p['op']}/{p['size_bytes']}/{p['scope']}"
                            times.setdefault(key, []).append(float(p["time_us"]))
                except (ValueError, KeyError, TypeError) as e:
                    raise OptionError("--baseline", f"{path}: line {number} is not a watch "
                                      f"cycle ({type(e).__name__}: {e})", EXAMPLE) from None
    except OSError as e:
        raise OptionError("--baseline", f"cannot read {path}: {e.strerror}", EXAMPLE) from None
    if not times:
        raise OptionError("--baseline", f"{path} measured nothing", EXAMPLE)
    return {key: (statistics.median(t), _noise(t)) for key, t in times.items()}


def _noise(times: list[float]) -> float | None:
    if len(times) < 2:
        return None
    q = statistics.quantiles(times, n=10, method="inclusive")
    return q[-1] / q[0] - 1 if q[0] > 0 else None
