"""How a run ends, decided in session.run, without a process group: each outcome of the body
(a real signal included) maps to its exit code and run.json status. Fast: one rank, faked
start, os._exit turned into SystemExit."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
import torch
import torch.distributed as dist

from distbench import session
from distbench.commands.collective import CollectiveOptions
from distbench.options import build
from distbench.runtime import RunFailure, Runtime


@pytest.fixture
def one_rank(monkeypatch, tmp_path):
    rt = Runtime(0, 1, 0, "gloo", torch.device("cpu"),
                 ranks=[{"rank": 0, "host": "h", "node": 0, "local_rank": 0, "device": "cpu"}])
    monkeypatch.setattr(session, "start", lambda *a: rt)
    monkeypatch.setattr(dist, "barrier", lambda *a, **k: None)
    monkeypatch.setattr(dist, "destroy_process_group", lambda *a, **k: None)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda *a, **k: 0)

    def exit_(code):
        raise SystemExit(code)
    monkeypatch.setattr(session.os, "_exit", exit_)
    monkeypatch.delenv("DISTBENCH_RUN_DIR", raising=False)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)}
    yield build(CollectiveOptions, {"out": str(tmp_path)}, argv=[])
    for s, h in handlers.items():
        signal.signal(s, h)


def _run(opts, body) -> tuple[int, dict]:
    with pytest.raises(SystemExit) as exc:
        session.run("collective", opts, body)
    (run_json,) = opts.out.glob("*/run.json")
    return exc.value.code, json.loads(run_json.read_text())


def _signal_self(signum):
    def body(s):
        os.kill(os.getpid(), signum)
        time.sleep(5)  # the handler interrupts this
        return 0
    return body


@pytest.mark.parametrize("body,code,status", [
    (lambda s: 0, 0, "ok"),
    (lambda s: 1, 1, "wrong"),
    (lambda s: (_ for _ in ()).throw(RunFailure("x", status="slow_links", exit_code=4)), 4,
     "slow_links"),
    (lambda s: (_ for _ in ()).throw(ValueError("boom")), 3, "failed"),
    (lambda s: (_ for _ in ()).throw(KeyboardInterrupt()), 130, "interrupted"),
    (_signal_self(signal.SIGINT), 130, "interrupted"),
    (_signal_self(signal.SIGTERM), 143, "terminated"),
    (_signal_self(signal.SIGHUP), 129, "terminated"),
    (_signal_self(signal.SIGQUIT), 131, "terminated"),
], ids=["ok", "wrong", "slow-links", "error", "keyboard-interrupt", "sigint", "sigterm",
        "sighup", "sigquit"])
def test_each_ending_has_its_code_and_status(one_rank, body, code, status):
    got_code, meta = _run(one_rank, body)
    assert (got_code, meta["status"], meta["exit_code"]) == (code, status, code)
    assert meta["end_utc"]
    if code in (129, 131, 143):
        assert signal.Signals(code - 128).name in meta["error"]
