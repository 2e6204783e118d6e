"""A wheel builds and carries the acceptance profiles and schemas. What run.json says of torch
and NCCL: test_packaging.py."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from paths import REPO


@pytest.mark.procs(3)  # pip, and the build backend it runs
def test_a_wheel_builds_and_carries_the_profiles_and_schemas(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(REPO)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (wheel,) = tmp_path.glob("distbench-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "distbench/cli/app.py" in names
    shipped = {Path(n).name for n in names if "/share/distbench/profiles/" in n}
    assert shipped == {p.name for p in (REPO / "configs" / "profiles").glob("*.toml")}
    # the JSON Schemas, package data that distbench.schemas.schema() reads
    schemas = {n for n in names if n.startswith("distbench/schemas/") and n.endswith(".json")}
    assert schemas == {f"distbench/schemas/{p.name}"
                       for p in (REPO / "distbench" / "schemas").glob("*.schema.json")}, schemas
    assert not [n for n in names if n.startswith(("tests/", "results/"))]
