"""tests/forkserver.py, the suite's way of starting `distbench`: a run it forks ends as a fresh
interpreter's run of the same command line ends, is killed at its timeout as subprocess.run kills
one, and is seen by the orphan check while it runs. A whole run forked against a fresh one:
test_forked_workers; its stdin: test_collective_multiproc's `--config /dev/stdin` run."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import threading
import time

import forkserver
import helpers
import pytest
from helpers import processes_naming, rows_written


def _both(tmp_path, *args):
    return [helpers.distbench(tmp_path / how / "out", *args, cwd=tmp_path, fresh=fresh)
            for how, fresh in (("forked", False), ("fresh", True))]


@pytest.mark.multiproc
def test_a_refused_command_line_ends_forked_as_it_ends_fresh(tmp_path):
    forked, fresh = _both(tmp_path, "collective", "--sizes", "1Q")
    assert forked.code == fresh.code == 2
    assert forked.stderr == fresh.stderr and forked.stdout == fresh.stdout
    assert not (tmp_path / "forked").exists() and not (tmp_path / "fresh").exists()


@pytest.mark.multiproc
def test_a_forked_run_past_its_timeout_is_killed_and_seen_by_the_orphan_check(tmp_path):
    """As subprocess.run does: the launcher killed, TimeoutExpired raised with what it printed.
    Its workers then follow their launcher (platform/lifeline.py). While it runs, the orphan
    check (conftest's no_orphans) finds it in the directory it runs in, though its command line
    is the server's."""
    seen: list[list[int]] = []
    raised: list[BaseException] = []

    def watch():
        try:
            helpers.distbench(tmp_path / "out", "watch", "--interval", "0.5", "--sizes", "1K",
                              "--iters", "2", "--workers", "2", cwd=tmp_path, timeout=5)
        except BaseException as e:  # noqa: BLE001 - what the run raised is the test's subject
            raised.append(e)

    thread = threading.Thread(target=watch)
    thread.start()
    while thread.is_alive() and not seen:
        if found := processes_naming(tmp_path):
            seen.append(found)
        time.sleep(0.1)
    thread.join(60)
    assert not thread.is_alive()
    assert seen, "no process of the run was found running in its directory"
    assert len(raised) == 1 and isinstance(raised[0], subprocess.TimeoutExpired), raised
    assert b"distbench" in (raised[0].stderr or b""), raised[0].stderr  # undecoded, as run's
    # what it had said, its processes' stacks with it, is in the test's failure
    (note,) = raised[0].__notes__
    assert note.startswith("its stderr when it timed out:\n") and "distbench" in note, note
    assert "(most recent call first)" in note, note
    deadline = time.monotonic() + 15
    while processes_naming(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_naming(tmp_path) == []


@pytest.mark.multiproc
@pytest.mark.procs(3)
def test_a_started_run_is_signalled_and_waited_for_as_a_fresh_one_is(tmp_path):
    """helpers.start, forked (forkserver.Popen) and fresh (subprocess.Popen), for the tests that
    signal a launcher: in a session of its own from the moment its pid is known, running until
    signalled, then ending with the same code, what it printed read by communicate, and no
    process of it left."""
    ended = {}
    for how, fresh in (("forked", False), ("fresh", True)):
        where = tmp_path / how
        where.mkdir()
        proc = helpers.start(["watch", "--interval", "0.5", "--sizes", "1K", "--iters", "2",
                              "--workers", "2", "--out", str(where / "out")], where,
                             helpers.clean_env(), new_session=True, fresh=fresh)
        assert os.getpgid(proc.pid) == proc.pid, how
        # a cycle measured: running
        helpers.wait_for(functools.partial(rows_written, where / "out", "watch.csv"), 60, proc)
        assert len(helpers.children(proc.pid)) == 2, how
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.1)
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
        assert proc.poll() == proc.returncode is not None
        ended[how] = (proc.returncode, [x.split(":")[1] for x in helpers.distbench_lines(stderr)
                                        if x.startswith("distbench: error:")])
        assert stdout is not None and "distbench" in stderr, (how, stderr)
        deadline = time.monotonic() + 15
        while processes_naming(where) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert processes_naming(where) == [], how
    assert ended["forked"] == ended["fresh"] and ended["forked"][0] == 130, ended


@pytest.mark.multiproc
@pytest.mark.procs(3)
def test_a_run_asked_for_its_stacks_writes_each_process_s_and_goes_on(tmp_path):
    """forkserver.say_stacks, which a run past its timeout gets before it is killed: the
    launcher and both forked workers write every thread's stack to the run's stderr, and the
    run goes on until it is stopped, then ends as it would have."""
    proc = helpers.start(["watch", "--interval", "0.5", "--sizes", "1K", "--iters", "2",
                          "--workers", "2", "--out", str(tmp_path / "out")], tmp_path,
                         helpers.clean_env(), new_session=True)
    try:
        rows = helpers.wait_for(lambda: rows_written(tmp_path / "out", "watch.csv"), 60, proc)
        assert forkserver.say_stacks(proc.pid) == 3
        helpers.wait_for(  # still measuring
            lambda: rows_written(tmp_path / "out", "watch.csv") >= rows + 2, 60, proc)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    stacks = stderr.split("(most recent call first)")[1:]
    # each worker's main thread in watch's loop, forked by torch's agent; the launcher's main
    # thread in that agent, watching them
    forked = [s for s in stacks if "_become_worker" in s]
    assert sum("distbench/kinds/watch/loop.py" in s for s in forked) == 2, stderr
    assert any("elastic/agent/server/api.py" in s for s in stacks if s not in forked), stderr


@pytest.mark.multiproc
@pytest.mark.procs(1)
def test_a_process_that_cannot_write_its_stacks_is_not_asked(tmp_path):
    """An exec'd interpreter (a torchrun agent's worker) has no handler for the stacks signal,
    whose default would kill it: say_stacks passes over it, and it runs on."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], cwd=tmp_path)
    try:
        time.sleep(0.2)
        assert forkserver.say_stacks(proc.pid) == 0
        time.sleep(0.2)
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait(10)
