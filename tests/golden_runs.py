"""The recorded runs in tests/golden/ (recorded before the sweep engine replaced the per-command
loops) and the check that a run writes the same CSV headers and non-timing cells
(tests/multiproc/bench/test_golden.py, tests/multiproc/kinds/collective/).

Regenerate (only when a change of a CSV contract is intended):
    python tests/golden_runs.py
"""

from __future__ import annotations

import csv
import socket
from pathlib import Path

from helpers import distbench
from paths import TESTS

GOLDEN = TESTS / "golden"

COMMON = ["--iters", "2", "--warmup", "1", "--workers", "3"]

RECORDED = {
    "collective": ["collective", "--op", "all", "--sizes", "2,1K,64K", "--dtype", "float32,int8",
                   "--redop", "sum,avg", "--placement", "both", *COMMON],
    "p2p": ["p2p", "--pattern", "all", "--sizes", "2,4K,16K", *COMMON],
}

FILES = {"collective": ["collective.csv"], "p2p": ["p2p.csv", "p2p_matrix.csv"]}

HOST = "<host>"  # the recording's hostname, replaced: the cells name the machine they ran on

TIMING = {"time_us", "rank_min_us", "rank_max_us", "slowest_rank", "p50_us", "p99_us", "cv_pct",
          "algbw_gbps", "busbw_gbps", "gbps", "spread_pct"}


def _read(path: Path) -> tuple[list[str], list[dict]]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def _comparable(row: dict) -> dict:
    """Non-timing cells as they are (this host's name as HOST); timing cells only as present or
    absent."""
    here = socket.gethostname()
    return {k: (bool(v) if k in TIMING else HOST if v == here and k.endswith("_host") else v)
            for k, v in row.items()}


def assert_matches_recording(command: str, res) -> None:
    """`res`, a run of RECORDED[command], wrote what the recording holds."""
    assert res.code == 0, res.stderr
    for name in FILES[command]:
        want_header, want_rows = _read(GOLDEN / name)
        header, rows = _read(res.run_dir / name)
        assert header == want_header, name
        assert len(rows) == len(want_rows), name
        for i, (got, want) in enumerate(zip(rows, want_rows, strict=True)):
            assert _comparable(got) == _comparable(want), f"{name} row {i + 2}"
        # the recording is not all skips: most rows were measured
        assert sum(bool(r.get("time_us")) for r in want_rows) > len(want_rows) // 2


if __name__ == "__main__":
    import tempfile

    for command, args in RECORDED.items():
        with tempfile.TemporaryDirectory() as tmp:
            res = distbench(Path(tmp), *args)
            assert res.code == 0, res.stderr
            for name in FILES[command]:
                header, rows = _read(res.run_dir / name)
                with open(GOLDEN / name, "w", newline="") as f:
                    writer = csv.DictWriter(f, fieldnames=header)
                    writer.writeheader()
                    writer.writerows({k: HOST if v == socket.gethostname() and k.endswith("_host")
                                      else v for k, v in r.items()} for r in rows)
                print(f"wrote {GOLDEN / name}")
