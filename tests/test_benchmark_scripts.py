"""benchmarks/: the scripts no command runs. They reach into distbench's modules, and a rename or
a new parameter there breaks them silently until someone reruns one: overhead.py failed on the
second H100 lending (series.collective had gained the group it runs on)."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import clean_env, processes

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) for every `from distbench... import name` in the script, at any depth."""
    return [(node.module, alias.name) for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("distbench")
            for alias in node.names]


@pytest.mark.parametrize("script", sorted(p.name for p in BENCHMARKS.glob("*.py")))
def test_what_a_benchmark_imports_from_distbench_is_there(script):
    missing = []
    for module, name in _imports(BENCHMARKS / script):
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            missing.append(f"{module}: {e}")
            continue
        if not hasattr(mod, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"{module}.{name}")
    assert not missing, f"benchmarks/{script}: {missing}"


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
