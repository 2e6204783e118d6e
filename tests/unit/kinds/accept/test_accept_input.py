"""`distbench accept` refuses bad input before any worker starts (issue 20): a profile that
passes for a built-in, a size no measurement can use, a check written where TOML does not take
it, a control character in a name, a --profile that is no profile file, and a --baseline whose
figures no run measures. Each is one line and exit 2, and nothing is written: the --out folder
is not even created. Each run below would, without its check, start two workers and leave a run
directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import assert_one_line_error, cli
from paths import REPO

from distbench.core import dtypes
from distbench.core.options import DTYPES
from distbench.kinds.accept import profile_files, profile_toml
from distbench.kinds.accept.files import read_baseline
from distbench.kinds.accept.profile_model import ProfileError

BUILTIN_DIR = REPO / "configs" / "profiles"

# One small check, so that a run the checks failed to stop ends in seconds
TINY = """\
name = "tiny"
description = "one small check"

[settings]
iters = 1
warmup = 0
baseline_tolerance = 0.05

[[check]]
name = "cluster all_reduce latency"
scope = "cluster"
command = "collective"
op = "all_reduce"
size = "4K"
metric = "time_us"
vs = "absolute"
fail = 90000
"""


def _edit(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


def _accept(tmp_path: Path, *args: str, option: str = "--profile") -> str:
    """`distbench accept ARGS --workers 2 --out tmp/out`, refused by `option` (in this
    process, where nothing can start): its one error line."""
    out = tmp_path / "out"
    proc = cli(tmp_path, "accept", *args, "--workers", "2", "--out", str(out))
    line = assert_one_line_error(proc, None, option, ours=True)
    assert not out.exists(), sorted(out.iterdir())
    return line


def _profile_file(tmp_path: Path, text: str, name: str = "mine.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return name


# ---------------------------------------------------------------------------------------------
# 1. A profile of one's own with a built-in's name

@pytest.mark.parametrize("name", ["cpu-gloo", "h100-sxm-8", "H100-SXM-8"])
def test_a_profile_named_like_a_builtin_is_refused(tmp_path, name):
    """The verdict, accept.md and accept.json name the profile: a file of one's own named
    h100-sxm-8 would be reported as the built-in, with other floors."""
    line = _accept(tmp_path, "--profile",
                   _profile_file(tmp_path, _edit(TINY, 'name = "tiny"', f'name = "{name}"')))
    builtin = name.lower()
    # docs/accept-profiles.md quotes this line
    assert (f"--profile: mine.toml: key 'name': {name!r} is the name of a built-in profile "
            f"({BUILTIN_DIR / builtin}.toml)") in line, line
    assert "a name of its own" in line


def test_a_profile_named_auto_is_refused(tmp_path):
    line = _accept(tmp_path, "--profile",
                   _profile_file(tmp_path, _edit(TINY, 'name = "tiny"', 'name = "auto"')))
    assert line.startswith("distbench: error: --profile: mine.toml: key 'name': 'auto' "), line
    assert "what --profile auto means" in line, line


def test_only_a_builtins_own_file_carries_its_name(tmp_path):
    for name in profile_files.available():
        assert profile_files.resolve(str(BUILTIN_DIR / f"{name}.toml")).name == name
    copy = tmp_path / "h100-sxm-8.toml"
    copy.write_text((BUILTIN_DIR / "h100-sxm-8.toml").read_text())
    with pytest.raises(ProfileError, match="is the name of a built-in profile"):
        profile_files.resolve(str(copy))
    copy.write_text(TINY)  # the file's name is not the profile's
    assert profile_files.resolve(str(copy)).name == "tiny"


# ---------------------------------------------------------------------------------------------
# 2. Sizes against the element size and the ranks

def test_a_size_of_no_whole_element_is_refused(tmp_path):
    """size = "3" of float32 used to load, and be skipped at run time on every target."""
    line = _accept(tmp_path, "--profile",
                   _profile_file(tmp_path, _edit(TINY, 'size = "4K"', 'size = "3"')))
    # docs/accept-profiles.md quotes this line
    assert ("mine.toml: check 'cluster all_reduce latency' key 'size': \"3\" is 3 B, not a whole "
            "number of float32 elements (4 B each): give a multiple of 4, such as 4") in line


def test_a_size_is_a_whole_number_of_the_checks_elements(tmp_path):
    path = tmp_path / "x.toml"
    for dtype, size, ok in [("float32", "6", False), ("float32", "8", True), ("bf16", "3", False),
                            ("bf16", "2", True), ("float64", "12", False), ("int8", "3", True),
                            ("int64", "4K", True)]:
        path.write_text(_edit(_edit(TINY, 'size = "4K"', f'size = "{size}"'),
                              'op = "all_reduce"', f'op = "all_reduce"\ndtype = "{dtype}"'))
        if ok:
            assert profile_files.load(path).checks[0].size > 0
        else:
            with pytest.raises(ProfileError, match=r"key 'size': .* not a whole number of "):
                profile_files.load(path)


def test_element_sizes_are_torchs():
    import torch

    from distbench.ops.torch_dtypes import TORCH_DTYPES

    for dtype in DTYPES:
        assert dtypes.element_bytes(dtype) == torch.empty(
            0, dtype=TORCH_DTYPES[dtype]).element_size(), dtype


SPLIT = _edit(_edit(TINY, 'op = "all_reduce"', 'op = "all_gather"'), 'size = "4K"', 'size = "16"')


def test_a_split_size_too_small_for_the_workers_is_refused(tmp_path):
    """all_gather splits its buffer into one 16-byte block per rank: 16 B leaves each of 2
    ranks nothing, and every target would be skipped."""
    line = _accept(tmp_path, "--profile", _profile_file(tmp_path, SPLIT))
    # docs/accept-profiles.md quotes this line
    assert ("mine.toml: check 'cluster all_reduce latency' key 'size': 16 B is too small for "
            "all_gather of float32 on 2 ranks (a cluster check on 2 local workers, one machine)"
            ": it splits the buffer into one 16-byte aligned block per rank, so it needs at "
            "least 32 B") in line, line


def test_a_dry_run_holds_the_sizes_to_the_cluster_it_plans(tmp_path):
    node = _edit(_edit(SPLIT, 'scope = "cluster"', 'scope = "node"'), 'size = "16"', 'size = "48"')
    mine = _profile_file(tmp_path, node)
    line = _accept(tmp_path, "--profile", mine, "--dry-run", "--nodes", "2",
                   "--gpus-per-node", "4")
    assert ("16-byte aligned block per rank, so it needs at least 64 B" in line
            and "on 4 ranks (a node check on --nodes 2 --gpus-per-node 4)" in line), line
    fits = cli(tmp_path, "accept", "--profile", mine, "--dry-run", "--nodes", "4",
               "--gpus-per-node", "2", dispatch=True)
    assert fits.returncode == 0, fits.stderr
    assert fits.stdout.splitlines()[-1].startswith("plan: "), fits.stdout


def test_sizes_against_the_ranks_each_scope_runs_on(tmp_path):
    path = tmp_path / "x.toml"
    path.write_text(_edit(SPLIT, 'size = "16"', 'size = "64"'))
    cluster = profile_files.load(path)
    profile_toml.check_sizes(cluster, 4, None, "4 ranks")  # 16 B a rank
    with pytest.raises(ProfileError, match="on 8 ranks .* at least 128 B"):
        profile_toml.check_sizes(cluster, 8, None, "8 ranks")
    path.write_text(_edit(_edit(SPLIT, 'size = "16"', 'size = "64"'), 'scope = "cluster"',
                          'scope = "pair"'))
    pair = profile_files.load(path)
    profile_toml.check_sizes(pair, 64, None, "a launch")  # ranks per node unknown: 2 at least
    profile_toml.check_sizes(pair, 4, 4, "one node")  # one node: no pair runs
    with pytest.raises(ProfileError, match="on 8 ranks"):
        profile_toml.check_sizes(pair, 16, 4, "4 nodes")


# ---------------------------------------------------------------------------------------------
# 3. check = "x": say what is wrong, and what is right

def test_a_check_written_after_a_table_is_named_where_it_landed(tmp_path):
    """TOML puts a key written after [settings] into [settings]: the file has no top-level
    `check`, and "key 'check': missing" sent the operator looking for what is there."""
    line = _accept(tmp_path, "--profile",
                   _profile_file(tmp_path, TINY.split("[[check]]")[0] + 'check = "x"\n'))
    # docs/accept-profiles.md quotes this line
    assert ("mine.toml: [settings] key 'check': not a key of [settings] (valid: iters, warmup, "
            "baseline_tolerance): a key written after [settings] belongs to it; 'check' goes at "
            "the top, before the first table, and checks are [[check]] tables") in line, line


def test_a_check_that_is_no_table_says_what_it_got(tmp_path):
    text = 'check = "x"\n' + TINY.split("[[check]]")[0]
    line = _accept(tmp_path, "--profile", _profile_file(tmp_path, text))
    # docs/accept-profiles.md quotes this line
    assert ("mine.toml: key 'check': must be [[check]] tables, one per check (keys: name, "
            "scope, command, op, pattern, dtype, size, metric, vs, fail, warn, fail_no_nvls, "
            "warn_no_nvls, floors_by_nodes), got \"x\"") in line, line


def test_a_malformed_floors_by_nodes_row_is_refused_before_any_worker(tmp_path):
    """Issue 30: a cluster check's floors by node count, one row out of order: one line
    naming the row and the key, exit 2, no worker and no run directory."""
    rows = ("[[check.floors_by_nodes]]\nnodes = 4\nfail = 90000\n\n"
            "[[check.floors_by_nodes]]\nnodes = 2\nfail = 90000\n")
    text = _edit(TINY, "fail = 90000\n", "\n" + rows)
    line = _accept(tmp_path, "--profile", _profile_file(tmp_path, text))
    # docs/accept-profiles.md quotes this line
    assert ("mine.toml: check 'cluster all_reduce latency' floors_by_nodes row 2 key 'nodes': "
            "2 after 4: list the rows by node count, ascending, each count once") in line, line


# ---------------------------------------------------------------------------------------------
# 4. Control characters

@pytest.mark.parametrize("char", ["\\u0000", "\\u001b", "\\t", "\\u007f", "\\u2028"])
def test_a_control_character_in_a_check_name_is_refused(tmp_path, char):
    """A NUL in a check's name went into accept.csv; an escape sequence would reach the
    console."""
    text = _edit(TINY, 'name = "cluster all_reduce latency"',
                 f'name = "cluster all_reduce{char}latency"')
    line = _accept(tmp_path, "--profile", _profile_file(tmp_path, text))
    code = char[2:].upper().rjust(4, "0") if char != "\\t" else "0009"
    assert "mine.toml: check 1 key 'name': must be printable text, got 'cluster all_reduce" \
        in line and f"with the control character U+{code}" in line, line


def test_a_control_character_in_the_description_is_refused(tmp_path):
    path = tmp_path / "x.toml"
    path.write_text(_edit(TINY, 'description = "one small check"',
                          'description = "one\\u0000check"'))
    with pytest.raises(ProfileError, match=r"key 'description': must be printable text, got "
                       r"'one\\x00check', with the control character U\+0000"):
        profile_files.load(path)


# ---------------------------------------------------------------------------------------------
# 5. A --profile that is no profile file

def test_dev_null_is_a_device_not_a_missing_file(tmp_path):
    line = _accept(tmp_path, "--profile", "/dev/null")
    # docs/accept-profiles.md quotes this line
    assert "--profile: '/dev/null' is a character device, not a profile file" in line, line


def test_a_directory_is_a_directory(tmp_path):
    (tmp_path / "site").mkdir()
    line = _accept(tmp_path, "--profile", "site")
    assert line.startswith("distbench: error: --profile: 'site' "), line
    assert "is a directory" in line and "not a profile file" in line, line


def test_an_empty_file_is_empty(tmp_path):
    line = _accept(tmp_path, "--profile", _profile_file(tmp_path, "# nothing yet\n"))
    assert line.startswith("distbench: error: --profile: mine.toml: "), line
    assert "empty" in line and "no TOML key" in line and "not a profile" in line, line


def test_a_config_file_is_not_a_profile(tmp_path):
    line = _accept(tmp_path, "--profile", _profile_file(tmp_path, "[accept]\nworkers = 2\n"))
    assert line.startswith("distbench: error: --profile: mine.toml: not a profile"), line
    assert "('accept')" in line, line  # its own keys: what shows it is a config file
    valid = line.partition("(valid: ")[2].partition(")")[0]
    assert set(valid.split(", ")) == {"name", "description", "match", "settings", "check"}, line


# ---------------------------------------------------------------------------------------------
# 6. A baseline with figures no run measures

def _baseline(tmp_path: Path, **row) -> Path:
    run = tmp_path / "base"
    run.mkdir(parents=True)
    good = {"check": "cluster all_reduce latency", "scope": "cluster", "target": "cluster",
            "command": "collective", "op": "all_reduce", "dtype": "float32",
            "metric": "time_us", "measured": 2000.0, "verdict": "PASS", "retest": False,
            "wrong": 0, "spread": 0.2}
    # json.dumps writes NaN and Infinity, as Python's json reads them
    (run / "accept.json").write_text(json.dumps({"verdicts": [good, {**good, **row}]}))
    return run


@pytest.mark.parametrize("key,value,shown", [
    ("measured", float("nan"), "NaN"), ("measured", -5.0, "-5.0"), ("measured", 0, "0"),
    ("measured", float("inf"), "Infinity"), ("measured", "fast", '"fast"'),
    ("spread", float("nan"), "NaN"), ("spread", -0.5, "-0.5"),
])
def test_a_baseline_with_a_figure_no_run_measures_is_refused(tmp_path, key, value, shown):
    """A NaN baseline passed every check held to it: NaN compares false either way."""
    base = _baseline(tmp_path, target="vm#1", **{key: value})
    mine = _profile_file(tmp_path, TINY)
    line = _accept(tmp_path, "--profile", mine, "--baseline", "base", option="--baseline")
    bound = "above 0" if key == "measured" else "at least 0"
    path = base.relative_to(tmp_path) / "accept.json"
    assert line.startswith(f"distbench: error: --baseline: {path}: verdicts[1] "), line
    assert "'cluster all_reduce latency' on 'vm#1'" in line and f"key {key!r}" in line, line
    assert f"finite number {bound}" in line and f"got {shown}" in line, line


def test_read_baseline_refuses_a_nan_and_reads_a_good_file(tmp_path):
    with pytest.raises(ValueError, match=r"verdicts\[1\] .* key 'measured': must be a finite "
                       r"number above 0, got NaN"):
        read_baseline(_baseline(tmp_path / "nan", target="vm#1", measured=float("nan")))
    base = _baseline(tmp_path, target="vm#1", measured=2500.0, spread=None)
    got = read_baseline(base)
    assert got.figures == {("cluster all_reduce latency", "cluster"): 2000.0,
                           ("cluster all_reduce latency", "vm#1"): 2500.0}
    assert got.spreads == {("cluster all_reduce latency", "cluster"): 0.2}
