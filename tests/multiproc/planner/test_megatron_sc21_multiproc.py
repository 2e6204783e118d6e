"""benchmarks/megatron_sc21.py's own path: `python -m distbench plan ...` as a process, plan.csv
read back. The paper's arithmetic and the rows in-process: test_megatron_sc21.py."""

from __future__ import annotations

import pytest
from planner_helpers import fit, sc21


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    return fit(tmp_path_factory.mktemp("sc21"))


@pytest.mark.procs(1)
def test_a_row_run_as_the_script_runs_it_is_the_row_in_process(fitted):
    """The script's own path: `python -m distbench plan ...` as a process, plan.csv read back."""
    mfu, rows = fitted
    [row] = [r for r in rows if r["row"].name == "PTD-P 768"]
    p = sc21.predict_row(row["row"], mfu)
    assert p["predicted_step_ms"] / 1e3 == pytest.approx(row["predicted_s"], rel=1e-9)
    assert p["trainer"] == "megatron" and p["given"] == 1
