"""A real run writes one samples line per measured row, with the row's iteration count. The
format and its thinning: test_samples.py."""

from __future__ import annotations

import csv
import statistics

import pytest
from helpers import distbench

from distbench.results import samples


@pytest.mark.multiproc
def test_a_run_writes_one_samples_line_per_measured_row(tmp_path):
    # 8 bytes of all_gather over 2 ranks leaves a rank less than 16 bytes: a skipped row
    res = distbench(tmp_path, "collective", "--op", "all_gather", "--sizes", "8,4K",
                    "--iters", "7", "--warmup", "1", "--workers", "2")
    assert res.code == 0, res.stderr
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    with open(run_dir / "collective.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["status"] for r in rows] == ["skipped", "ok"]
    kept = samples.read(run_dir / "collective.samples.jsonl")
    assert list(kept) == [1]  # the row index of the measured row
    us, reps = kept[1].us, kept[1].reps
    assert len(us) == 7
    # the slowest rank's iterations: their percentiles are the row's
    ordered = sorted(us)
    assert ordered[0] > 0
    assert abs(ordered[3] - float(rows[1]["p50_us"])) <= 0.001 * float(rows[1]["p50_us"])
    # 7 iterations in the default 5 repetitions of 2, 2, 1, 1, 1, each kept as its median
    assert int(rows[1]["reps"]) == 5 and len(reps) == 5
    splits = [us[0:2], us[2:4], us[4:5], us[5:6], us[6:7]]
    assert reps == pytest.approx([statistics.median(p) for p in splits], rel=2e-3)
    assert float(rows[1]["spread_pct"]) == pytest.approx(100 * (max(reps) / min(reps) - 1),
                                                         rel=2e-3)
    assert samples.contradiction(rows[1], kept[1]) is None  # what distbench wrote holds
