"""report on a real gloo collective run, every warning on, as a process of its own prints them.
The hand-written runs: test_report_inputs.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import Run, distbench
from report_helpers import _gloo_collective


def _report(*args, cwd: Path, **env) -> Run:
    """`distbench report *args` in a process of its own (its environment, its warnings)."""
    return distbench(None, "report", *map(str, args), cwd=cwd, timeout=120, **env)


@pytest.mark.multiproc  # every warning on, as a process of its own prints them
@pytest.mark.parametrize("cell", ["1e308", "inf"])
def test_a_cell_no_measurement_can_take_is_left_out_and_said(tmp_path, cell):
    run = _gloo_collective(tmp_path / "run", busbw=cell)
    res = _report(run, "--out", tmp_path / "out", cwd=tmp_path, PYTHONWARNINGS="default")
    assert res.returncode == 0, res.stderr
    assert res.stderr.splitlines() == [
        f"distbench: report in {tmp_path / 'out'}/ (4 files: report.md, model.json, "
        "collective_busbw.png, collective_latency.png)"]
    text = (tmp_path / "out" / "report.md").read_text()
    shown = f"{float(cell):g}"
    assert (f"Left out 1 value(s) no measurement can take (not finite, negative, or beyond 1e+18): "
            f"collective.csv row 3 busbw_gbps {shown}.") in text
    assert "| all_reduce | float32 | sum | out | 0.9882 | 16 MiB | 1 KiB | 201 |" in text
