"""An acceptance stopped halfway, for real: Ctrl-C, a timeout, a worker killed, a node's torchrun
agent killed. accept.csv keeps the rows of every check finished before the stop (each check's
rows are written before the next check starts), and accept.json says how the run ended, as
run.json does, which checks finished and which one was in progress. And accept.json's progress
without a run. The tests that start processes: test_accept_stops_multiproc.py."""

from __future__ import annotations

import json
import threading
from dataclasses import replace

from accept_helpers import CHECKS, PROFILE, _accept_json
from runs import accept_in_progress

from distbench.kinds.accept import files, verdicts
from distbench.results import writer


def _end(record: writer.RunRecord, progress: files.AcceptFiles, status: str, code: int,
         error: str) -> None:
    """As Session._end ends a run: run.json finished, then its on_end hooks (accept's is
    progress.ended)."""
    record.finish(status, code, error)
    progress.ended(status, code, error)


def _first_check_judged() -> verdicts.Judged:
    check = PROFILE.checks[0]  # node all_reduce latency, against a floor
    measured = [verdicts.Result(check, name, (i,), 2, time_us=1000.0, wrong=0)
                for i, name in enumerate("ab")]
    return verdicts.judge(measured, replace(PROFILE, checks=PROFILE.checks[:1]), ["a", "b"])


def test_accept_json_says_how_far_a_run_got_and_how_it_ended(tmp_path):
    """Written from the start; the run's ending, said by whichever thread ends the run (the
    watchdog's on a timeout) once run.json is finished, is accept.json's too."""
    progress, record = accept_in_progress(tmp_path)
    acc = _accept_json(tmp_path)
    assert (acc["status"], acc["verdict"], acc["exit_code"]) == ("running", None, None)
    assert (acc["checks_done"], acc["check_in_progress"]) == ([], None)
    # the summary's form is what docs/results.md quotes for accept.json
    assert acc["summary"] == f"running: 0 of {len(CHECKS)} checks done"
    progress.begin(CHECKS[0])
    progress.finished(CHECKS[0], _first_check_judged())
    progress.begin(CHECKS[1])
    acc = _accept_json(tmp_path)
    assert acc["summary"] == f"running: 1 of {len(CHECKS)} checks done, {CHECKS[1]} in progress"
    assert [v["target"] for v in acc["verdicts"]] == ["a", "b"]
    ending = threading.Thread(target=_end, args=(record, progress, "timeout", 3,
                                                 "timed out after 5 s"))
    ending.start()
    ending.join()
    acc = _accept_json(tmp_path)
    assert (acc["status"], acc["verdict"], acc["exit_code"]) == ("timeout", None, 3)
    assert (acc["checks_done"], acc["check_in_progress"]) == (CHECKS[:1], CHECKS[1])
    assert acc["summary"] == (f"timeout: 1 of {len(CHECKS)} checks done, {CHECKS[1]} in "
                              "progress (timed out after 5 s)")
    assert json.loads((tmp_path / "run.json").read_text())["status"] == "timeout"
    assert (tmp_path / "accept.md").read_text().startswith("# Acceptance: timeout, unfinished")


def test_a_concluded_run_keeps_its_verdict_whatever_ends_it(tmp_path):
    progress, record = accept_in_progress(tmp_path)
    judged = _first_check_judged()
    progress.conclude(judged)
    status, code, line = judged.outcome(False)
    acc = _accept_json(tmp_path)
    assert (acc["status"], acc["exit_code"], acc["summary"]) == (status, code, line)
    assert acc["verdict"] == files.VERDICT_WORDS[code]
    assert record.data["accept"]["verdict"] == acc["verdict"]
    _end(record, progress, "failed", 3, "cannot write the comparison")
    acc = _accept_json(tmp_path)
    assert (acc["status"], acc["exit_code"], acc["verdict"]) == ("failed", 3,
                                                                 files.VERDICT_WORDS[code])
