"""The command table and the op registry: a new collective is one registered spec, run end to
end without touching a production file; the command line and --help come from the tables."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers import cli, torchrun_nodes

from distbench.cli import app
from distbench.core.options import RunOptions, option_fields
from distbench.kinds import commands
from distbench.ops.collectives import OPS

HERE = Path(__file__).parent


def test_every_command_has_options_and_a_body():
    assert set(commands()) == {"collective", "p2p", "topo", "tp", "pp", "dp", "accept", "step",
                             "plan", "watch"}
    registered = {c.name for c in app.app.registered_commands}
    # report and compare read results back: no launcher, so no entry in the command table
    assert registered == set(commands()) | {"report", "compare"}
    for name, command in commands().items():
        assert issubclass(command.options, RunOptions), name
        assert callable(command.run), name
        flags = [spec.flag for _, spec in option_fields(command.options)]
        assert len(flags) == len(set(flags)), name
        assert {"out", "timeout"} <= set(flags), name
        assert "backend" in flags or name == "topo", name
    assert commands()["topo"].run_local is not None
    topo_flags = [s.flag for _, s in option_fields(commands()["topo"].options)]
    assert "workers" not in topo_flags
    # topo never needs NCCL: a broken NCCL must not block the snapshot taken to look into it
    assert "backend" not in topo_flags and commands()["topo"].options().backend == "gloo"


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


@pytest.mark.parametrize("corrupt", [False, True])
def test_the_test_only_op_is_really_checked(monkeypatch, corrupt):
    """Rank 0's result flipped by the test suite's fault (DISTBENCH_TEST_CORRUPT_RANK=0) is
    found by the op's own check, on both of two ranks (threads, fake_group.py); without it,
    nothing is. How wrong results end a run (exit 1, `wrong`, the step named):
    test_collective_multiproc.py."""
    import importlib
    import sys

    import torch
    from fake_group import run_ranks

    from distbench.bench.measure import Settings, measure_case
    from distbench.ops import collectives
    from distbench.ops.collectives import Ctx
    from distbench.run.faults import Faults

    # registered as a user's module registers it, into a registry this test alone sees
    monkeypatch.setattr(collectives, "OPS", dict(collectives.OPS))
    monkeypatch.delitem(sys.modules, "throwaway_op", raising=False)
    op = importlib.import_module("throwaway_op").BROADCAST_FROM_LAST
    assert collectives.OPS["broadcast_from_last"] is op
    count = 256

    def rank(r: int):
        settings = Settings(device=torch.device("cpu"), timeout=60, warmup=1, iters=2,
                            phase=lambda what, seconds: None,
                            faults=Faults(corrupt=corrupt and r == 0))
        inp, out = torch.empty(count), torch.empty(1)
        case = op.build(Ctx(r, 2, -1, "sum", True), inp, out, count)
        return measure_case(settings, case, "broadcast_from_last", 4 * count).wrong

    assert run_ranks(monkeypatch, 2, rank) == [int(corrupt)] * 2
