"""`distbench topo` standalone, as a process: it exits 0 fast, writes one run directory and its
files, and sums the snapshot up on stdout. The snapshot and summary in-process:
test_topo_command.py."""

from __future__ import annotations

import json
import os

import pytest
from helpers import distbench

CPU = {"model": "Fake CPU 9000", "logical_cores": 224,
       "numa_nodes": [{"node": 0, "cpus": "0-55,112-167"}, {"node": 1, "cpus": "56-111,168-223"}]}


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("topo")
    out = tmp / "results"
    proc = distbench(out, "topo", cwd=tmp, timeout=60)
    return proc, proc.secs, out


@pytest.mark.multiproc
def test_standalone_exits_0_fast(standalone):
    proc, secs, _ = standalone
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "Traceback" not in proc.stderr
    assert secs < 20, f"distbench topo took {secs:.1f} s"


@pytest.mark.multiproc
def test_standalone_writes_one_run_directory(standalone):
    proc, _, out = standalone
    runs = sorted(out.iterdir())
    assert len(runs) == 1 and runs[0].is_dir(), runs
    run_dir = runs[0]
    assert run_dir.name.endswith("-topo")
    assert {p.name for p in run_dir.iterdir()} == {"topo.txt", "topo.json", "run.json"}
    assert str(run_dir) in proc.stderr  # where the results are


@pytest.mark.multiproc
def test_standalone_files(standalone):
    _, _, out = standalone
    (run_dir,) = out.iterdir()
    host = _hostname()

    text = (run_dir / "topo.txt").read_text()
    assert text.startswith(f"==== node {host} ")
    if _cpu_only():
        assert "CPU-only" in text

    data = json.loads((run_dir / "topo.json").read_text())
    assert data["schema_version"] == 1
    assert isinstance(data["nodes"], list) and len(data["nodes"]) == 1
    (node,) = data["nodes"]
    assert node["host"] == host
    assert node["cpu"]["logical_cores"] == os.cpu_count()
    assert "model" in node["cpu"] and "numa_nodes" in node["cpu"]
    assert set(node["gpu_links"]) == {"devices", "links"}
    if _cpu_only():
        assert node["gpu_links"] == {"devices": [], "links": {}}
        assert node["gpus"] == []

    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "ok"
    assert meta["exit_code"] == 0
    assert meta["command"] == "topo"
    assert meta["nnodes"] == 1
    assert meta["end_utc"] is not None
    assert meta["options"]["out"] == str(out)


@pytest.mark.multiproc
def test_standalone_stdout_summary(standalone):
    proc, _, _ = standalone
    lines = proc.stdout.splitlines()
    assert lines[0] == f"node {_hostname()}"
    assert any(line.strip().startswith("CPU ") and "logical cores" in line for line in lines)
    if _cpu_only():
        assert "CPU-only" in proc.stdout


def _hostname() -> str:
    import socket

    return socket.gethostname()


def _cpu_only() -> bool:
    import shutil

    return shutil.which("nvidia-smi") is None
