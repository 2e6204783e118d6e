"""The command table and the op registry: a new collective is one registered spec, run end to
end without touching a production file; the command line and --help come from the tables.
The tests that start processes: test_registry_multiproc.py."""

from __future__ import annotations

import pytest
from helpers import cli

from distbench.cli import app
from distbench.core.options import RunOptions, option_fields
from distbench.kinds import commands
from distbench.ops.collectives import OPS


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
