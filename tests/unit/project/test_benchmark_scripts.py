"""benchmarks/: the scripts no command runs. They reach into distbench's modules, and a rename or
a new parameter there breaks them silently until someone reruns one: overhead.py failed on the
second H100 lending (series.collective had gained the group it runs on).
The tests that start processes: test_benchmark_scripts_multiproc.py."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import sys
from pathlib import Path

import pytest
from paths import REPO

BENCHMARKS = REPO / "benchmarks"


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


def _published_runs():
    spec = importlib.util.spec_from_file_location("published_runs",
                                                  BENCHMARKS / "published_runs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["published_runs"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_published_rows_parse_and_each_names_its_source():
    """benchmarks/published/torchtitan.csv: every row traceable to a file, a commit and a table
    of pytorch/torchtitan, and its parallel degrees multiplying to its GPUs."""
    pub = _published_runs()
    rows = pub.load()
    assert len(rows) == 45
    assert len({r["id"] for r in rows}) == len(rows)
    for r in rows:
        assert r["source_file"].endswith(".md") and r["source_section"], r["id"]
        assert re.fullmatch(r"[0-9a-f]{40}", r["source_commit"]), r["id"]
        assert r["fsdp"] * r["tp"] * r["pp"] * r["cp"] == r["gpus"], r["id"]
        assert r["local_batch"] * r["fsdp"] == r["global_batch"], r["id"]
        assert (r["tps_per_gpu"] != "") == bool(r["ran"]), r["id"]
    by_id = {r["id"]: r for r in rows}
    for kind, row_id in pub.FIT_ROWS.items():
        assert by_id[row_id]["gpu"] == kind and not pub.unscored_because(by_id[row_id])
    assert "torch.compile" in " ".join(pub.unscored_because(by_id["d24-t1-fsdp-compile"]))


def test_published_throughput_becomes_a_step_as_worked_by_hand():
    """Table 1's FSDP row: 16 samples of 8,192 tokens at 5,762 tokens/s on each of 8 GPUs."""
    pub = _published_runs()
    row = {r["id"]: r for r in pub.load()}["d24-t1-fsdp"]
    assert pub.published_step_s(row) == pytest.approx(131072 / 46096)  # 2.8435 s
    assert pub.layout_of(row) == "tp=1,pp=1,dp=8,zero=3,mbs=2,recompute=op"
