"""`distbench report` on a real watch run slowed by the fault hook: it names the straggler where
watch did. On hand-written watch runs: test_report_watch.py."""

from __future__ import annotations

import json
import re

import pytest
from helpers import distbench
from report_helpers import _drawn, _report, _section, _table


@pytest.mark.multiproc
def test_report_of_a_real_slowed_watch_names_the_straggler_where_watch_did(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    res = distbench(out, "watch", "--sizes", "64K", "--iters", "10", "--timeout", "20",
                    "--interval", "0.2", "--count", "6", "--warm", "2", "--agree", "2", "--last",
                    "3", "--workers", "2", timeout=240, DISTBENCH_TEST_SLOW_RANK="1:0.01",
                    DISTBENCH_TEST_SLOW_FROM="3")
    lines = [json.loads(x) for x in (res.run_dir / "watch.jsonl").read_text().splitlines()]
    named = [x["cycle"] for x in lines if 1 in x["stragglers"]]
    assert named, [x["stragglers"] for x in lines]
    text, _ = _report(res.run_dir)
    section = _section(text)
    assert f"Stragglers named: rank 1 first in cycle {named[0]} " in section, section
    assert ["rank 1", "named a straggler"] in [r[2:4] for r in _table(section, "#### Changes")]
    assert not re.search(r"\b\d+\.0\b", section), section
    drawn = _drawn(res.run_dir)
    (panel,) = drawn.values()
    assert panel["lines"]["named:1"][0] == named[0]
    assert panel["late"] and all(c >= 3 for c in panel["late"])  # none before the slowing
