"""`plan --layout` on 2 real gloo workers: the named layout planned from what they measured,
and run first by --validate, its recomputation and all. The arithmetic: test_plan_given.py."""

from __future__ import annotations

import pytest
from helpers import distbench
from plan_helpers import STUCK_S, TINY

pytestmark = [pytest.mark.multiproc, pytest.mark.procs(3)]  # 2 workers and their launcher

KEY = ("tp", "pp", "dp", "zero", "micro_batches", "recompute")


def test_the_workers_plan_a_named_layout_and_validate_it_first(tmp_path):
    # recompute full is not in the default --recompute none: a layout the enumeration lacks
    res = distbench(tmp_path, "plan", "--workers", "2", "--model", TINY, "--layout",
                    "dp=2,zero=1,mbs=1,recompute=full", "--validate", "2", "--min-time", "0.1",
                    "--timeout", STUCK_S, timeout=240)
    assert res.code == 0, res.stderr
    plan = res.rows("plan.csv")
    (mine,) = [r for r in plan if r["given"] == "1"]
    assert tuple(mine[k] for k in KEY) == ("1", "1", "2", "1", "2", "full")
    assert (mine["enumerated"], mine["rank"], mine["fits"]) == ("0", "", "1")
    assert {r["recompute"] for r in plan if r["enumerated"] == "1"} == {"none"}
    assert "your layout: tp1 pp1 dp2 zero1 m2 rc-full" in res.stderr
    assert "not in the enumeration (recompute full is not in --recompute none)" in res.stderr
    # run first, as named: its recomputation reached the step
    val, stepped = res.rows("validation.csv"), res.rows("step.csv")
    assert len(val) == len(stepped) == 2
    assert tuple(val[0][k] for k in KEY) == tuple(mine[k] for k in KEY)
    assert stepped[0]["recompute"] == "full" and stepped[0]["status"] == "ok"
    assert float(val[0]["predicted_step_ms"]) == pytest.approx(
        float(mine["predicted_step_ms"]), rel=1e-5)
    assert val[1]["recompute"] == "none" and val[1]["in_sample"] == "0"
    text = (res.run_dir / "plan.md").read_text()
    assert "## Your layouts" in text and "## Validation" in text
