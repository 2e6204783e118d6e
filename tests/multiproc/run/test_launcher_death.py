"""A launcher that dies never leaves its workers behind: SIGKILLed (as the OOM killer does) or
SIGTERMed, while its workers start, while they rendezvous or mid-run, every worker is gone
within lifeline's bound, none writes `ok`, and run.json says the run was terminated."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import children, clean_env, processes_naming, start, torchrun_agent

pytestmark = [pytest.mark.multiproc, pytest.mark.procs(4)]  # a launcher, 3 workers

GONE_WITHIN_S = 15  # the documented bound (docs/results.md, failure modes)
ARGS = ["collective", "--sizes", "1K,4K", "--iters", "3", "--warmup", "1", "--reps", "1",
        "--timeout", "120"]


def _run_json(out: Path) -> dict | None:
    found = list(out.glob("*/run.json"))
    return json.loads(found[0].read_text()) if found else None


def _alive(pid: int) -> bool:
    """Running, not a zombie (an orphan's new parent may be slow to reap it, or never)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _rows(out: Path) -> int:
    found = list(out.glob("*/collective.csv"))
    return len(found[0].read_text().splitlines()) - 1 if found else 0


def _connected(pid: int) -> bool:
    """The process holds a socket: a worker that has reached its process-group setup (a forked
    one inherits none; a fresh one opens none while it loads torch)."""
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(fd).startswith("socket:"):
                return True
    return False


class Phase:
    """When to kill the launcher. startup: its workers exist and load torch; rendezvous: rank 1
    never joins, and the others wait for it in process-group setup; running: a row is written
    and rank 1 stalls at 4 KiB; "2 s" and "6 s": that long after the command started."""

    ENV = {"rendezvous": {"DISTBENCH_TEST_STALL_JOIN": "1"},
           "running": {"DISTBENCH_TEST_STALL": "1:4096"}}

    def __init__(self, name: str):
        self.name = name
        self.started = time.monotonic()
        self.workers_seen: float | None = None

    def reached(self, launcher: int, out: Path) -> bool:
        now = time.monotonic()
        if self.name.endswith(" s"):
            return now - self.started >= float(self.name.split()[0])
        if self.name == "running":
            return _rows(out) >= 1
        workers = children(launcher)
        if len(workers) < 3:
            return False
        if self.name == "startup":
            return True
        # ranks 0 and 2 (torch loaded, where they had to load it) wait for rank 1, a moment on
        if sum(_connected(w) for w in workers) < 2:
            return False
        self.workers_seen = self.workers_seen or now
        return now - self.workers_seen > 1


def _start(out: Path, phase: Phase, how: str) -> subprocess.Popen:
    """how: torchrun (its agent), self (our launcher, forked workers) or exec (our launcher,
    fresh interpreters: the GPU path)."""
    args = [*ARGS, "--sizes", "1K:1M:x2", "--iters", "400"] if phase.name.endswith(" s") \
        else ARGS  # still running at 6 s
    env = {**Phase.ENV.get(phase.name, {}), **({"DISTBENCH_FORK_WORKERS": "0"}
                                                 if how == "exec" else {})}
    if how == "torchrun":
        return torchrun_agent(["--standalone", "--nproc-per-node", "3", "-m", "distbench",
                               *args, "--out", str(out)], clean_env(**env), out.parent,
                              stdout=subprocess.DEVNULL, new_session=True)
    # killed before or while its workers load torch: a fresh interpreter, whose start that is
    return start([*args, "--workers", "3", "--out", str(out)], out.parent, clean_env(**env),
                 stdout=subprocess.DEVNULL, new_session=True,
                 fresh=phase.name in ("startup", "2 s"))


CASES = [(phase, signal.SIGKILL, "self") for phase in ("2 s", "6 s")] + [
    (phase, signum, "self") for phase in ("startup", "rendezvous", "running")
    for signum in (signal.SIGKILL, signal.SIGTERM)] + [
    (phase, signal.SIGKILL, "exec") for phase in ("rendezvous", "running")] + [
    (phase, signal.SIGKILL, "torchrun") for phase in ("startup", "rendezvous", "running")]
NAMES = {"self": "self-launched", "exec": "self-launched-exec", "torchrun": "torchrun-agent"}


# Killed at a time: a neighbour's load moves how far the start-up got by then, which only picks
# another phase, each of which holds the same promise (the phases are also taken on purpose).
@pytest.mark.parametrize("phase,signum,how", [
    pytest.param(p, s, h, id=f"{NAMES[h]}-{s.name}-at-{p.replace(' ', '')}")
    for p, s, h in CASES])
def test_no_worker_outlives_its_launcher(tmp_path, phase, signum, how):
    torchrun = how == "torchrun"
    out = tmp_path / "out"
    when = Phase(phase)
    launcher = _start(out, when, how)
    try:
        deadline = time.monotonic() + 90
        while not when.reached(launcher.pid, out):
            assert launcher.poll() is None, launcher.communicate()
            assert time.monotonic() < deadline, f"{phase} never came"
            time.sleep(0.05)
        workers = children(launcher.pid)
        launcher.send_signal(signum)
        killed_at = time.monotonic()
        launcher.wait(timeout=60)
        # a worker still exiting has already given up its command line: wait for it too
        while (processes_naming(out.parent) or any(_alive(w) for w in workers)) \
                and time.monotonic() - killed_at < 30:
            time.sleep(0.2)
        took = time.monotonic() - killed_at
        left = processes_naming(out.parent)
        assert left == [], f"{left} still alive 30 s after the launcher's {signum.name}"
        assert took < GONE_WITHIN_S, f"its workers took {took:.1f} s to go"
        assert workers or phase.endswith(" s")  # at 2 s, torch may still be loading
        assert [w for w in workers if _alive(w)] == []
    finally:
        for pid in processes_naming(out.parent):  # never leave one behind, whatever failed
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    meta = _run_json(out)
    if meta is None:
        # under torchrun rank 0 makes the directory: killed before it could. A launcher of its
        # own makes it once torch has loaded (about 2 s here), then starts its workers: killed
        # at 2 s it may have done neither, and leaves nothing
        assert (torchrun and phase in ("startup", "rendezvous")) or (
            not torchrun and phase == "2 s" and not workers), (phase, workers)
        assert not list(out.glob("*")), list(out.glob("*"))
        return
    if not workers and signum == signal.SIGKILL:
        # killed before it started a worker: no process is left to say how the run ended
        assert meta["status"] in ("running", "terminated"), meta
        return
    assert meta["status"] == "terminated", (meta["status"], meta.get("error"))
    assert meta["exit_code"] == 143, meta
    if phase == "running":
        assert _rows(out) == 1  # the row measured before is kept
