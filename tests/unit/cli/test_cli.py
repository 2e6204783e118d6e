"""The command line: bad input fails fast in one line, --help stays fast and torch-free, no option
falls into torchrun's prefix trap, and config files / flags resolve to the options a run gets.
Bad input is refused in this process (dispatch replaced: nothing could start); a few cases run
as the real command, to show the process itself prints the one line and exits 2 at once.
The tests that start processes: test_cli_multiproc.py."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from cli_helpers import _assert_no_run_dir, _distbench_options, _torchrun_parser
from helpers import assert_one_line_error, refused, resolved

from distbench.ops.collectives import OPS

# --------------------------------------------------------------------------------------------
# 1. Bad input: exit 2, exactly one line on stderr naming the option, no traceback, no run dir.
# --------------------------------------------------------------------------------------------

# (id, args, option the line must name, whether it is our own validation -> "example:")
BAD_FLAGS = [
    ("sizes-bad-suffix", ["--sizes", "1Q"], "--sizes", True),
    ("sizes-zero", ["--sizes", "0"], "--sizes", True),
    ("sizes-end-below-start", ["--sizes", "1M:1K"], "--sizes", True),
    ("sizes-factor-1", ["--sizes", "1K:1M:x1"], "--sizes", True),
    ("sizes-factor-fraction", ["--sizes", "1K:1M:x0.5"], "--sizes", True),
    ("sizes-too-many", ["--sizes", "1:2000:+1"], "--sizes", True),
    ("sizes-overflow", ["--sizes", "99999999999999999999999T"], "--sizes", True),
    ("op-unknown", ["--op", "foo"], "--op", True),
    ("dtype-unknown", ["--dtype", "float7"], "--dtype", True),
    ("redop-unknown", ["--redop", "xor"], "--redop", True),
    ("backend-unknown", ["--backend", "mpi"], "--backend", True),
    ("placement-unknown", ["--placement", "sideways"], "--placement", True),
    ("iters-zero", ["--iters", "0"], "--iters", True),
    ("iters-negative", ["--iters", "-3"], "--iters", True),
    # a timed loop keeps a sample per iteration: refused before workers, not a MemoryError
    ("iters-absurd", ["--iters", "1000000000000"], "--iters", True),
    ("warmup-negative", ["--warmup", "-1"], "--warmup", True),
    ("timeout-zero", ["--timeout", "0"], "--timeout", True),
    ("timeout-negative", ["--timeout", "-5"], "--timeout", True),
    # inf/nan pass a bare `> 0` test but crash every worker (timedelta / ceil overflow)
    ("timeout-inf", ["--timeout", "inf"], "--timeout", True),
    ("timeout-nan", ["--timeout", "nan"], "--timeout", True),
    ("min-time-zero", ["--min-time", "0"], "--min-time", True),
    ("min-time-inf", ["--min-time", "inf"], "--min-time", True),
    ("workers-zero", ["--workers", "0"], "--workers", True),
    ("root-negative", ["--root", "-1"], "--root", True),
    ("root-outside-world", ["--root", "2", "--workers", "2"], "--root", True),
    # values click cannot parse: said in our words, with the option's own valid example
    ("iters-not-int", ["--iters", "x"], "--iters", True),
    ("iters-fraction", ["--iters", "1.5"], "--iters", True),
    ("timeout-not-number", ["--timeout=abc"], "--timeout", True),
    # click/typer's own usage errors
    ("unknown-option", ["--bogus"], "--bogus", False),
]


@pytest.mark.parametrize("args,option,ours", [c[1:] for c in BAD_FLAGS],
                         ids=[c[0] for c in BAD_FLAGS])
def test_bad_flag_is_one_line_exit_2(in_process, tmp_path, args, option, ours):
    out = tmp_path / "results"
    assert_one_line_error(in_process("collective", *args, "--out", str(out)), None, option, ours)
    _assert_no_run_dir(tmp_path, out)


def test_out_under_a_regular_file(in_process, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory\n")
    out = blocker / "results"
    res = in_process("collective", "--sizes", "8", "--out", str(out))
    line = assert_one_line_error(res, None, "--out", ours=True)
    assert str(out) in line
    _assert_no_run_dir(tmp_path, out)
    assert blocker.read_text() == "not a directory\n"


def test_out_in_read_only_directory(in_process, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        try:
            (ro / "probe").write_text("x")
        except PermissionError:
            pass
        else:
            pytest.skip("chmod 0o500 does not stop writes here (running as root); "
                        "test_out_under_a_regular_file covers an --out that cannot be written")
        out = ro / "results"
        res = in_process("collective", "--sizes", "8", "--out", str(out))
        assert_one_line_error(res, None, "--out", ours=True)
        _assert_no_run_dir(tmp_path, out)
    finally:
        ro.chmod(0o700)


def _write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


CONFIG_CASES = [
    ("missing", None, "--config"),
    ("malformed", 'sizes = [\nop = "all_reduce"\n', "--config"),
    ("unknown-key", 'sizes = "4K"\nbogus_key = 1\n', "bogus_key"),
    ("unknown-key-in-table", '[collective]\nnproc = 2\n', "nproc"),
    ("bad-value", 'sizes = "1Q"\n', "--sizes"),
    ("bad-value-in-table", '[collective]\niters = 0\n', "--iters"),
    ("table-typo", '[colective]\niters = 3\n', "unknown table [colective]"),
    ("only-another-commands-table", '[p2p]\npattern = "ring"\n', "no [collective] table"),
    ("bool-is-not-an-integer", 'iters = true\n', "iters = true"),
    ("integer-is-not-a-bool", '[collective]\ncheck = 1\n', "check = 1"),
    ("text-is-not-a-number", 'min-time = "fast"\n', 'min-time = "fast"'),
]


@pytest.mark.parametrize("text,needle", [c[1:] for c in CONFIG_CASES],
                         ids=[c[0] for c in CONFIG_CASES])
def test_bad_config_is_one_line_exit_2(in_process, tmp_path, text, needle):
    cfg = tmp_path / "bench.toml"
    if text is not None:
        cfg.write_text(text)
    out = tmp_path / "results"
    res = in_process("collective", "--config", str(cfg), "--out", str(out))
    # an unknown key is the config file's fault: the line names --config, then the key
    option = needle if needle.startswith("--") else "--config"
    line = assert_one_line_error(res, None, option, ours=True)
    assert needle in line
    if text is None:
        assert str(cfg) in line
    _assert_no_run_dir(tmp_path, out)


def test_bad_config_value_fails_like_the_flag(in_process, tmp_path):
    cfg = _write(tmp_path / "bench.toml", 'sizes = "1Q"\n')
    out = tmp_path / "results"
    from_file = in_process("collective", "--config", str(cfg), "--out", str(out))
    from_flag = in_process("collective", "--sizes", "1Q", "--out", str(out))
    assert from_flag.returncode == from_file.returncode == 2
    assert from_file.stderr == from_flag.stderr
    assert from_file.stderr.startswith("distbench: error: --sizes:")


# --------------------------------------------------------------------------------------------
# 2. Bad input, --help and accept --dry-run never import torch.
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# 3. --help is fast.
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# 4. The torchrun trap: torchrun's argparse reads the script's arguments too.
# --------------------------------------------------------------------------------------------


def test_option_discovery_sees_the_options():
    found = _distbench_options()
    opts = {o for options in found.values() for o, _ in options}
    assert {"--sizes", "--op", "--no-check", "--config", "--min-time"} <= opts
    assert dict(found["collective"])["--sizes"] is True
    assert dict(found["collective"])["--no-check"] is False


def test_no_option_is_a_prefix_of_a_torchrun_option():
    torchrun = sorted({o for a in _torchrun_parser()._actions for o in a.option_strings
                       if o.startswith("--")})
    assert "--nproc-per-node" in torchrun  # the parser is the one we think it is
    clashes = [(cmd, ours, theirs)
               for cmd, options in _distbench_options().items()
               for ours, _ in options
               for theirs in torchrun if theirs.startswith(ours)]
    assert clashes == [], f"torchrun would take these as its own (ambiguous) options: {clashes}"


def test_torchrun_passes_every_option_through():
    parser = _torchrun_parser()
    for cmd, options in _distbench_options().items():
        script_args = [cmd, "--help"]
        for opt, takes_value in options:
            script_args += [opt, "1"] if takes_value else [opt]
        script_args += [f"{opt}=1" for opt, takes_value in options if takes_value]
        try:
            ns = parser.parse_args(["--nproc-per-node", "2", "-m", "distbench", *script_args])
        except SystemExit as e:
            pytest.fail(f"torchrun's parser refused distbench {cmd} options (exit {e.code})")
        assert ns.module is True
        assert ns.training_script == "distbench"
        assert ns.training_script_args == script_args
        assert ns.nproc_per_node == "2"


def test_torchrun_trap_check_can_fail():
    """The check above sees the failure it guards against."""
    with pytest.raises(SystemExit):
        _torchrun_parser().parse_args(["--nproc-per-node", "2", "-m", "distbench", "collective",
                                       "--nproc", "2"])


# --------------------------------------------------------------------------------------------
# 5/6. Resolved options, observed by replacing the launcher.
# --------------------------------------------------------------------------------------------

CONFIG_TOP = """
    op = "all_gather"
    sizes = "4K,8K"
    dtype = ["float32", "bfloat16"]
    iters = 3
    min-time = 0.5
    check = false
"""
CONFIG_TABLE = "[collective]\n" + textwrap.dedent(CONFIG_TOP) + '\n[p2p]\npattern = "ring"\n'


@pytest.mark.parametrize("text", [CONFIG_TOP, CONFIG_TABLE], ids=["top-level", "table"])
def test_config_values_land_and_flags_win(tmp_path, text):
    cfg = _write(tmp_path / "bench.toml", text)
    opts = resolved(tmp_path, "collective", "--config", str(cfg))
    assert opts.ops == ["all_gather"]
    assert opts.sizes == [4096, 8192]
    assert opts.dtypes == ["float32", "bfloat16"]
    assert opts.iters == 3
    assert opts.min_time == 0.5
    assert opts.check is False
    assert opts.redops == ["sum"]  # not in the file: the default

    opts = resolved(tmp_path, "collective", "--config", str(cfg), "--iters", "7")
    assert opts.iters == 7
    assert opts.ops == ["all_gather"] and opts.sizes == [4096, 8192]

    # the flag wins whichever side of --config it is on
    opts = resolved(tmp_path, "collective", "--sizes", "1K", "--check", "--config", str(cfg))
    assert opts.sizes == [1024]
    assert opts.check is True
    assert opts.iters == 3


def test_config_top_level_and_table_merge_the_table_winning(tmp_path):
    cfg = _write(tmp_path / "bench.toml", """
        sizes = "4K"
        iters = 3
        [collective]
        iters = 7
        [p2p]
        pattern = "ring"
    """)
    opts = resolved(tmp_path, "collective", "--config", str(cfg))
    assert opts.sizes == [4096] and opts.iters == 7
    opts = resolved(tmp_path, "p2p", "--config", str(cfg))
    assert opts.sizes == [4096] and opts.iters == 3 and opts.patterns == ["ring"]


def test_empty_out_is_refused(in_process, tmp_path):
    res = in_process("collective", "--out", "")
    line = assert_one_line_error(res, None, "--out", ours=True)
    assert "empty" in line
    assert list(tmp_path.iterdir()) == []  # nothing written into the current directory


def test_defaults(tmp_path):
    opts = resolved(tmp_path, "collective")
    assert opts.ops == ["all_reduce"]
    assert opts.sizes[0] == 8 and opts.sizes[-1] == 128 * 2**20
    assert opts.dtypes == ["float32"] and opts.redops == ["sum"]
    assert opts.placement == "out" and opts.backend == "auto"
    assert opts.iters is None and opts.check is True and opts.workers is None
    assert opts.out == Path("results")


def test_good_inputs_resolve(tmp_path):
    opts = resolved(tmp_path, "collective", "--op", "all", "--dtype", "bf16,fp32", "--redop",
                    "all", "--placement", "both", "--root", "1", "--workers", "2",
                    "--backend", "GLOO", "--sizes", "1K:4K:+1K")
    assert opts.ops == list(OPS)
    assert set(opts.ops) == {"all_reduce", "reduce_scatter", "all_gather", "broadcast",
                             "reduce", "all_to_all", "gather", "scatter"}
    assert opts.dtypes == ["bfloat16", "float32"]
    assert opts.redops == ["sum", "prod", "max", "min", "avg"]
    assert opts.placement == "both"
    assert opts.root == 1 and opts.workers == 2
    assert opts.backend == "gloo"
    assert opts.sizes == [1024, 2048, 3072, 4096]


def test_one_worker_is_enough_for_a_collective(tmp_path):
    assert resolved(tmp_path, "collective", "--workers", "1").workers == 1


def test_duplicates_and_aliases_collapse(tmp_path):
    opts = resolved(tmp_path, "collective", "--dtype", "fp32,float32,float,bf16",
                    "--op", "all_reduce, all_reduce ,broadcast")
    assert opts.dtypes == ["float32", "bfloat16"]
    assert opts.ops == ["all_reduce", "broadcast"]


def test_root_must_exist_in_the_world(tmp_path):
    err = refused(tmp_path, "collective", "--root", "2", "--workers", "2")
    assert err.startswith("distbench: error: --root:") and "example:" in err
    # under a launcher the world size comes from the environment
    err = refused(tmp_path, "collective", "--root", "3", env={"WORLD_SIZE": "3"})
    assert err.startswith("distbench: error: --root:")
    assert resolved(tmp_path, "collective", "--root", "2", env={"WORLD_SIZE": "3"}).root == 2


@pytest.mark.parametrize("argv,named", [
    (["collective", "--op", "foo", "--sizes", "1Q"], "--sizes"),
    (["collective", "--backend", "mpi", "--dtype", "foo"], "--backend"),
    (["tp", "--hidden-size", "0", "--heads", "0"], "--hidden-size"),
    (["pp", "--dtype", "int32", "--timeout", "0"], "--timeout"),
    (["p2p", "--pattern", "star", "--sizes", "1Q"], "--sizes"),
], ids=["collective-op-sizes", "collective-backend-dtype", "tp-hidden-heads", "pp-dtype-timeout",
        "p2p-pattern-sizes"])
def test_of_several_bad_options_the_shared_one_is_named_first(tmp_path, argv, named):
    err = refused(tmp_path, *argv)
    assert err.startswith(f"distbench: error: {named}:"), err


def test_dtype_names_are_torch_dtypes():
    from distbench.core.options import DTYPES, FLOAT_DTYPES
    from distbench.ops.torch_dtypes import TORCH_DTYPES

    assert set(DTYPES) == set(TORCH_DTYPES)
    assert all(TORCH_DTYPES[d].is_floating_point for d in FLOAT_DTYPES)
    assert {d for d in DTYPES if TORCH_DTYPES[d].is_floating_point} == set(FLOAT_DTYPES)


def test_a_value_click_cannot_parse_gets_the_options_example(in_process):
    # docs/results.md quotes this line whole
    proc = in_process("collective", "--iters", "1.5")
    assert proc.stderr == ("distbench: error: --iters: must be a whole number, got '1.5' "
                           "(example: --iters 20)\n")
    proc = in_process("p2p", "--fail-below=x")
    (line,) = proc.stderr.splitlines()
    assert line.startswith("distbench: error: --fail-below: "), line
    assert "must be a number" in line and "got 'x'" in line, line
    assert line.endswith("(example: --fail-below 0.8)"), line


def test_every_numeric_option_has_an_example_to_quote():
    """A value click cannot parse is answered with the option's example: every option of a
    number type must have one."""
    import typing

    from distbench.core.options import cli_types, example_of, option_fields
    from distbench.kinds import commands

    for name, command in commands().items():
        types = cli_types(command.options)
        for f, spec in option_fields(command.options):
            kinds = set(typing.get_args(types[f.name])) or {types[f.name]}
            if kinds & {int, float}:
                example = example_of(spec)
                assert example and example.startswith(f"--{spec.flag.replace('_', '-')} "), (
                    name, spec.flag, example)
