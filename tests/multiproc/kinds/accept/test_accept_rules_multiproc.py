"""What an acceptance check records, for real on 2 local gloo workers, where no unit test can see
it: the ping-pong latency is one way, half the round trip, as p2p's is and as the profiles'
figures and docs/accept.md say."""

from __future__ import annotations

import csv
import json

import pytest
from helpers import distbench

pytestmark = pytest.mark.multiproc

# Every op in which rank 1 sends waits this long first: a ping-pong round trip is one message
# each way, so it takes this plus what the messages themselves take (well under a millisecond
# for 4 KiB, a few on a loaded 2-core machine), and one way half of that.
DELAY_S = 0.02

PROFILE = """
name = "pingpong-only"
description = "one node check: ping-pong latency against a floor no run reaches"

[settings]
iters = 10
warmup = 2
baseline_tolerance = 0.05

[[check]]
name = "node pingpong latency"
scope = "node"
command = "p2p"
pattern = "pingpong"
dtype = "float32"
size = "4K"
metric = "p50_us"
vs = "absolute"
# not a figure: a floor far above anything measured, so the check only records
fail = 10000000
"""


def test_pingpong_latency_is_one_way(tmp_path):
    profile = tmp_path / "pingpong.toml"
    profile.write_text(PROFILE)
    res = distbench(tmp_path, "accept", "--workers", "2", "--profile", str(profile),
                    DISTBENCH_TEST_SLOW_SEND=f"1:{DELAY_S}")
    assert res.code == 0, res.stderr
    acc = json.loads((res.run_dir / "accept.json").read_text())
    (row,) = acc["verdicts"]
    assert row["verdict"] == "PASS" and row["metric"] == "p50_us"
    one_way_us = DELAY_S / 2 * 1e6
    # the round trip recorded whole would be at least twice this
    assert one_way_us <= row["measured"] < 2 * one_way_us, row
    with open(res.run_dir / "accept.csv", newline="") as f:
        (line,) = list(csv.DictReader(f))
    assert float(line["p50_us"]) == pytest.approx(row["measured"], rel=1e-4)
