"""watch's options: bad input is one line and exit 2, before any worker and with nothing on
disk; a baseline is read from an earlier watch run, and --npd's codes are the plugin's."""

from __future__ import annotations

import json

import pytest
from helpers import assert_one_line_error, refused, resolved

from distbench.core.exitcodes import EXIT_BELOW, EXIT_FAILED, EXIT_INCONCLUSIVE, EXIT_OK
from distbench.kinds.watch.body import exit_code
from distbench.kinds.watch.options import probes_of
from distbench.kinds.watch.probe_baseline import read_baseline
from distbench.kinds.watch.records import Probe


@pytest.mark.parametrize("args,option", [
    (["--interval", "0"], "--interval"),
    (["--interval", "nan"], "--interval"),
    (["--agree", "6", "--last", "5"], "--agree"),
    (["--sizes", "2G"], "--sizes"),
    (["--once", "--count", "3"], "--once"),
    (["--textfile", "distbench.txt"], "--textfile"),
    (["--textfile", "/no/such/dir/distbench.prom"], "--textfile"),
    (["--baseline", "no-such-run"], "--baseline"),
    (["--baseline", ""], "--baseline"),
    (["--op", "all_reduce,nope"], "--op"),
    (["--tolerance", "10"], "--tolerance"),
    (["--profile", "no-such-profile"], "--profile"),
    (["--profile", "cpu-gloo", "--sizes", "1M"], "--profile"),
])
def test_bad_watch_input_is_one_line_exit_2_and_nothing_on_disk(tmp_path, in_process, args,
                                                                 option):
    res = in_process("watch", *args)
    assert_one_line_error(res, None, option, ours=True)
    assert list(tmp_path.iterdir()) == []


def test_an_interval_longer_than_the_timeout_is_taken(tmp_path):
    """The ranks sleep on the host between cycles, in no collective --timeout would end (it was
    refused while they waited in a broadcast)."""
    opts = resolved(tmp_path, "watch", "--interval", "400", "--timeout", "300")
    assert (opts.interval, opts.timeout) == (400.0, 300.0)


def test_a_baseline_is_each_probes_median_over_an_earlier_watch(tmp_path):
    cycles = [{"probes": [{"op": "all_reduce", "size_bytes": 1024, "scope": "cluster",
                           "status": "ok", "time_us": t}]} for t in (100.0, 300.0, 200.0)]
    cycles.append({"probes": [{"op": "all_reduce", "size_bytes": 1024, "scope": "cluster",
                               "status": "failed", "time_us": 9999.0}]})
    (tmp_path / "watch.jsonl").write_text("\n".join(json.dumps(c) for c in cycles) + "\n")
    [(key, (median, noise))] = read_baseline(tmp_path).items()
    assert key == "all_reduce/1024/cluster" and median == 200.0  # the failed cycle left out
    assert noise == pytest.approx(280.0 / 120.0 - 1)  # p90 over p10, inclusive quantiles


def test_a_baseline_that_is_not_a_watch_run_is_refused_in_one_line(tmp_path, in_process):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "watch.jsonl").write_text("{not json\n")
    res = in_process("watch", "--baseline", str(tmp_path / "run"))
    assert_one_line_error(res, None, "--baseline", ours=True)
    assert "line 1" in res.stderr


@pytest.mark.parametrize("code,npd", [(EXIT_OK, 0), (EXIT_BELOW, 1), (EXIT_INCONCLUSIVE, 2),
                                      (EXIT_FAILED, 2), (2, 2)])
def test_npd_gets_its_own_codes_and_other_runs_keep_distbenchs(code, npd):
    from distbench.kinds.watch.options import WatchOptions

    assert exit_code(WatchOptions(npd=True), code) == npd
    assert exit_code(WatchOptions(), code) == code


# --- issue 45 ---------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["10", "0", "-1", "nan"])
def test_tolerance_refusals_state_the_real_bounds(tmp_path, value):
    line = refused(tmp_path, "watch", "--tolerance", value)
    assert "above 0 and below 10" in line, line


def test_a_textfile_that_names_an_existing_directory_is_refused(tmp_path):
    (tmp_path / "collector" / "distbench.prom").mkdir(parents=True)
    line = refused(tmp_path, "watch", "--textfile", str(tmp_path / "collector" / "distbench.prom"))
    assert line.startswith("distbench: error: --textfile:") and "directory" in line, line
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("key", ["baseline", "textfile"])
def test_a_number_in_a_config_is_no_path(tmp_path, key):
    (tmp_path / "5").mkdir()
    (tmp_path / "c.toml").write_text(f"{key} = 5\n")
    line = refused(tmp_path, "watch", "--config", str(tmp_path / "c.toml"))
    assert "wrong type" in line, line


def test_the_default_probes_are_one_all_reduce_of_1_mib_and_run_json_says_so(tmp_path):
    opts = resolved(tmp_path, "watch")
    assert probes_of(opts) == [Probe("all_reduce", 1 << 20, "cluster", "float32")]
    assert (opts.ops, opts.sizes, opts.dtype, opts.profile) == (["all_reduce"], [1 << 20],
                                                               "float32", None)


def test_sizes_are_counted_as_collective_counts_them():
    from distbench.core.options import option_fields
    from distbench.kinds.watch.options import WatchOptions

    helps = {spec.flag: spec.help for _, spec in option_fields(WatchOptions)}
    assert "as collective --sizes" in helps["sizes"] and "larger of" in helps["sizes"]


# --- --profile: the probes of an accept profile -----------------------------------------------

PROFILE = """\
name = "site-watch"
description = "what the site's watch probes"

[settings]
iters = 5
warmup = 1
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

[[check]]
name = "cluster all_reduce p99"
scope = "cluster"
command = "collective"
op = "all_reduce"
size = "4K"
metric = "p99_us"
vs = "absolute"
fail = 90000

[[check]]
name = "cluster all_gather busbw"
scope = "cluster"
command = "collective"
op = "all_gather"
dtype = "bf16"
size = "64K"
metric = "busbw_gbps"
vs = "absolute"
fail = 0.001

[[check]]
name = "node all_reduce busbw"
scope = "node"
command = "collective"
op = "all_reduce"
size = "1M"
metric = "busbw_gbps"
vs = "peers"
fail = 0.05

[[check]]
name = "cluster ring"
scope = "cluster"
command = "p2p"
pattern = "ring"
size = "256K"
metric = "busbw_gbps"
vs = "absolute"
fail = 0.001
"""


def test_a_profiles_cluster_collective_checks_are_the_probes(tmp_path):
    (tmp_path / "site.toml").write_text(PROFILE)
    opts = resolved(tmp_path, "watch", "--profile", str(tmp_path / "site.toml"))
    # one probe per measurement (two metrics of one all_reduce are one probe); node scope and
    # p2p are not what a watch cycle measures
    assert probes_of(opts) == [Probe("all_reduce", 4096, "cluster", "float32"),
                             Probe("all_gather", 65536, "cluster", "bfloat16")]
    builtin = resolved(tmp_path, "watch", "--profile", "cpu-gloo")
    assert probes_of(builtin) == [Probe("all_reduce", 4096, "cluster", "float32")]


def test_the_workers_get_the_profiles_probes_back_from_the_command_line(tmp_path):
    from distbench.core.options import to_argv

    opts = resolved(tmp_path, "watch", "--profile", "cpu-gloo", "--workers", "2")
    again = resolved(tmp_path, "watch", *to_argv(opts))
    assert probes_of(again) == probes_of(opts)


@pytest.mark.parametrize("args", [["--op", "all_gather"], ["--sizes", "64K"],
                                  ["--dtype", "float32"], ["--op", "all_reduce"]])
def test_a_profile_is_not_taken_with_explicit_probe_options(tmp_path, args):
    line = refused(tmp_path, "watch", "--profile", "cpu-gloo", *args)
    assert line.startswith("distbench: error: --profile:") and args[0] in line, line


@pytest.mark.parametrize("name,said", [
    ("generic-gpu", "no cluster-scope collective check"),  # node and pair checks only
    ("h100-sxm-8", "at most 1G"),  # its cluster check is 8 GiB: no per-cycle probe
    ("auto", "auto"),
    ("no-such-profile", "unknown profile"),
])
def test_a_profile_watch_cannot_probe_is_refused_in_one_line(tmp_path, name, said):
    line = refused(tmp_path, "watch", "--profile", name)
    assert line.startswith("distbench: error: --profile:") and said in line, line


def test_a_profile_whose_checks_differ_only_in_dtype_is_refused(tmp_path):
    text = PROFILE.replace('op = "all_gather"\ndtype = "bf16"', 'op = "all_reduce"\ndtype = '
                           '"bf16"').replace('size = "64K"', 'size = "4K"')
    (tmp_path / "two.toml").write_text(text)
    line = refused(tmp_path, "watch", "--profile", str(tmp_path / "two.toml"))
    assert "dtype" in line, line


def test_a_profiles_probes_take_an_accept_run_of_it_as_their_baseline(tmp_path):
    from watch_helpers import CPU_GLOO_ROWS, accept_run

    base = accept_run(tmp_path / "acc", CPU_GLOO_ROWS)
    opts = resolved(tmp_path, "watch", "--profile", "cpu-gloo", "--baseline", str(base),
                    "--workers", "2")
    assert read_baseline(base, probes_of(opts), 2) == {"all_reduce/4096/cluster": (226.9, 0.498)}
