"""The command line as a process of its own: bad input refused by the process itself in one line,
--help fast and torch-free, and refusals made only where the workers would start. The rest of
the command line, in-process: test_cli.py."""

from __future__ import annotations

import textwrap

import helpers
import pytest
from cli_helpers import _assert_no_run_dir
from helpers import assert_one_line_error, python_c

# The real command, a process of its own: one line on its stderr, exit 2, within seconds (no
# worker started), for our own check, click's, a config file's, and another command's.
SMOKE = [(["collective", "--sizes", "1Q"], "--sizes", True),
         (["collective", "--bogus"], "--bogus", False),
         (["collective", "--config", "missing.toml"], "--config", True),
         (["p2p", "--pattern", "star"], "--pattern", True)]


@pytest.mark.multiproc
@pytest.mark.parametrize("args,option,ours", SMOKE, ids=["sizes", "click", "config", "p2p"])
def test_the_process_itself_refuses_bad_input_in_one_line(tmp_path, args, option, ours):
    out = tmp_path / "results"
    res = helpers.distbench(out, *args, cwd=tmp_path, fresh=True)
    assert_one_line_error(res, res.secs, option, ours)
    _assert_no_run_dir(tmp_path, out)


NO_TORCH = {"bad-sizes": ["collective", "--sizes", "1Q"], "help": ["--help"],
            "collective-help": ["collective", "--help"], "p2p-bad": ["p2p", "--pattern", "star"],
            "tp-bad": ["tp", "--heads", "7"], "pp-bad": ["pp", "--schedule", "zb"],
            # accept's plan: torch would take most of a dry run's time, at any node count
            "accept-dry-run": ["accept", "--dry-run", "--nodes", "128", "--gpus-per-node", "8",
                               "--profile", "h100-sxm-8"],
            "dp-mode": ["dp", "--mode", "zero9"], "dp-bucket": ["dp", "--bucket-cap-mb", "0"],
            "dp-help": ["dp", "--help"]}


@pytest.mark.multiproc
def test_no_torch_import(tmp_path):
    """Each in turn in one fresh interpreter: whichever first imported torch is the one named
    (the check after it fails), as it would be in an interpreter of its own."""
    code = textwrap.dedent(f"""
        import sys
        import distbench.cli.app
        for name, argv in {NO_TORCH!r}.items():
            try:
                distbench.cli.app.main(argv)
            except SystemExit as e:
                print(name, "exit", e.code)
            print(name, "torch-imported", "torch" in sys.modules)
    """)
    proc = python_c(code, tmp_path)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stderr
    for name, argv in NO_TORCH.items():
        expected_exit = "exit 0" if "--help" in argv or "--dry-run" in argv else "exit 2"
        assert f"{name} {expected_exit}" in lines, proc.stdout + proc.stderr
        assert f"{name} torch-imported False" in lines, proc.stdout


@pytest.mark.multiproc
@pytest.mark.parametrize("args,needle", [(["--help"], "collective"),
                                         (["collective", "--help"], "--sizes")],
                         ids=["help", "collective-help"])
def test_help_is_fast(tmp_path, args, needle):
    """In CPU-seconds of the process itself, whatever else the machine runs: 0.3 here, and
    about 2 with torch imported."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = helpers.distbench(None, *args, cwd=tmp_path, fresh=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    print(f"distbench {' '.join(args)}: {cpu:.3f} CPU-s, {res.secs:.3f} s")
    assert res.code == 0, res.stderr
    assert needle in res.stdout
    assert res.stderr == ""
    assert cpu < 1.0, f"distbench {' '.join(args)} took {cpu:.2f} CPU-s"


@pytest.mark.multiproc  # the world is counted where workers would start: the real command
def test_root_outside_the_default_world_is_refused_before_workers(tmp_path):
    """Without --workers the world size is known only once the launcher counts devices (2 gloo
    workers here): the root is checked then, before any worker or run directory exists."""
    out = tmp_path / "results"
    proc = helpers.distbench(out, "collective", "--op", "broadcast", "--root", "5", "--sizes",
                             "4K", cwd=tmp_path)
    assert proc.code == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "distbench: error: --root: rank 5 does not exist in a world of 2 (example: --root 0)"]
    assert not out.exists()  # not even --out: nothing is created before validation passes


@pytest.mark.parametrize("args,option", [(["tp", "--heads", "3", "--hidden-size", "96"], "--heads"),
                                         (["pp", "--layers", "1"], "--layers")],
                         ids=["tp-heads", "pp-layers"])
@pytest.mark.multiproc  # refused for the world the launcher counts
def test_a_shape_refused_for_the_default_world_leaves_nothing(tmp_path, args, option):
    out = tmp_path / "results"
    proc = helpers.distbench(out, *args, cwd=tmp_path)
    assert proc.code == 2, proc.stderr
    assert proc.stderr.startswith(f"distbench: error: {option}:")
    assert not out.exists()


@pytest.mark.multiproc  # refused where workers would start, once torch says there is no GPU
@pytest.mark.parametrize("args", [["--cuda-graph"], ["--cuda-graph", "--backend", "gloo"]],
                         ids=["auto-resolves-to-gloo", "gloo"])
def test_cuda_graph_without_a_gpu_is_refused_in_one_line(tmp_path, args):
    """On CPU --cuda-graph cannot run: one line, exit 2, before any worker, nothing created
    (with --backend auto only once torch says there is no GPU, so after torch's import: the
    missing run directory is the proof, not the time)."""
    proc = helpers.distbench(tmp_path / "out", "collective", *args, "--workers", "2",
                             cwd=tmp_path)
    line = assert_one_line_error(proc, None if "--backend" not in args else proc.secs,
                                 "--cuda-graph", ours=True)
    assert "needs CUDA GPUs and the nccl backend; this run would use gloo" in line
    assert not (tmp_path / "out").exists()
