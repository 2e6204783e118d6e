"""The command line of `distbench p2p` and `distbench topo`: bad input fails fast in one line
naming the option, good input resolves to the options a run gets, and no option falls into
torchrun's prefix trap. The tests that start processes: test_cli_p2p_multiproc.py."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from cli_helpers import _assert_nothing_written, _distbench_options, _torchrun_parser
from helpers import assert_one_line_error, refused, resolved

from distbench.kinds.p2p.options import P2POptions
from distbench.kinds.topo.options import TopoOptions

# --------------------------------------------------------------------------------------------
# Bad input: exit 2, one line naming the option, no traceback, nothing written.
# --------------------------------------------------------------------------------------------

# (id, command, args, option the line must name, whether it is our own validation)
BAD = [
    ("p2p-pattern-unknown", "p2p", ["--pattern", "star"], "--pattern", True),
    ("p2p-pattern-in-list", "p2p", ["--pattern", "ring,star"], "--pattern", True),
    ("p2p-outlier-below-zero", "p2p", ["--outlier-below", "0"], "--outlier-below", True),
    ("p2p-outlier-below-above-1", "p2p", ["--outlier-below", "1.5"], "--outlier-below", True),
    ("p2p-outlier-below-nan", "p2p", ["--outlier-below", "nan"], "--outlier-below", True),
    ("p2p-fail-below-zero", "p2p", ["--fail-below", "0"], "--fail-below", True),
    ("p2p-fail-below-above-1", "p2p", ["--fail-below", "2"], "--fail-below", True),
    ("p2p-one-worker", "p2p", ["--workers", "1"], "--workers", True),
    ("p2p-sizes-bad", "p2p", ["--sizes", "1Q"], "--sizes", True),
    ("p2p-sizes-end-below-start", "p2p", ["--sizes", "1M:1K"], "--sizes", True),
    ("p2p-iters-zero", "p2p", ["--iters", "0"], "--iters", True),
    ("p2p-timeout-zero", "p2p", ["--timeout", "0"], "--timeout", True),
    ("p2p-dtype-unknown", "p2p", ["--dtype", "float7"], "--dtype", True),
    ("p2p-not-a-collective-option", "p2p", ["--op", "all_reduce"], "--op", False),
    ("topo-timeout-zero", "topo", ["--timeout", "0"], "--timeout", True),
    ("topo-no-backend-option", "topo", ["--backend", "nccl"], "--backend", False),
    ("topo-no-workers-option", "topo", ["--workers", "2"], "--workers", False),
]


@pytest.mark.parametrize("command,args,option,ours", [c[1:] for c in BAD],
                         ids=[c[0] for c in BAD])
def test_bad_flag_is_one_line_exit_2(in_process, tmp_path, command, args, option, ours):
    out = tmp_path / "results"
    assert_one_line_error(in_process(command, *args, "--out", str(out)), None, option, ours)
    _assert_nothing_written(tmp_path, out)


# --------------------------------------------------------------------------------------------
# Good input resolves: the launcher is replaced, the options it would get are inspected.
# --------------------------------------------------------------------------------------------

def test_p2p_defaults(tmp_path):
    opts = resolved(tmp_path, "p2p")
    assert isinstance(opts, P2POptions)
    assert opts.patterns == ["ring"]
    assert opts.outlier_below == 0.8
    assert opts.fail_below is None
    assert opts.sizes[0] == 8 and opts.sizes[-1] == 128 * 2**20
    assert opts.dtypes == ["float32"]
    assert opts.iters is None and opts.check is True and opts.workers is None
    assert opts.backend == "auto" and opts.timeout == 300.0
    assert opts.out == Path("results")


def test_p2p_pattern_all(tmp_path):
    assert resolved(tmp_path, "p2p", "--pattern", "all").patterns == ["ring", "pingpong",
                                                                         "matrix"]
    assert resolved(tmp_path, "p2p", "--pattern", "Matrix, ring,matrix").patterns == [
        "matrix", "ring"]


def test_p2p_good_values(tmp_path):
    opts = resolved(tmp_path, "p2p", "--pattern", "matrix", "--fail-below", "0.5",
                    "--outlier-below", "1", "--workers", "3", "--sizes", "1K,4K", "--iters",
                    "4", "--no-check", "--backend", "gloo", "--dtype", "bf16")
    assert opts.patterns == ["matrix"]
    assert opts.fail_below == 0.5
    assert opts.outlier_below == 1.0  # the upper end is allowed
    assert opts.workers == 3
    assert opts.sizes == [1024, 4096]
    assert opts.iters == 4 and opts.check is False
    assert opts.backend == "gloo" and opts.dtypes == ["bfloat16"]


CONFIG = """
    iters = 9

    [collective]
    op = "all_gather"

    [p2p]
    pattern = "matrix"
    outlier-below = 0.6
    sizes = ["1K", "2K"]
"""


def test_p2p_config_table_lands_and_flags_win(tmp_path):
    cfg = tmp_path / "bench.toml"
    cfg.write_text(textwrap.dedent(CONFIG))
    opts = resolved(tmp_path, "p2p", "--config", str(cfg))
    assert opts.patterns == ["matrix"]
    assert opts.outlier_below == 0.6
    assert opts.sizes == [1024, 2048]
    assert opts.iters == 9  # top-level keys apply to every command; the table adds to them
    assert opts.fail_below is None

    opts = resolved(tmp_path, "p2p", "--pattern", "ring", "--config", str(cfg))
    assert opts.patterns == ["ring"]
    assert opts.outlier_below == 0.6


def test_p2p_config_bad_value_is_refused(tmp_path):
    cfg = tmp_path / "bench.toml"
    cfg.write_text('[p2p]\nfail-below = 3\n')
    err = refused(tmp_path, "p2p", "--config", str(cfg))
    assert err.startswith("distbench: error: --fail-below:")


def test_p2p_world_size_from_the_environment(tmp_path):
    err = refused(tmp_path, "p2p", env={"WORLD_SIZE": "1"})
    assert err.startswith("distbench: error: --workers:")
    assert resolved(tmp_path, "p2p", env={"WORLD_SIZE": "2"}).patterns == ["ring"]


def test_topo_resolves(tmp_path):
    opts = resolved(tmp_path, "topo")
    assert isinstance(opts, TopoOptions)
    assert opts.backend == "gloo" and opts.timeout == 300.0 and opts.workers is None
    opts = resolved(tmp_path, "topo", "--timeout", "30")
    assert opts.backend == "gloo" and opts.timeout == 30.0


# --------------------------------------------------------------------------------------------
# torchrun's prefix trap: test_cli.py's checks iterate every command; make sure they see ours.
# --------------------------------------------------------------------------------------------

def test_torchrun_checks_see_p2p_and_topo_options():
    found = _distbench_options()
    p2p = dict(found["p2p"])
    assert {"--pattern", "--outlier-below", "--fail-below", "--sizes", "--workers",
            "--no-check"} <= set(p2p)
    assert p2p["--fail-below"] is True and p2p["--no-check"] is False
    assert {"--out", "--timeout", "--config"} <= set(dict(found["topo"]))
    assert not {"--workers", "--backend"} & set(dict(found["topo"]))


@pytest.mark.parametrize("command", ["p2p", "topo"])
def test_torchrun_passes_p2p_and_topo_options_through(command):
    torchrun = {o for a in _torchrun_parser()._actions for o in a.option_strings
                if o.startswith("--")}
    options = _distbench_options()[command]
    assert [o for o, _ in options if any(t.startswith(o) for t in torchrun)] == []
    script_args = [command]
    for opt, takes_value in options:
        script_args += [opt, "1"] if takes_value else [opt]
    ns = _torchrun_parser().parse_args(["--nproc-per-node", "2", "-m", "distbench",
                                        *script_args])
    assert ns.training_script == "distbench"
    assert ns.training_script_args == script_args
