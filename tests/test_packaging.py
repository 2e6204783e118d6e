"""distbench installs where the GPUs are: a wheel builds (for a cluster's own environment, next
to the torch its workloads use) and carries the acceptance profiles; run.json says which torch
and NCCL ran, and from where."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from distbench.run.runtime import Runtime, loaded_library

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.procs(3)  # pip, and the build backend it runs
def test_a_wheel_builds_and_carries_the_profiles_and_schemas(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (wheel,) = tmp_path.glob("distbench-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "distbench/cli/app.py" in names
    shipped = {Path(n).name for n in names if "/share/distbench/profiles/" in n}
    assert shipped == {p.name for p in (ROOT / "configs" / "profiles").glob("*.toml")}
    # the JSON Schemas, package data that distbench.schemas.schema() reads
    schemas = {n for n in names if n.startswith("distbench/schemas/") and n.endswith(".json")}
    assert schemas == {f"distbench/schemas/{p.name}"
                       for p in (ROOT / "distbench" / "schemas").glob("*.schema.json")}, schemas
    assert not [n for n in names if n.startswith(("tests/", "results/"))]


def test_run_json_says_which_torch_ran_and_from_where():
    rt = Runtime(0, 1, 0, "gloo", torch.device("cpu"))
    versions = rt.versions()
    assert versions["torch"] == torch.__version__
    assert Path(versions["torch_path"], "__init__.py").is_file()
    assert versions["nccl"] is None and versions["nccl_library"] is None  # gloo: no NCCL
    found = loaded_library("libtorch_cpu")  # the scan of this process's libraries works
    assert found and Path(found).is_file() and found.startswith(versions["torch_path"])
