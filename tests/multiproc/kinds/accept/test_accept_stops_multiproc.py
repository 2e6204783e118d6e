"""An acceptance stopped halfway, for real: Ctrl-C, a timeout, a worker killed, a node's torchrun
agent killed; accept.csv and accept.json keep what was finished. In-process:
test_accept_stops.py."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from accept_helpers import CHECKS, _accept_json
from helpers import clean_env, free_port, power_off, processes_naming, start, torchrun_agent

# cpu-gloo's third check, node all_gather busbw, is the first to reach 64 KiB (whole buffer)
AT_64K = CHECKS.index("node all_gather busbw")


# its sixth, pair p2p ring busbw, the only one at 256 KiB
AT_256K = CHECKS.index("pair p2p ring busbw")


def _wait_for_check(out: Path, check: str, procs: list[subprocess.Popen],
                    seconds: float = 90) -> Path:
    """The run directory, once accept.json says `check` is in progress."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for run_dir in out.glob("*-accept"):
            acc = _accept_json(run_dir)
            if acc is not None and acc["check_in_progress"] == check:
                return run_dir
        for p in procs:
            assert p.poll() is None, p.communicate()
        time.sleep(0.1)
    for p in procs:
        p.kill()
    raise AssertionError(f"{check} never started")


def _rows(run_dir: Path) -> list[dict]:
    with open(run_dir / "accept.csv", newline="") as f:
        return list(csv.DictReader(f))


def _assert_stopped_at(run_dir: Path, k: int, status: str, code: int) -> dict:
    """accept.json and run.json agree on how the run ended; the checks before the k-th are done
    and in accept.csv, each with its rows, and nothing of the k-th or later."""
    meta = json.loads((run_dir / "run.json").read_text())
    acc = _accept_json(run_dir)
    assert (meta["status"], meta["exit_code"]) == (status, code), meta
    assert (acc["status"], acc["exit_code"], acc["verdict"]) == (status, code, None), acc
    assert acc["checks_done"] == CHECKS[:k] and acc["check_in_progress"] == CHECKS[k], acc
    assert acc["checks_total"] == len(CHECKS)
    assert acc["summary"].startswith(f"{status}: {k} of {len(CHECKS)} checks done, "
                                     f"{CHECKS[k]} in progress"), acc["summary"]
    rows = _rows(run_dir)
    assert [r["check"] for r in rows if r["retest"] == "0"] == [
        c for c in CHECKS[:k] for _ in range(len(acc["nodes"]) if c.startswith("node") else 1)]
    assert [(r["check"], r["target"], r["verdict"]) for r in rows] == [
        (v["check"], v["target"], v["verdict"]) for v in acc["verdicts"]]
    assert any(r["measured"] for r in rows)  # measured rows, not only skipped ones
    md = (run_dir / "accept.md").read_text()
    assert md.startswith(f"# Acceptance: {status}, unfinished\n"), md[:200]
    assert not list(run_dir.glob("*.tmp"))
    return acc


def _no_process_left(out: Path) -> None:
    deadline = time.monotonic() + 15
    # a forked launcher and its workers run in out's parent (helpers.start)
    while processes_naming(out.parent) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_naming(out.parent) == [], "a process outlived the run"


def _self_launched(out: Path, *args: str, **env: str) -> subprocess.Popen:
    return start(["accept", "--workers", "2", *args, "--out", str(out)], out.parent,
                 clean_env(**env), new_session=True)


@pytest.mark.procs(3)
def test_ctrl_c_keeps_the_checks_done_and_says_how_far_it_got(tmp_path):
    """Rank 1 stalls at 64 KiB, so the run sits, deterministically, in the third check with two
    done; Ctrl-C (SIGINT to the whole process group, as a terminal sends it) ends it."""
    out = tmp_path / "out"
    proc = _self_launched(out, "--timeout", "120", DISTBENCH_TEST_STALL="1:65536")
    run_dir = _wait_for_check(out, CHECKS[AT_64K], [proc])
    time.sleep(1)  # into its measurement
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=90)
    assert proc.returncode == 130, stderr
    _assert_stopped_at(run_dir, AT_64K, "interrupted", 130)
    assert "Traceback" not in stderr, stderr
    _no_process_left(out)


@pytest.mark.procs(3)
def test_a_timeout_ends_accept_json_as_run_json(tmp_path):
    """The watchdog's thread ends a stalled run, not the main one (blocked in a collective):
    accept.json says timeout all the same."""
    out = tmp_path / "out"
    proc = _self_launched(out, "--timeout", "5", DISTBENCH_TEST_STALL="1:65536")
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 3, stderr
    (run_dir,) = out.iterdir()
    acc = _assert_stopped_at(run_dir, AT_64K, "timeout", 3)
    assert "timed out after" in acc["summary"], acc["summary"]
    _no_process_left(out)


@pytest.mark.procs(3)
def test_a_dead_worker_keeps_the_checks_done(tmp_path):
    """Rank 1 is SIGKILLed in the third check."""
    out = tmp_path / "out"
    proc = _self_launched(out, "--timeout", "60", DISTBENCH_TEST_DIE="1:65536")
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 3, stderr
    (run_dir,) = out.iterdir()
    acc = _assert_stopped_at(run_dir, AT_64K, "failed", 3)
    assert "rank 1 " in acc["summary"] and "died" in acc["summary"], acc["summary"]
    meta = json.loads((run_dir / "run.json").read_text())
    assert [x["rank"] for x in meta["lost_ranks"]] == [1]
    _no_process_left(out)


@pytest.mark.procs(6)  # two agents of two workers
def test_a_killed_node_keeps_the_checks_done(tmp_path):
    """Two torchrun agents of two workers (two nodes, so node and pair checks measure); rank 3
    stalls in the pair ring check, the sixth, and its node loses power there: its agent and both
    its workers are SIGKILLed at once. The other node's ranks end the run, name both lost ranks,
    and rank 0 says how far it got."""
    out = tmp_path / "out"
    out.mkdir()
    port = free_port()
    agents = [torchrun_agent(
        ["--nnodes", "2", "--nproc-per-node", "2", "--node-rank", str(i), "--master-addr",
         "127.0.0.1", "--master-port", str(port), "-m", "distbench", "accept", "--timeout", "60",
         "--out", str(out)], clean_env(DISTBENCH_TEST_STALL="3:262144"), out) for i in range(2)]
    run_dir = _wait_for_check(out, CHECKS[AT_256K], agents)
    time.sleep(1)
    power_off(agents[1].pid)
    agents[1].communicate(timeout=30)
    _, stderr = agents[0].communicate(timeout=120)
    assert agents[0].returncode != 0, stderr
    acc = _assert_stopped_at(run_dir, AT_256K, "failed", 3)
    assert len(acc["nodes"]) == 2
    meta = json.loads((run_dir / "run.json").read_text())
    assert {x["rank"] for x in meta["lost_ranks"]} == {2, 3}, meta["error"]
    _no_process_left(out)
