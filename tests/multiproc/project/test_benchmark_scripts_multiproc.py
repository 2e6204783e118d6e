"""benchmarks/overhead.py run as its users run it: the one script that drives the engine's own
series. What every script imports: test_benchmark_scripts.py."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from helpers import clean_env, processes
from paths import REPO

BENCHMARKS = REPO / "benchmarks"


@pytest.mark.multiproc
def test_overhead_measures_every_size_it_is_given(tmp_path):
    """The one benchmark that drives the engine's own series and timing: a real run, one row
    per size, each with both loops' times and a verdict."""
    with processes(2):  # its launcher and one worker
        res = subprocess.run([sys.executable, str(BENCHMARKS / "overhead.py"), "--workers", "1",
                              "--rounds", "2", "--sizes", "4K,64K", "--backend", "gloo"],
                             cwd=tmp_path, env=clean_env(), capture_output=True, text=True,
                             timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = re.findall(r"^\s*(\d+ KiB)\s+\d+\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s", res.stdout, re.M)
    assert [r[0] for r in rows] == ["4 KiB", "64 KiB"], res.stdout
    assert all(float(x) > 0 for r in rows for x in r[1:]), res.stdout
