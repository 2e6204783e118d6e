"""The command line's conventions, the same on every command because app.py derives them from
the option declarations (issue 47): an option of fixed choices lists them under --help and the
shell completes them; -h is --help and --version says the version; a flag that is only ever
turned on has no --no- form; --workers under a launcher is refused in one line; every list is
a comma list."""

from __future__ import annotations

import sys
import types
import typing
from pathlib import Path

import pytest
import typer.main
from helpers import assert_one_line_error, cli, refused, resolved

import distbench
from distbench.cli.app import app
from distbench.core.options import (
    OptionError,
    choices_of,
    cli_types,
    flag,
    load_config,
    one_of,
    option_fields,
    pick,
    to_argv,
)
from distbench.kinds import commands


def _click_command(name: str):
    return typer.main.get_command(app).commands[name]


def _param(name: str, option: str):
    (param,) = [p for p in _click_command(name).params if option in p.opts]
    return param


def _choice_options() -> list[tuple[str, str, tuple[str, ...], bool]]:
    """(command, --flag, choices, comma list) for every option of fixed choices."""
    found = []
    for name, command in commands().items():
        for _, spec in option_fields(command.options):
            choices = choices_of(spec.check)
            if choices is not None:
                found.append((name, flag(spec.flag), *choices))
    return found


CHOICE_OPTIONS = _choice_options()

# ---------------------------------------------------------------------------------------------
# 1. Choices: listed under --help, completed by the shell, refused in our own words.


def test_the_checks_of_fixed_choices_say_them():
    assert choices_of(one_of(("out", "in", "both"), "--placement both")) == (
        ("out", "in", "both"), False)
    assert choices_of(pick(("ring", "matrix"), "--pattern ring")) == (
        ("ring", "matrix", "all"), True)
    assert choices_of(None) is None
    found = {(name, option): (choices, many) for name, option, choices, many in CHOICE_OPTIONS}
    assert found["tp", "--block"] == (("mlp", "attention", "both"), True)
    assert found["collective", "--backend"] == (("auto", "nccl", "gloo"), False)
    assert found["collective", "--placement"] == (("out", "in", "both"), False)
    assert found["step", "--grad-sync"] == (("micro", "last"), False)
    assert found["step", "--zero"] == (("0", "1", "2", "3", "all"), True)
    assert "fsdp" in found["dp", "--mode"][0] and found["dp", "--mode"][1]
    assert "h100" in found["plan", "--gpu"][0]
    assert "bfloat16" in found["watch", "--dtype"][0]
    assert found["watch", "--op"][0] == found["collective", "--op"][0]


def test_every_option_refusing_an_unknown_word_declares_its_choices():
    """An option whose check answers a word it does not know with the words it does is one of
    fixed choices: it must say them, or --help and the shell would not (a new wrapper around
    one_of or pick that forgot with_choices)."""
    missing = []
    for name, command in commands().items():
        for _, spec in option_fields(command.options):
            if spec.check is None or choices_of(spec.check) is not None:
                continue
            try:
                spec.check(flag(spec.flag), "no-such-word")
            except OptionError as e:
                if "(valid: " in str(e):
                    missing.append((name, flag(spec.flag)))
            except Exception:  # noqa: BLE001 - a check of numbers may fail otherwise on a word
                pass
    assert missing == []


@pytest.mark.parametrize("name,option,choices,many", CHOICE_OPTIONS,
                         ids=[f"{c[0]}{c[1]}" for c in CHOICE_OPTIONS])
def test_help_names_every_choice(name, option, choices, many):
    param = _param(name, option)
    words = {w.strip(".,;:()'\"") for w in param.help.replace(",", " ").replace("/", " ").split()}
    assert set(choices) <= words, param.help
    assert param.metavar == ("<list>" if many else "<name>")
    if many:
        assert "comma" in param.help


def test_help_output_lists_choices_the_declared_text_left_out(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    got = cli(tmp_path, "watch", "--help")
    assert got.code == 0, got.stderr
    assert "Choices: float32, float16, bfloat16" in got.stdout  # --dtype's text named none
    assert "<name>" in got.stdout and "<list>" in got.stdout


def _complete(tmp_path: Path, *words: str) -> list[str]:
    """What bash completion offers for the last of `words` (`distbench` first)."""
    got = cli(tmp_path, env={"_DISTBENCH_COMPLETE": "complete_bash",
                             "COMP_WORDS": " ".join(words), "COMP_CWORD": str(len(words) - 1)})
    assert got.code == 0, got.stderr
    return got.stdout.split()


def test_the_shell_completes_a_choice(tmp_path):
    assert _complete(tmp_path, "distbench", "tp", "--block", "") == ["mlp", "attention", "both"]
    assert _complete(tmp_path, "distbench", "collective", "--backend", "g") == ["gloo"]
    assert _complete(tmp_path, "distbench", "step", "--grad-sync", "") == ["micro", "last"]
    assert _complete(tmp_path, "distbench", "watch", "--dtype", "bf") == ["bfloat16"]


def test_the_shell_completes_the_last_item_of_a_comma_list(tmp_path):
    assert _complete(tmp_path, "distbench", "collective", "--op", "all_reduce,b") == [
        "all_reduce,broadcast"]
    # those given already, and `all` (alone or not at all), are not offered again
    assert _complete(tmp_path, "distbench", "p2p", "--pattern", "ring,") == [
        "ring,pingpong", "ring,matrix"]
    assert "all" in _complete(tmp_path, "distbench", "p2p", "--pattern", "")


def test_the_shell_completes_commands_and_options(tmp_path):
    assert _complete(tmp_path, "distbench", "wa") == ["watch"]
    assert "--once" in _complete(tmp_path, "distbench", "watch", "--o")


def test_a_bad_choice_is_still_refused_in_our_words(tmp_path):
    err = refused(tmp_path, "tp", "--block", "conv")
    assert err.startswith("distbench: error: --block: unknown value 'conv' "), err
    valid = err.partition("(valid: ")[2].partition(")")[0]
    assert set(valid.split(", ")) == {"mlp", "attention", "all"}, err
    assert "(example: --block both)" in err, err
    err = refused(tmp_path, "collective", "--backend", "MPI")
    assert err.startswith("distbench: error: --backend: unknown value 'mpi' (valid: auto, "
                          "nccl, gloo)")
    # case and spaces as before: the check, not click, reads the value
    assert resolved(tmp_path, "collective", "--backend", " GLOO ").backend == "gloo"


# ---------------------------------------------------------------------------------------------
# 2. -h and --version


@pytest.mark.parametrize("argv", [["-h"], *([name, "-h"] for name in [*commands(), "report",
                                                                       "compare"])],
                         ids=lambda argv: " ".join(argv))
def test_h_is_help(tmp_path, argv):
    short, long = cli(tmp_path, *argv), cli(tmp_path, *argv[:-1], "--help")
    assert short.code == 0 and short.stderr == "", short.stderr
    assert "Usage: distbench" in short.stdout
    assert short.stdout == long.stdout


def test_version(tmp_path):
    got = cli(tmp_path, "--version")
    # `distbench X.Y.Z` and nothing else: what a script reading the version parses
    assert (got.code, got.stdout, got.stderr) == (0, f"distbench {distbench.__version__}\n", "")
    assert distbench.__version__.count(".") == 2


# ---------------------------------------------------------------------------------------------
# 3. A flag only ever turned on has no --no- form; one on by default keeps it.


def _bools() -> list[tuple[str, str, bool]]:
    return [(name, flag(spec.flag), f.default)
            for name, command in commands().items()
            for f, spec in option_fields(command.options)
            if cli_types(command.options)[f.name] is bool]


def test_flags_off_by_default_are_plain_and_those_on_keep_their_negation():
    bools = _bools()
    assert ("watch", "--once", False) in bools and ("step", "--sp", True) in bools
    for name, option, default in bools:
        param = _param(name, option)
        assert param.is_flag, (name, option)
        negation = ["--no-" + option[2:]] if default else []
        assert param.secondary_opts == negation, (name, option, param.secondary_opts)


@pytest.mark.parametrize("argv", [["watch", "--no-once"], ["watch", "--no-npd"],
                                  ["accept", "--no-dry-run"], ["collective", "--no-cuda-graph"]],
                         ids=lambda argv: argv[1])
def test_the_negation_of_a_plain_flag_is_refused(in_process, argv):
    assert_one_line_error(in_process(*argv), None, argv[1], ours=False)


def test_flags_resolve_from_the_command_line_and_a_config_file(tmp_path):
    assert resolved(tmp_path, "step", "--no-sp").sp is False
    assert resolved(tmp_path, "step").sp is True
    assert resolved(tmp_path, "collective", "--cuda-graph", "--backend", "nccl").cuda_graph
    cfg = tmp_path / "flags.toml"
    cfg.write_text("[accept]\nquick = true\nstrict = false\n[step]\nsp = false\n")
    opts = resolved(tmp_path, "accept", "--config", str(cfg), "--dry-run", "--nodes", "2",
                    "--gpus-per-node", "8")
    assert (opts.quick, opts.strict, opts.dry_run) == (True, False, True)
    assert resolved(tmp_path, "step", "--config", str(cfg)).sp is False


def test_a_config_file_takes_true_and_false_for_a_plain_flag(tmp_path):
    known = {"once": bool, "npd": bool, "check": bool}
    cfg = tmp_path / "w.toml"
    cfg.write_text("once = true\nnpd = false\ncheck = false\n")
    assert load_config(cfg, "watch", known, {"watch"}) == {"once": True, "npd": False,
                                                          "check": False}


def test_the_flags_handed_to_workers_name_no_missing_negation(tmp_path):
    """What the local launcher hands its workers (to_argv) parses again to the same options:
    a plain flag left off is left out, not --no-once."""
    opts = resolved(tmp_path, "step", "--no-sp", "--no-check")
    argv = to_argv(opts)
    assert "--no-sp" in argv and "--no-check" in argv
    watch = resolved(tmp_path, "watch", "--once", "--check")
    argv = to_argv(watch)
    assert "--once" in argv and not any(a in argv for a in ("--no-once", "--no-npd",
                                                             "--no-drain", "--npd"))
    again = resolved(tmp_path, "watch", *argv)
    assert (again.once, again.npd, again.drain, again.check) == (True, False, False, True)


# ---------------------------------------------------------------------------------------------
# 4. --workers under a launcher: refused in one line, before anything is created.

LAUNCHER = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


@pytest.fixture
def peers_told(monkeypatch):
    """Under a launcher a refusing rank tells the others through the launcher's store (run/
    peers.py, torch's): replaced, and what it was told kept."""
    told: list[str] = []
    fake = types.ModuleType("distbench.run.peers")
    fake.refuse = lambda message, timeout_s: told.append(message)
    monkeypatch.setitem(sys.modules, "distbench.run.peers", fake)
    return told


@pytest.mark.parametrize("name", ["collective", "p2p", "step", "watch"])
def test_workers_under_a_launcher_is_refused_in_one_line(tmp_path, peers_told, name):
    out = tmp_path / "results"
    got = cli(tmp_path, name, "--workers", "2", "--out", str(out), env=LAUNCHER)
    line = assert_one_line_error(got, None, "--workers", ours=True)
    # docs/commands.md and docs/results.md quote this line whole
    assert line == ("distbench: error: --workers: not with a launcher (torchrun, srun): it "
                    "started 2 ranks already (example: torchrun --nproc-per-node 2 -m "
                    f"distbench {name})")
    assert got.dispatched == [] and not out.exists()
    assert peers_told == [line.removeprefix("distbench: error: ")]


def test_workers_from_a_config_file_under_a_launcher_is_refused(tmp_path, peers_told):
    cfg = tmp_path / "c.toml"
    cfg.write_text("workers = 4\n")
    got = cli(tmp_path, "collective", "--config", str(cfg), env=LAUNCHER)
    assert_one_line_error(got, None, "--workers", ours=True)


def test_without_workers_a_launched_rank_is_accepted(tmp_path, peers_told):
    opts = resolved(tmp_path, "collective", "--sizes", "4K", env=LAUNCHER)
    assert opts.workers is None and peers_told == []


def test_the_workers_our_own_launcher_started_keep_their_count(tmp_path, peers_told):
    """Our local launcher hands its workers --workers (run.json records it): not refused."""
    env = {**LAUNCHER, "DISTBENCH_RUN_DIR": str(tmp_path / "run")}
    opts = resolved(tmp_path, "collective", "--sizes", "4K", "--workers", "2", env=env)
    assert opts.workers == 2 and peers_told == []


# ---------------------------------------------------------------------------------------------
# 5. One list syntax: every option that takes several values takes a comma list.


def _is_list(kind) -> bool:
    return any(typing.get_origin(k) is list for k in (kind, *typing.get_args(kind)))


def test_every_list_option_is_a_comma_list_but_layout():
    """Each option stored as a list is typed as text on the command line and split on commas
    by its check; plan's --layout alone repeats (a layout is itself comma-joined: tp=8,pp=2),
    and takes ';' between layouts too, as its help says."""
    comma, repeated = [], []
    for name, command in commands().items():
        hints, typed = typing.get_type_hints(command.options), cli_types(command.options)
        for f, spec in option_fields(command.options):
            if _is_list(typed[f.name]):
                repeated.append((name, flag(spec.flag)))
            elif _is_list(hints[f.name]):
                assert typed[f.name] is str, (name, spec.flag)
                comma.append((name, flag(spec.flag)))
    assert repeated == [("plan", "--layout")]
    assert "';'" in _param("plan", "--layout").help
    assert {("collective", "--op"), ("dp", "--bucket-cap-mb"), ("plan", "--from"),
            ("watch", "--sizes")} <= set(comma)


@pytest.mark.parametrize("argv,field,want", [
    (["collective", "--op", "all_reduce,broadcast"], "ops", ["all_reduce", "broadcast"]),
    (["collective", "--dtype", "float32,bf16"], "dtypes", ["float32", "bfloat16"]),
    (["collective", "--sizes", "1K,4K"], "sizes", [1024, 4096]),
    (["p2p", "--pattern", "ring,matrix"], "patterns", ["ring", "matrix"]),
    (["tp", "--block", "mlp,attention"], "blocks", ["mlp", "attention"]),
    (["pp", "--schedule", "gpipe,1f1b"], "schedules", ["gpipe", "1f1b"]),
    (["dp", "--mode", "ddp,zero1"], "modes", ["ddp", "zero1"]),
    (["dp", "--bucket-cap-mb", "1,25"], "bucket_cap_mb", [1.0, 25.0]),
    (["step", "--zero", "0,1"], "zero", [0, 1]),
    (["watch", "--op", "all_reduce,all_gather", "--sizes", "64K,1M"], "sizes",
     [65536, 1 << 20]),
], ids=lambda v: " ".join(v[:2]) if isinstance(v, list) and v and v[0] in commands() else "")
def test_comma_lists(tmp_path, argv, field, want):
    assert getattr(resolved(tmp_path, *argv), field) == want
