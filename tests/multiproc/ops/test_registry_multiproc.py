"""A test-only op registered by its own entry script runs through `distbench collective` under
torchrun. The tables: test_registry.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers import torchrun_nodes
from paths import TESTS


def _torchrun(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """Two ranks under torchrun, running distbench with the test-only op registered."""
    (agent,) = torchrun_nodes(tmp_path, 1, 2, [list(args)],
                              script=(str(TESTS / "throwaway_main.py"),), **env)
    return agent


def _run_dir(tmp_path: Path) -> Path:
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    return run_dir


@pytest.mark.multiproc
def test_a_test_only_op_runs_through_distbench_collective(tmp_path):
    import csv

    proc = _torchrun(tmp_path, "collective", "--op", "broadcast_from_last", "--sizes", "1K,16K",
                     "--iters", "3", "--warmup", "1")
    assert proc.returncode == 0, proc.stderr
    run_dir = _run_dir(tmp_path)
    with open(run_dir / "collective.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["op"], r["size_bytes"], r["status"], r["wrong"]) for r in rows] == [
        ("broadcast_from_last", "1024", "ok", "0"), ("broadcast_from_last", "16384", "ok", "0")]
    for r in rows:
        assert r["in_place"] == "1" and r["root"] == "-1" and r["world_size"] == "2"
        # its own accounting: busbw = algbw x 1
        assert float(r["busbw_gbps"]) == pytest.approx(float(r["algbw_gbps"]), rel=1e-4)
    assert "# broadcast_from_last  float32" in proc.stdout
    assert json.loads((run_dir / "run.json").read_text())["status"] == "ok"
