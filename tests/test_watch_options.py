"""watch's options: bad input is one line and exit 2, before any worker and with nothing on
disk; a baseline is read from an earlier watch run, and --npd's codes are the plugin's."""

from __future__ import annotations

import json

import pytest
from helpers import assert_one_line_error

from distbench.cli.commands.watch import exit_code
from distbench.core.exitcodes import EXIT_BELOW, EXIT_FAILED, EXIT_INCONCLUSIVE, EXIT_OK
from distbench.watch.probe_baseline import read_baseline


@pytest.mark.parametrize("args,option", [
    (["--interval", "0"], "--interval"),
    (["--interval", "400"], "--interval"),  # not shorter than --timeout's 300
    (["--agree", "6", "--last", "5"], "--agree"),
    (["--sizes", "2G"], "--sizes"),
    (["--once", "--count", "3"], "--once"),
    (["--textfile", "distbench.txt"], "--textfile"),
    (["--textfile", "/no/such/dir/distbench.prom"], "--textfile"),
    (["--baseline", "no-such-run"], "--baseline"),
    (["--op", "all_reduce,nope"], "--op"),
])
def test_bad_watch_input_is_one_line_exit_2_and_nothing_on_disk(tmp_path, in_process, args,
                                                                 option):
    res = in_process("watch", *args)
    assert_one_line_error(res, None, option, ours=True)
    assert list(tmp_path.iterdir()) == []


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
    from distbench.cli.commands.watch import WatchOptions

    assert exit_code(WatchOptions(npd=True), code) == npd
    assert exit_code(WatchOptions(), code) == code
