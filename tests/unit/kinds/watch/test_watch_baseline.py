"""watch --baseline (issue 45): a baseline that cannot be used is one line and exit 2 before any
worker starts and before anything is written, --npd included; a baseline is keyed by what it
measured (op, size, dtype, world size), so one measured otherwise is refused instead of read as
a slowdown; a watch killed mid-write still serves as a baseline; and an accept run is a
baseline too, each probe taking the time of the accept check that measured the same thing.
The tests that start processes: test_watch_baseline_multiproc.py."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from helpers import cli, refused, resolved
from watch_helpers import CPU_GLOO_ROWS, MIB, accept_row, accept_run, probe_line, watch_run

from distbench.kinds.watch.options import probes_of
from distbench.kinds.watch.probe_baseline import read_baseline
from distbench.kinds.watch.records import Probe

AR_1M = Probe("all_reduce", MIB, "cluster", "float32")


def nothing_written(tmp_path: Path) -> None:
    assert not (tmp_path / "results").exists() and not (tmp_path / "out").exists()


# --- A: every bad baseline, one line and exit 2, nothing written ----------------------------

@pytest.mark.parametrize("content,said", [
    (b'{"probes": [1]}\n', "line 1"),  # was an AttributeError traceback, exit 1
    (b'{"probes": 5}\n', "line 1"),
    (b'[1, 2]\n', "line 1"),
    (b'\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe\n', "line 1"),  # was a UnicodeDecodeError
    (b'{"probes": [{"op": "all_reduce", "size_bytes": "1M", "scope": "cluster", '
     b'"status": "ok", "time_us": 5}]}\n', "size_bytes"),
])
def test_a_baseline_that_is_not_a_watch_run_is_one_line(tmp_path, content, said):
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "watch.jsonl").write_bytes(content)
    line = refused(tmp_path, "watch", "--baseline", str(tmp_path / "base"))
    assert line.startswith("distbench: error: --baseline:") and said in line, line
    nothing_written(tmp_path)


@pytest.mark.parametrize("spoil,said", [
    (lambda d: (d / "run.json").write_text("{"), "run.json: unreadable"),
    (lambda d: (d / "run.json").write_text("[]"), "run.json: not an object"),
    (lambda d: (d / "run.json").write_text('{"command": "collective", "world_size": 2}'),
     "a 'collective' run's"),
    (lambda d: (d / "run.json").write_text('{"command": "watch", "world_size": 3}'),
     "2 rank times, where run.json says 3 ranks"),
    (lambda d: (d / "watch.jsonl").write_text(
        json.dumps({"schema_version": 99, "probes": [probe_line()]}) + "\n"),
     "schema_version 99"),
])
def test_a_run_directory_that_contradicts_itself_is_refused(tmp_path, spoil, said):
    """A corrupt run.json, another command's, a world size its own lines contradict, or lines of
    a schema this distbench does not read: no baseline to trust (each was taken silently)."""
    base = watch_run(tmp_path / "base")
    spoil(base)
    line = refused(tmp_path, "watch", "--baseline", str(base))
    assert line.startswith("distbench: error: --baseline:") and said in line, line
    nothing_written(tmp_path)


def test_a_fifo_where_watch_jsonl_should_be_is_refused_not_read(tmp_path):
    """Reading it would wait forever for a writer."""
    base = tmp_path / "base"
    base.mkdir()
    os.mkfifo(base / "watch.jsonl")
    line = refused(tmp_path, "watch", "--baseline", str(base))
    assert "watch.jsonl is not a regular file" in line, line
    nothing_written(tmp_path)


@pytest.mark.parametrize("bad", ["NaN", "Infinity", "-Infinity", "-5", "0", "null", "true"])
def test_a_measured_time_no_run_measures_is_refused_with_its_line(tmp_path, bad):
    base = watch_run(tmp_path / "base")
    good = json.dumps({"cycle": 3, "probes": [probe_line(time_us=100.0)]})
    broken = good.replace('"time_us": 100.0', f'"time_us": {bad}', 1)
    assert broken != good
    with (base / "watch.jsonl").open("a") as f:
        f.write(broken + "\n" + good + "\n")
    line = refused(tmp_path, "watch", "--baseline", str(base))
    assert "line 4" in line and "time_us" in line and "above 0" in line, line
    nothing_written(tmp_path)


def test_a_torn_last_line_is_skipped_but_a_corrupt_one_in_the_middle_is_not(tmp_path):
    # a watch killed mid-write leaves its last line cut short, with no newline after it
    torn = watch_run(tmp_path / "torn", tail='{"cycle": 3, "probes": [{"op": "all_re')
    assert read_baseline(torn)[AR_1M.key][0] == 105.0
    resolved(tmp_path, "watch", "--baseline", str(torn))
    middle = watch_run(tmp_path / "middle")
    lines = (middle / "watch.jsonl").read_text().splitlines(keepends=True)
    lines.insert(1, '{"cycle": 1, "probes": [{"op": "all_re\n')
    (middle / "watch.jsonl").write_text("".join(lines))
    line = refused(tmp_path, "watch", "--baseline", str(middle))
    assert "line 2" in line, line
    # a cut multi-byte character is a torn line too, not a binary file
    cut = watch_run(tmp_path / "cut", tail="")
    with (cut / "watch.jsonl").open("ab") as f:
        f.write('{"note": "\u00e9'.encode()[:-1])
    assert read_baseline(cut)[AR_1M.key][0] == 105.0


def test_a_baseline_of_only_a_torn_line_says_so(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    (base / "watch.jsonl").write_text('{"cycle": 0, "probes": [{"op"')
    line = refused(tmp_path, "watch", "--baseline", str(base))
    assert "measured nothing" in line and "cut short" in line, line


def test_a_baseline_at_other_sizes_is_refused_before_any_worker(tmp_path):
    """A health check whose --sizes changed: was found only after the workers started (exit 3,
    a run directory left, the error printed by every rank)."""
    base = watch_run(tmp_path / "base", [[probe_line(size=64 << 10)]] * 3)
    line = refused(tmp_path, "watch", "--sizes", "1M", "--baseline", str(base))
    assert "all_reduce 64 KiB" in line and "all_reduce 1 MiB" in line, line
    line = refused(tmp_path, "watch", "--op", "all_gather", "--sizes", "64K", "--baseline",
                   str(base))
    assert "no probe in common" in line, line
    nothing_written(tmp_path)


def test_a_baseline_that_measured_more_probes_than_this_watch_is_read_for_those_it_has(tmp_path):
    base = watch_run(tmp_path / "base", [[probe_line(size=MIB, time_us=100.0),
                                          probe_line(size=64 << 10, time_us=20.0)]] * 3)
    opts = resolved(tmp_path, "watch", "--sizes", "1M", "--baseline", str(base))
    assert read_baseline(base, probes_of(opts), 2) == {AR_1M.key: (100.0, 0.0)}


def test_a_probe_the_baseline_lacks_is_warned_of_and_refused_under_once(tmp_path):
    base = watch_run(tmp_path / "base")
    res = cli(tmp_path, "watch", "--sizes", "1M,64K", "--baseline", str(base), "--workers", "2")
    assert res.code == 0 and len(res.dispatched) == 1, res.stderr
    [warning] = res.stderr.splitlines()
    assert warning.startswith("distbench: warning:") and "all_reduce 64 KiB" in warning, warning
    line = refused(tmp_path, "watch", "--once", "--sizes", "1M,64K", "--baseline", str(base))
    assert "--once" in line and "all_reduce 64 KiB" in line, line
    nothing_written(tmp_path)


# --- B: keyed by world size and dtype ---------------------------------------------------------

def test_a_baseline_measured_on_another_world_size_is_refused(tmp_path):
    """4 ranks against a 2-rank baseline printed "7.10x the baseline ... verdict ok"."""
    base = watch_run(tmp_path / "base", world=2)
    line = refused(tmp_path, "watch", "--baseline", str(base), "--workers", "3")
    assert "2 ranks" in line and "3" in line, line
    resolved(tmp_path, "watch", "--baseline", str(base), "--workers", "2")
    # without run.json the lines say it: every rank's time is there
    lines_only = watch_run(tmp_path / "lines", world=None)
    refused(tmp_path, "watch", "--baseline", str(lines_only), "--workers", "3")
    nothing_written(tmp_path)


def test_the_world_a_launcher_started_is_checked_as_the_options_are(tmp_path):
    from distbench.core.options import OptionError
    from distbench.kinds.watch.options import WatchOptions

    base = watch_run(tmp_path / "base", world=2)
    opts = WatchOptions(baseline=str(base))
    opts.validate()
    opts.check_world(2)
    with pytest.raises(OptionError, match="2 ranks"):
        opts.check_world(4)  # what build and the session call with WORLD_SIZE under torchrun


def test_a_baseline_in_another_dtype_is_refused(tmp_path):
    base = watch_run(tmp_path / "base")
    line = refused(tmp_path, "watch", "--dtype", "bfloat16", "--baseline", str(base))
    assert "float32" in line and "bfloat16" in line, line
    # an older line without dtype: run.json's options say it
    old = watch_run(tmp_path / "old", [[{k: v for k, v in probe_line().items() if k != "dtype"}]],
                    dtype="float16")
    line = refused(tmp_path, "watch", "--baseline", str(old))
    assert "float16" in line, line
    nothing_written(tmp_path)


# --- --npd: the one stdout line, and its code -------------------------------------------------

def test_under_npd_a_bad_baseline_is_one_stdout_line_and_unknown(tmp_path):
    base = watch_run(tmp_path / "base", [[probe_line(size=64 << 10)]] * 3)
    res = cli(tmp_path, "watch", "--once", "--npd", "--sizes", "1M", "--baseline", str(base))
    assert res.code == 2 and res.dispatched == [], res.stderr  # node-problem-detector: unknown
    [message] = res.stdout.splitlines()
    assert len(message) <= 80 and message.startswith("distbench: bad input:"), message
    [line] = res.stderr.splitlines()
    assert line.startswith("distbench: error: --baseline:"), line
    res = cli(tmp_path, "watch", "--once", "--npd", "--textfile", str(tmp_path))
    assert res.code == 2 and len(res.stdout.splitlines()) == 1, res.stdout
    nothing_written(tmp_path)


@pytest.mark.parametrize("bad", [["--interval", "0"], ["--sizes", "lots"], ["--no-such-flag"]])
def test_under_npd_any_refusal_is_one_stdout_line(tmp_path, bad):
    """Refused by an option's own check or by the parser, before the options object exists:
    node-problem-detector still gets its one line."""
    res = cli(tmp_path, "watch", "--once", "--npd", *bad)
    assert res.code == 2 and res.dispatched == [], res.stderr
    [message] = res.stdout.splitlines()
    assert len(message) <= 80 and message.startswith("distbench: bad input:"), message
    assert len(res.stderr.splitlines()) == 1, res.stderr
    plain = cli(tmp_path, "watch", "--once", *bad)
    assert plain.code == 2 and plain.stdout == ""
    nothing_written(tmp_path)


# --- C: an accept run as the baseline ---------------------------------------------------------


def test_an_accept_run_is_a_baseline_for_the_probes_its_checks_measured(tmp_path):
    base = accept_run(tmp_path / "acc", CPU_GLOO_ROWS)
    probes = [Probe("all_reduce", 4096), Probe("all_reduce", MIB), Probe("all_gather", 65536)]
    # the cluster check's row before the node check's of the same collective on the same ranks
    assert read_baseline(base, probes, 2) == {"all_reduce/4096/cluster": (226.9, 0.498),
                                              "all_reduce/1048576/cluster": (2655.4, 3.96),
                                              "all_gather/65536/cluster": (1959.4, 1.75)}
    opts = resolved(tmp_path, "watch", "--sizes", "4K", "--baseline", str(base), "--workers", "2")
    assert read_baseline(base, probes_of(opts), 2) == {"all_reduce/4096/cluster": (226.9, 0.498)}


def test_an_accept_row_that_failed_was_wrong_or_was_a_retest_is_no_baseline(tmp_path):
    base = accept_run(tmp_path / "acc", [
        accept_row("a", "cluster", "all_reduce", 4096, 2, 100.0, 0.1, "FAIL"),
        accept_row("a", "cluster", "all_reduce", 4096, 2, 200.0, 0.1, retest=True),
        accept_row("b", "cluster", "all_reduce", 4096, 2, 300.0, 0.1, wrong=7),
        accept_row("c", "cluster", "all_reduce", MIB, 2, 400.0, None)])
    assert read_baseline(base, [Probe("all_reduce", 4096), AR_1M], 2) == {
        AR_1M.key: (400.0, None)}


def test_an_accept_run_is_refused_where_no_check_measured_a_probe_here(tmp_path):
    base = accept_run(tmp_path / "acc", CPU_GLOO_ROWS)
    line = refused(tmp_path, "watch", "--sizes", "8K", "--baseline", str(base))
    assert "no probe in common" in line and "all_reduce 4 KiB" in line, line
    # a node check measured on part of the accept run's ranks is no cluster probe's baseline
    four = accept_run(tmp_path / "four", [
        accept_row("n", "node", "all_reduce", 4096, 2, 9.0, 0.1),
        accept_row("c", "cluster", "all_reduce", MIB, 4, 9.0, 0.1)], world=4)
    line = refused(tmp_path, "watch", "--sizes", "4K", "--baseline", str(four), "--workers", "2")
    assert "no probe in common" in line, line
    nothing_written(tmp_path)


def test_an_accept_run_on_another_world_size_or_dtype_is_refused(tmp_path):
    base = accept_run(tmp_path / "acc", CPU_GLOO_ROWS)
    line = refused(tmp_path, "watch", "--sizes", "4K", "--baseline", str(base), "--workers", "3")
    assert "2 ranks" in line, line
    line = refused(tmp_path, "watch", "--sizes", "4K", "--dtype", "float64", "--baseline",
                   str(base))
    assert "float32" in line and "float64" in line, line
    nothing_written(tmp_path)


@pytest.mark.parametrize("key,value", [("time_us", math.nan), ("time_us", -3.0),
                                       ("time_us", math.inf), ("spread", -0.5),
                                       ("spread", math.nan), ("time_us", "fast")])
def test_an_accept_run_with_a_figure_no_run_measures_is_refused(tmp_path, key, value):
    row = accept_row("cluster all_reduce latency", "cluster", "all_reduce", 4096, 2, 226.9, 0.5)
    row[key] = value
    base = accept_run(tmp_path / "acc", [row])
    line = refused(tmp_path, "watch", "--sizes", "4K", "--baseline", str(base))
    assert "accept.json" in line and key in line, line


@pytest.mark.parametrize("text", ["{", "[]", '{"verdicts": 3}', '{"verdicts": [7]}',
                                  '{"verdicts": [{"op": "all_reduce"}]}'])
def test_an_accept_json_that_is_not_one_is_refused_in_one_line(tmp_path, text):
    (tmp_path / "acc").mkdir()
    (tmp_path / "acc" / "accept.json").write_text(text)
    line = refused(tmp_path, "watch", "--baseline", str(tmp_path / "acc"))
    assert "accept.json" in line, line


def test_a_directory_that_is_neither_run_is_named_so(tmp_path):
    (tmp_path / "other").mkdir()
    line = refused(tmp_path, "watch", "--baseline", str(tmp_path / "other"))
    assert "watch.jsonl" in line and "accept.json" in line, line
