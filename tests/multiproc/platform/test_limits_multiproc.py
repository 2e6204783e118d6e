"""Runs sized past this machine, refused by the real command before any worker, and what run.json
records of the workers that ran. The bounds in-process: test_limits.py."""

from __future__ import annotations

import json
import textwrap

import pytest
from helpers import assert_one_line_error, distbench, python_c
from platform_helpers import TOO_BIG, _nothing_created

GiB = 2**30


@pytest.mark.multiproc  # a fresh interpreter each: what it imports, from nothing
def test_workers_past_the_machine_are_refused_at_once(tmp_path):
    """Within a CPU-second of the process's own work, whatever else the machine runs."""
    for command in ("accept", "collective", "dp", "p2p", "tp", "pp"):
        out = tmp_path / "results"
        code = textwrap.dedent(f"""
            import sys, time
            t0 = time.process_time()
            import distbench.cli.app
            try:
                distbench.cli.app.main([{command!r}, "--workers", "99999", "--out", {str(out)!r}])
            except SystemExit as e:
                print("exit", e.code, "after", round(time.process_time() - t0, 3))
            print("torch-imported", "torch" in sys.modules)
        """)
        proc = python_c(code, tmp_path)
        lines = proc.stdout.splitlines()
        assert lines[0].startswith("exit 2 after "), (command, proc.stdout + proc.stderr)
        assert float(lines[0].split()[-1]) < 1.0, (command, lines[0])
        assert lines[-1] == "torch-imported False", (command, proc.stdout)
        assert proc.stderr.startswith("distbench: error: --workers: 99999 workers on "), (
            command, proc.stderr)
        assert len(proc.stderr.splitlines()) == 1, (command, proc.stderr)
        _nothing_created(tmp_path, out)


@pytest.mark.multiproc  # the real command, from its interpreter's start
def test_the_real_command_refuses_work_past_the_memory_before_workers(tmp_path):
    """Sized after torch's import, whose time the machine's load sets: the run directory the
    launcher would make before its first worker is not there."""
    args, option = TOO_BIG[0]
    out = tmp_path / "results"
    proc = distbench(out, *args, "--backend", "gloo", cwd=tmp_path)
    line = assert_one_line_error(proc, None, option, ours=True)
    assert "GiB" in line or "TiB" in line, line
    _nothing_created(tmp_path, out)


@pytest.mark.multiproc
@pytest.mark.parametrize("given,ran", [(["--workers", "3"], 3), ([], 2)], ids=["three", "default"])
def test_run_json_records_the_workers_that_ran(tmp_path, given, ran):
    out = tmp_path / "results"
    proc = distbench(out, "collective", "--sizes", "1K", "--iters", "2", "--warmup", "0",
                     "--reps", "1", "--backend", "gloo", *given, cwd=tmp_path)
    assert proc.code == 0, proc.stderr
    (run_dir,) = out.iterdir()
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["options"]["workers"] == ran == meta["world_size"], meta["options"]
    assert meta["argv"] == ["collective", "--sizes", "1K", "--iters", "2", "--warmup", "0",
                            "--reps", "1", "--backend", "gloo", *given, "--out", str(out)]
