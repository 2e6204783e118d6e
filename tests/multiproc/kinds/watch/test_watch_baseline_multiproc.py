"""watch --baseline for real: an accept run as a watch's baseline, once, and a refused baseline
that starts no worker and leaves no run directory. The baselines read: test_watch_baseline.py."""

from __future__ import annotations

import json

import pytest
from helpers import assert_one_line_error, distbench
from watch_helpers import probe_line, watch_run


@pytest.mark.multiproc
def test_a_refused_baseline_starts_no_worker_and_leaves_no_run_directory(tmp_path):
    base = watch_run(tmp_path / "base", [[probe_line(size=64 << 10)]] * 3)
    (tmp_path / "out").mkdir()
    res = distbench(tmp_path / "out", "watch", "--once", "--sizes", "1M", "--baseline",
                    str(base), "--workers", "2", timeout=60)
    assert_one_line_error(res, None, "--baseline", ours=True)
    assert list((tmp_path / "out").iterdir()) == []
    npd = distbench(tmp_path / "out", "watch", "--once", "--npd", "--sizes", "64K",
                    "--baseline", str(base), "--workers", "3", timeout=60)  # measured on 2
    assert npd.code == 2 and len(npd.stderr.splitlines()) == 1, npd.stderr
    assert len(npd.stdout.splitlines()) == 1 and len(npd.stdout.splitlines()[0]) <= 80
    assert list((tmp_path / "out").iterdir()) == []


@pytest.mark.multiproc
def test_a_real_accept_run_is_the_baseline_of_a_watch_once(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "w").mkdir()
    acc = distbench(tmp_path / "a", "accept", "--profile", "cpu-gloo", "--workers", "2",
                    timeout=300)
    assert acc.code == 0, acc.stderr
    once = distbench(tmp_path / "w", "watch", "--once", "--sizes", "4K", "--iters", "10",
                     "--baseline", str(acc.run_dir), "--workers", "2", timeout=120)
    [line] = [json.loads(x) for x in (once.run_dir / "watch.jsonl").read_text().splitlines()]
    cluster = next(v for v in json.loads((acc.run_dir / "accept.json").read_text())["verdicts"]
                   if v["check"] == "cluster all_reduce latency")
    assert line["probes"][0]["baseline_us"] == pytest.approx(cluster["time_us"])
    assert once.code in (0, 4), once.stderr  # judged: never "nothing judged" (5)
