"""The command table and the op registry: a new collective is one registered spec, run end to
end without touching a production file; the command line and --help come from the tables."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers import cli, torchrun_nodes

from distbench.cli import app
from distbench.cli.commands import COMMANDS
from distbench.core.options import RunOptions, option_fields
from distbench.ops.collectives import OPS

HERE = Path(__file__).parent


def test_every_command_has_options_and_a_body():
    assert set(COMMANDS) == {"collective", "p2p", "topo", "tp", "pp", "dp", "accept"}
    registered = {c.name for c in app.app.registered_commands}
    # report and compare read results back: no launcher, so no entry in the command table
    assert registered == set(COMMANDS) | {"report", "compare"}
    for name, command in COMMANDS.items():
        assert issubclass(command.options, RunOptions), name
        assert callable(command.run), name
        flags = [spec.flag for _, spec in option_fields(command.options)]
        assert len(flags) == len(set(flags)), name
        assert {"out", "timeout"} <= set(flags), name
        assert "backend" in flags or name == "topo", name
    assert COMMANDS["topo"].run_local is not None
    topo_flags = [s.flag for _, s in option_fields(COMMANDS["topo"].options)]
    assert "workers" not in topo_flags
    # topo never needs NCCL: a broken NCCL must not block the snapshot taken to look into it
    assert "backend" not in topo_flags and COMMANDS["topo"].options().backend == "gloo"


def test_op_help_lists_the_registry(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    proc = cli(tmp_path, "collective", "--help")
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    assert ", ".join(OPS) in text


def _torchrun(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """Two ranks under torchrun, running distbench with the test-only op registered."""
    (agent,) = torchrun_nodes(tmp_path, 1, 2, [list(args)],
                              script=(str(HERE / "throwaway_main.py"),), **env)
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


@pytest.mark.multiproc
def test_the_test_only_op_is_really_checked(tmp_path):
    proc = _torchrun(tmp_path, "collective", "--op", "broadcast_from_last", "--sizes", "1K",
                     "--iters", "2", "--warmup", "1", DISTBENCH_TEST_CORRUPT_RANK="0")
    assert proc.returncode != 0
    meta = json.loads((_run_dir(tmp_path) / "run.json").read_text())
    assert meta["status"] == "wrong" and meta["exit_code"] == 1
    assert "broadcast_from_last 1 KiB float32" in meta["error"]
