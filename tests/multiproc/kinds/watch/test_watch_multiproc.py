"""`distbench watch` on real gloo workers: what it wrote (watch.jsonl, watch.csv, the textfile),
a planted straggler caught, an unchanged machine left quiet, stale state cleared when a rank or
the launcher dies, and --once within a health check's time."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from helpers import children, clean_env, distbench, processes_naming, start
from prometheus_client.parser import text_string_to_metric_families

# each run takes the slots it needs (helpers.distbench); a test that starts watch itself reserves
pytestmark = pytest.mark.multiproc

FAST = ("--sizes", "64K", "--iters", "10", "--timeout", "20")


def out_dir(tmp_path: Path, name: str = "out") -> Path:
    (tmp_path / name).mkdir()
    return tmp_path / name


def lines(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "watch.jsonl").read_text().splitlines()]


def prom(path: Path) -> dict[tuple[str, tuple], float]:
    """(sample name, sorted labels) -> value, as node_exporter would read the file."""
    out = {}
    for family in text_string_to_metric_families(path.read_text()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: dict, name: str, **labels) -> float | None:
    want = set(labels.items())
    found = [v for (n, lab), v in samples.items() if n == name and want <= set(lab)]
    return found[0] if len(found) == 1 else None


def _snapshots(textfile: Path, run) -> list[dict]:
    """Every distinct textfile seen while `run` (a thread) was alive, as the exporter reads it."""
    seen, last = [], None
    while run.is_alive():
        with contextlib.suppress(OSError, ValueError):
            text = textfile.read_text()
            if text != last:
                seen.append(prom(textfile))
                last = text
        time.sleep(0.05)
    return seen


def test_a_rank_slowed_from_cycle_3_is_named_within_k_cycles(tmp_path):
    """Slowed once the baseline is set, at 3 ranks (the rank slowed from the first cycle is
    named at 2, 3 and 4 below), with the textfile as the exporter reads it."""
    world = 3
    slow = world - 1
    textfile = tmp_path / "distbench.prom"
    result = []
    run = threading.Thread(target=lambda: result.append(distbench(
        out_dir(tmp_path), "watch", *FAST, "--interval", "0.3", "--count", "8", "--warm", "2",
        "--agree", "2", "--last", "3", "--workers", str(world), "--textfile", str(textfile),
        timeout=240, DISTBENCH_TEST_SLOW_RANK=f"{slow}:0.01", DISTBENCH_TEST_SLOW_FROM="3")))
    run.start()
    files = _snapshots(textfile, run)
    run.join()
    (res,) = result
    got = lines(res.run_dir)
    assert [x["cycle"] for x in got] == list(range(8))
    assert all(x["stragglers"] == [] for x in got[:3]), [x["stragglers"] for x in got]
    named = [x["cycle"] for x in got if slow in x["stragglers"]]
    assert named and named[0] <= 3 + 2 - 1, [(x["cycle"], x["stragglers"]) for x in got]
    assert all(x["stragglers"] in ([], [slow]) for x in got)  # nobody else
    assert got[2]["verdict"] == "ok" and got[-1]["verdict"] in ("warn", "fail"), got
    assert res.code == 4, res.stderr  # below expectation
    assert res.meta()["status"] == "below_expectation"
    # the textfile, as the exporter read it while the watch ran: the straggler named on its
    # rank alone, and a verdict that left ok
    named_files = [f for f in files if value(f, "distbench_straggler", rank=str(slow)) == 1]
    assert named_files, "no textfile named the straggler"
    assert all(value(f, "distbench_straggler", rank=str(r)) == 0
               for f in named_files for r in range(world) if r != slow)
    assert any(value(f, "distbench_verdict", state="ok") == 1 for f in files)
    assert value(files[-1], "distbench_verdict", state="ok") == 0
    # the run ended: the file no longer reads healthy
    assert value(prom(textfile), "distbench_up") == 0


def test_an_unchanged_machine_changes_no_state_in_30_cycles(tmp_path):
    """A/A: no warn, no fail, no straggler. benchmarks/watch_false_alarms.py counts it again
    over repeated runs."""
    res = distbench(out_dir(tmp_path), "watch", *FAST, "--interval", "0.2", "--count", "30",
                    "--workers", "2", timeout=240)
    got = lines(res.run_dir)
    assert len(got) == 30
    alarms = [(x["cycle"], x["changes"], x["stragglers"]) for x in got
              if x["stragglers"] or x["verdict"] in ("warn", "fail")]
    assert alarms == []
    assert got[-1]["verdict"] == "ok"
    assert res.code == 0, res.stderr
    with open(res.run_dir / "watch.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["cycle"]) for r in rows] == list(range(30))
    assert all(float(r["busbw_gbps"]) > 0 for r in rows)
    assert [float(r["time_us"]) for r in rows] == pytest.approx(
        [x["probes"][0]["time_us"] for x in got], rel=1e-5)


def test_once_judges_one_cycle_against_a_baseline_within_30_s(tmp_path):
    first = distbench(out_dir(tmp_path, "a"), "watch", *FAST, "--interval", "0.2", "--count", "5",
                      "--warm", "2", "--workers", "2", timeout=240)
    assert len(lines(first.run_dir)) == 5, first.stderr
    once = distbench(out_dir(tmp_path, "b"), "watch", *FAST, "--once", "--baseline",
                     str(first.run_dir), "--workers", "2", timeout=60)
    assert once.secs < 30, once.secs
    got = lines(once.run_dir)
    assert len(got) == 1 and got[0]["probes"][0]["baseline_us"] is not None
    assert got[0]["stragglers"] == []  # benchmarks/watch_health.py once: 30 healthy runs
    assert once.code == (0 if got[0]["verdict"] == "ok" else 4), once.stderr
    # no baseline: its one cycle is no baseline for itself, even with --warm 1
    npd = distbench(out_dir(tmp_path, "c"), "watch", *FAST, "--once", "--warm", "1", "--npd",
                    "--workers", "2", timeout=60)
    assert npd.code == 2, npd.stderr  # nothing to judge one cycle against: unknown
    assert lines(npd.run_dir)[0]["verdict"] == "unknown"
    assert npd.meta()["exit_code"] == 5  # distbench's own code for it: inconclusive
    message = [x for x in npd.stdout.splitlines() if x.strip()]
    assert len(message) == 1 and len(message[0]) <= 80, npd.stdout


def _start(out: Path, textfile: Path, world: int = 3) -> subprocess.Popen:
    out.mkdir()
    return start(["watch", *FAST, "--interval", "0.5", "--textfile", str(textfile),
                  "--workers", str(world), "--out", str(out)], out, clean_env(),
                 stdout=subprocess.DEVNULL, new_session=True)


def _until(what, seconds: float, why: str):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"{why} within {seconds} s")


def _kill_all(out: Path, launcher: subprocess.Popen) -> None:
    """Whatever a failed test left of a run under `out`: its processes and its launcher."""
    for pid in processes_naming(out):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
        launcher.kill()
        launcher.wait(timeout=10)


def _healthy(textfile: Path) -> bool:
    try:
        return value(prom(textfile), "distbench_up") == 1
    except (OSError, ValueError):
        return False


@pytest.mark.procs(4)  # a launcher and 3 workers
@pytest.mark.parametrize("victim", ["a rank", "the launcher"])
def test_the_textfile_stops_reading_healthy_when_a_rank_or_the_launcher_dies(tmp_path, victim):
    out, textfile = tmp_path / "out", tmp_path / "distbench.prom"
    launcher = _start(out, textfile)
    try:
        _until(lambda: _healthy(textfile), 90, "the textfile never read healthy")
        workers = children(launcher.pid)
        assert len(workers) == 3, workers
        killed = workers[1] if victim == "a rank" else launcher.pid
        os.kill(killed, signal.SIGKILL)
        # one interval plus --timeout (20 s), and the time a process takes to notice
        _until(lambda: not _healthy(textfile), 0.5 + 20 + 10, "the textfile still read healthy")
        samples = prom(textfile)
        assert value(samples, "distbench_up") == 0
        assert not any(n == "distbench_busbw_bytes_per_second" for n, _ in samples)
        _until(lambda: processes_naming(out) == [], 60, "processes were left")
    finally:
        _kill_all(out, launcher)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_a_rank_slowed_from_the_first_cycle_is_named_within_k_cycles(tmp_path, world):
    """10 ms late before every op from cycle 0, through the warm-up: the skew the warm-up
    learns cannot hide it (judge.LATE_CAP), so it is named within the first n cycles (k = 3 of
    n = 5; at the k-th on a quiet machine). 4 KiB: the op stays short beside the 10 ms at 4
    ranks on 2 busy cores, as a GPU's would."""
    slow = world - 1
    res = distbench(out_dir(tmp_path), "watch", "--sizes", "4K", "--iters", "10", "--timeout",
                    "20", "--interval", "0.3", "--count", "6", "--warm", "3", "--workers",
                    str(world), timeout=240, DISTBENCH_TEST_SLOW_RANK=f"{slow}:0.01")
    got = lines(res.run_dir)
    assert [x["cycle"] for x in got] == list(range(6)), res.stderr
    named = [x["stragglers"] for x in got]
    first = next((i for i, x in enumerate(named) if x == [slow]), None)
    assert first is not None and 2 <= first <= 4, named
    assert named[first:] == [[slow]] * (6 - first) and named[:first] == [[]] * first, named
    assert sum(x["probes"][0]["late_rank"] == slow for x in got) >= 5, got
    assert got[-1]["verdict"] in ("warn", "fail")
    assert res.code == 4, res.stderr
    assert f"stragglers: rank {slow} (" in res.stderr


def _ranks(run_dir: Path) -> list[dict] | None:
    try:
        return json.loads((run_dir / "run.json").read_text()).get("ranks")
    except (OSError, ValueError):  # not written yet, or being replaced
        return None


def _pids_by_rank(run_dir: Path, world: int) -> list[int]:
    ranks = _until(lambda: _ranks(run_dir), 60, "run.json never named its ranks")
    assert len(ranks) == world
    return [r["pid"] for r in sorted(ranks, key=lambda r: r["rank"])]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


@pytest.mark.procs(4)  # a launcher and 3 workers
@pytest.mark.parametrize("when", ["between cycles", "during a cycle"])
def test_sigterm_to_ranks_1_to_n_ends_every_rank_at_the_same_collective(tmp_path, when):
    """Ranks 1 and 2 are sent SIGTERM, rank 0 is not (as when a launcher stops its workers).
    Between cycles (a 30 s interval) every rank wakes and all leave within 2 s; during a cycle
    (cycles back to back, rank 0 slowed so each takes ~1 s) the cycle finishes first. Either way
    every rank posted the same collectives (tests/nccl_rules.py: on NCCL a rank that left
    alone would hang the others), run.json says the signal and the cycles measured, and the
    textfile says the watch ended as asked, its last verdict kept."""
    import nccl_rules

    from distbench.run.comm_trace import TRACE_ENV

    out, textfile, trace = tmp_path / "out", tmp_path / "distbench.prom", tmp_path / "trace"
    out.mkdir()
    trace.mkdir()
    interval, slow = (("30", {}) if when == "between cycles" else
                      ("0.1", {"DISTBENCH_TEST_SLOW_RANK": "0:0.05"}))
    launcher = start(["watch", *FAST, "--timeout", "60", "--warm", "1", "--interval", interval,
                      "--textfile",
                      str(textfile), "--workers", "3", "--out", str(out)], out,
                     clean_env(**{TRACE_ENV: str(trace)}, **slow), new_session=True)
    try:
        run_dir = _until(lambda: [p for p in out.iterdir() if p.is_dir()], 60, "no run dir")[0]
        pids = _pids_by_rank(run_dir, 3)
        _until(lambda: (run_dir / "watch.jsonl").is_file()
               and (run_dir / "watch.jsonl").read_text().count("\n") >= 1, 90, "no cycle")
        if when == "during a cycle":
            time.sleep(0.3)  # well inside the next cycle (each takes ~1 s)
        sent = time.monotonic()
        for pid in pids[1:]:
            os.kill(pid, signal.SIGTERM)
        _until(lambda: not any(_alive(p) for p in pids), 30, "ranks still ran")
        took = time.monotonic() - sent
        launcher.wait(timeout=30)
    finally:
        _kill_all(out, launcher)
    measured = lines(run_dir)
    if when == "between cycles":
        assert took < 2.0, took
        assert len(measured) == 1
    meta = json.loads((run_dir / "run.json").read_text())
    assert (meta["status"], meta["exit_code"]) == ("terminated", 143), meta
    cycles = f"{len(measured)} cycle" + ("s" if len(measured) > 1 else "")
    assert meta["error"].startswith(f"stopped by SIGTERM after {cycles}; watch verdict "), meta
    assert launcher.returncode == 143, launcher.stderr.read()
    traces = nccl_rules.read(trace)
    assert sorted(traces) == [0, 1, 2] and all(t.complete for t in traces.values())
    assert nccl_rules.check(trace) == []
    samples = prom(textfile)
    assert value(samples, "distbench_up") == 0 and value(samples, "distbench_ended") == 1
    last = measured[-1]["verdict"]
    assert value(samples, "distbench_last_verdict", state=last) == 1
    assert "stopped by SIGTERM after" in textfile.read_text()


def test_wrong_data_on_one_rank_fails_the_probe_within_k_cycles(tmp_path):
    """DISTBENCH_TEST_CORRUPT_RANK: rank 1's output is wrong in every cycle's check. A wrong
    probe needs no baseline to fail: fail-bad from its first cycle, fail at the k-th."""
    res = distbench(out_dir(tmp_path), "watch", *FAST, "--interval", "0.2", "--count", "3",
                    "--agree", "2", "--last", "3", "--workers", "2", timeout=120,
                    DISTBENCH_TEST_CORRUPT_RANK="1")
    got = lines(res.run_dir)
    assert [x["probes"][0]["status"] for x in got] == ["failed"] * 3
    assert all(x["probes"][0]["note"].endswith("wrong elements") for x in got)
    assert [x["verdict"] for x in got] == ["unknown", "fail", "fail"]
    assert res.code == 4 and "watch verdict fail" in res.stderr, res.stderr


def test_a_textfile_directory_removed_mid_run_is_said_and_the_watch_goes_on(tmp_path):
    where = tmp_path / "textfiles"
    where.mkdir()
    textfile = where / "distbench.prom"
    result = []
    run = threading.Thread(target=lambda: result.append(distbench(
        out_dir(tmp_path), "watch", *FAST, "--interval", "0.3", "--count", "6", "--workers", "2",
        "--textfile", str(textfile), timeout=120)))
    run.start()
    _until(lambda: _healthy(textfile), 60, "the textfile never read healthy")
    for p in where.iterdir():
        p.unlink()
    where.rmdir()
    run.join()
    (res,) = result
    assert [x["cycle"] for x in lines(res.run_dir)] == list(range(6))
    assert res.code == 5, res.stderr  # nothing judged in 6 cycles (--warm 20): not a failure
    assert f"cannot write the textfile {textfile}" in res.stderr
    assert "the watch goes on" in res.stderr


@pytest.mark.procs(3)  # a launcher and 2 workers
def test_a_stop_during_the_startup_is_a_deliberate_end_and_npd_says_unknown(tmp_path):
    """SIGTERM to the whole group as soon as the "starting" textfile appears (the probes still
    being built): the ranks note it and leave at the first boundary. The textfile says the
    watch ended as asked (an operator's stop raises no alert), run.json says terminated, and
    node-problem-detector gets its one line and "unknown" (2)."""
    out, textfile = tmp_path / "out", tmp_path / "distbench.prom"
    out.mkdir()
    launcher = start(["watch", *FAST, "--interval", "0.3", "--count", "50", "--npd",
                      "--textfile", str(textfile), "--workers", "2", "--out", str(out)], out,
                     clean_env(), new_session=True)
    try:
        _until(textfile.exists, 90, "no textfile")
        os.killpg(launcher.pid, signal.SIGTERM)
        stdout, stderr = launcher.communicate(timeout=60)
    finally:
        _kill_all(out, launcher)
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    meta = json.loads((run_dir / "run.json").read_text())
    assert (meta["status"], meta["exit_code"]) == ("terminated", 143), (meta, stderr)
    assert launcher.returncode == 2, stderr  # the plugin's unknown
    assert stdout.splitlines() == ["distbench: stopped by SIGTERM before a verdict"], stdout
    samples = prom(textfile)
    assert value(samples, "distbench_up") == 0 and value(samples, "distbench_ended") == 1


def test_a_duration_shorter_than_the_interval_ends_without_waiting_the_interval(tmp_path):
    res = distbench(out_dir(tmp_path), "watch", *FAST, "--interval", "60", "--duration", "1",
                    "--workers", "2", timeout=120)
    assert [x["cycle"] for x in lines(res.run_dir)] == [0]
    assert res.code == 5 and res.secs < 40, (res.secs, res.stderr)  # it slept 60 s
