"""Shared by the multi-process tests: run distbench the way users do and read what it wrote;
and the suite's process budget, which every test that starts a process draws on."""

from __future__ import annotations

import contextlib
import csv
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import forkserver
import json_schemas
from paths import REPO

T = TypeVar("T")

# The most processes the tests may have started at once on the shared test machine (launchers,
# workers, agents, a `python -c`), whichever tests run them and however many pytest processes
# run the tests (pytest-xdist): each one is a slot of a pool kept in lock files (SLOTS_DIR).
MAX_PROCESSES = 8
# Machine-wide, not per pytest run: two suites run at once on this machine share the budget.
SLOTS_DIR = Path(tempfile.gettempdir()) / f"distbench-test-slots-{os.getuid()}"
SLOT_WAIT_S = 1800  # a test waits this long for slots at most (others' runs end far sooner)


class _Budget:
    """This pytest process's part of the pool: what the running test may do and holds."""

    lock = threading.Lock()
    test: str | None = None  # the running test's id; None outside a test (pytest's own work)
    may_start = False  # the running test is marked multiproc
    reserved = 0  # slots the running test took up front (its procs(n) mark)
    held = 0  # slots held right now, its reservation included
    waited = 0.0  # seconds the running test waited for slots or for an `alone` test to end


def _open(name: str) -> int:
    SLOTS_DIR.mkdir(exist_ok=True)
    return os.open(SLOTS_DIR / name, os.O_RDWR | os.O_CREAT, 0o600)


def _take(n: int) -> list[int]:
    """n free slots, as locked descriptors (a lock dies with its process: a killed test frees
    its slots). One taker at a time, in turn (the gate), so a test that needs all 8 is not
    starved by a stream of small ones."""
    assert 1 <= n <= MAX_PROCESSES, f"{n} processes at once: more than {MAX_PROCESSES}"
    gate = _open("gate")
    start = time.monotonic()
    try:
        fcntl.flock(gate, fcntl.LOCK_EX)
        while True:
            got = []
            for i in range(MAX_PROCESSES):
                fd = _open(f"slot{i}")
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                got.append(fd)
                if len(got) == n:
                    return got
            for fd in got:
                os.close(fd)
            assert time.monotonic() - start < SLOT_WAIT_S, \
                f"no {n} process slots free in {SLOT_WAIT_S} s"
            time.sleep(0.05)
    finally:
        os.close(gate)
        with _Budget.lock:
            _Budget.waited += time.monotonic() - start


@contextlib.contextmanager
def processes(n: int) -> Iterator[None]:
    """Hold n slots of the pool while the block starts and waits for up to n processes. A test
    that reserved its slots up front (procs(n)) draws on them instead: never waiting for more
    while holding some, no two tests can wait on each other."""
    if _Budget.reserved:
        assert n <= _Budget.reserved, (
            f"{_Budget.test} starts {n} processes at once but reserved {_Budget.reserved}: "
            f"mark it procs({n})")
        yield
        return
    fds = _take(n)
    with _Budget.lock:
        _Budget.held += n
    try:
        yield
    finally:
        with _Budget.lock:
            _Budget.held -= n
        for fd in fds:
            os.close(fd)


@contextlib.contextmanager
def running_test(nodeid: str, may_start: bool, procs: int, alone: bool) -> Iterator[None]:
    """Around one test, setup to teardown (conftest): while a test marked `alone` runs, no other
    test does, here or in another pytest process (its timing is the behaviour under test, and
    would otherwise depend on what runs beside it); a test marked procs(n) holds n slots
    throughout."""
    room, turnstile = _open("room"), _open("turnstile")
    _Budget.waited = 0.0
    try:
        # the turnstile keeps new tests out while an `alone` one waits for the room to empty
        start = time.monotonic()
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        if not alone:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        fcntl.flock(room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        fcntl.flock(turnstile, fcntl.LOCK_UN)
        _Budget.waited = time.monotonic() - start
        fds = _take(procs) if procs else []
        _Budget.test, _Budget.may_start = nodeid, may_start
        _Budget.reserved = _Budget.held = procs
        try:
            yield
        finally:
            _Budget.test, _Budget.may_start = None, False
            _Budget.reserved = _Budget.held = 0
            for fd in fds:
                os.close(fd)
    finally:
        os.close(room)
        os.close(turnstile)


def check_may_start(what: str) -> None:
    """Called before any process starts in a pytest process (conftest hooks subprocess and
    multiprocessing): only a test marked multiproc starts one, and only within its slots."""
    if _Budget.test is None:
        return  # pytest's own (pytest-xdist starting its workers)
    assert _Budget.may_start, (
        f"{_Budget.test} starts a process ({what}) but is not marked multiproc: `make "
        f"test-fast` would run it")
    assert _Budget.held, (
        f"{_Budget.test} starts a process ({what}) outside the suite's process budget: start "
        f"it through helpers.distbench or torchrun_nodes, or mark the test procs(n)")


def waited() -> float:
    """How long the running test has waited for slots, and for an `alone` test to end."""
    return _Budget.waited


LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK",
                 "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID")


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a process a test starts. Its GPUs are hidden unless the test says
    otherwise: the suite's runs are CPU runs, and on a GPU machine `--backend auto` would be
    NCCL, one GPU a worker (on the first H100, the world-of-3 runs were refused: "3 workers
    need a GPU each; 1 visible")."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS and
           not k.startswith("DISTBENCH_")}
    env.update(NO_COLOR="1", PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="", **extra)
    return env


def debian_tool(name: str, unpacked: Path, make_target: str) -> tuple[Path | None, str]:
    """A tool a Debian package brings (promtool, prometheus-node-exporter): on PATH, or as
    `make <make_target>` unpacks it under .cache (`unpacked`); else None and why there is
    none, for the test's skip."""
    found = shutil.which(name)
    if found:
        return Path(found), ""
    if os.access(unpacked, os.X_OK):
        return unpacked, ""
    where = unpacked.relative_to(REPO)
    return None, (f"no {name}: not on PATH nor at {where} (`make "
                  f"{make_target}` fetches Debian's package with apt-get download)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str
    out: Path
    secs: float = 0.0  # from start to exit (a fresh run's: the interpreter's start-up included)
    # in-process (cli): the (command, options) dispatch was handed, where workers would start
    dispatched: list = field(default_factory=list)

    @property
    def returncode(self) -> int:  # as subprocess says it, for assert_one_line_error
        return self.code

    @property
    def run_dirs(self) -> list[Path]:
        return sorted(p for p in self.out.iterdir() if p.is_dir())

    @property
    def run_dir(self) -> Path:
        dirs = self.run_dirs
        assert len(dirs) == 1, f"expected one run directory, found {dirs}\n{self.stderr}"
        return dirs[0]

    def rows(self, name: str = "collective.csv") -> list[dict]:
        with open(self.run_dir / name, newline="") as f:
            return list(csv.DictReader(f))

    def meta(self) -> dict:
        return json.loads((self.run_dir / "run.json").read_text())


# Commands that run in the one process, starting no worker (topo, outside a launcher).
ALONE = ("report", "compare", "topo", "--help", "-h")


def processes_of(args: tuple[str, ...] | list[str]) -> int:
    """The most processes `distbench *args` starts at once, launcher included: its workers
    (--workers, else 2 on CPU) and itself, or itself alone."""
    if not args or args[0] in ALONE or "--help" in args or "--dry-run" in args:
        return 1
    workers = 2
    for i, arg in enumerate(args):
        given = args[i + 1] if arg == "--workers" and i + 1 < len(args) else \
            arg.partition("=")[2] if arg.startswith("--workers=") else None
        if given is not None:
            workers = int(given) if given.isdigit() else 0  # not a count: refused at once
    return workers + 1


# The commands whose runs the suite holds to NCCL's rules (nccl_rules.py), whatever the test
# asserts itself: every rank's posts are recorded (distbench.run.comm_trace) and checked once the
# run has ended, and a run that ended well must hold no process group but the default one.
TRACED = ("step", "plan", "pp", "p2p", "accept", "dp", "tp", "collective", "watch")
# The last traced run's posts, by rank (nccl_rules.read), for a test that asserts on them.
LAST_TRACES: dict = {}


@contextlib.contextmanager
def nccl_rules_held(command: str | None, env: dict[str, str]) -> Iterator[None]:
    """Around a run of `command` started with `env`: its ranks' posts recorded, then checked."""
    if command not in TRACED:
        yield
        return
    import nccl_rules

    from distbench.run.comm_trace import TRACE_ENV

    where = Path(tempfile.mkdtemp(prefix="distbench-trace-"))
    env[TRACE_ENV] = str(where)
    try:
        yield
        LAST_TRACES.clear()
        LAST_TRACES.update(nccl_rules.read(where))
        problems = nccl_rules.check(where)
        assert not problems, f"distbench {command} broke NCCL's rules:\n" + "\n".join(problems)
        leaked = nccl_rules.leaked_groups(where)
        assert not leaked, (f"distbench {command} ended holding process groups beside the "
                            f"default one, by rank: {leaked}")
    finally:
        shutil.rmtree(where, ignore_errors=True)


def _outs(args) -> list[Path]:
    """Where a command line writes besides the directory it starts in: its --out."""
    args = [str(a) for a in args]
    return [Path(v) for a, v in zip(args, args[1:], strict=False) if a == "--out"] + [
        Path(a.partition("=")[2]) for a in args if a.startswith("--out=")]


# Set, every run starts a fresh interpreter, as a user's does (forkserver.py says what else
# differs): to check that the suite does not depend on the fork server.
FRESH_ENV = "DISTBENCH_TEST_FRESH"


def _fresh(asked: bool = False) -> bool:
    """Whether a run starts as a fresh interpreter: asked, set for every run, or no fork server
    here (forkserver.available)."""
    return asked or bool(os.environ.get(FRESH_ENV)) or not forkserver.available()


def distbench(out: Path | None, *args: str, timeout: float = 180, cwd: Path | None = None,
              stdin: str | None = None, procs: int | None = None, fresh: bool = False,
              **env: str) -> Run:
    """`distbench *args` as a user runs it, outside torchrun (a command that needs workers
    starts its own), with `--out out` unless out is None; in `cwd` (else out). `procs`: the
    most processes it can start at once, when processes_of cannot tell from the arguments
    (workers set in a --config file). The TRACED commands' posts are held to NCCL's rules.
    Forked by the suite's fork server (forkserver.py), unless `fresh`: a fresh interpreter,
    for what depends on its start."""
    procs = procs or processes_of(args)
    assert procs <= MAX_PROCESSES, f"distbench {' '.join(args)}: {procs} processes, too many"
    where = cwd or out
    assert where is not None, "a run needs a directory to start in"
    argv = [*args, *(["--out", str(out)] if out else [])]
    fresh = _fresh(fresh)
    with processes(procs), nccl_rules_held(args[0] if args else None, env), \
            json_schemas.held(out, where, *(where / p for p in _outs(args))):
        start = time.monotonic()
        try:
            if fresh:
                proc = subprocess.run([sys.executable, "-m", "distbench", *argv],
                                      capture_output=True, text=True, timeout=timeout,
                                      env=clean_env(**env), cwd=where, input=stdin)
            else:
                proc = forkserver.run(argv, clean_env(**env), where, stdin, timeout,
                                      clean_env())
        except subprocess.TimeoutExpired as e:
            e.add_note(said_before_timeout(e))
            raise
        secs = time.monotonic() - start
    return Run(proc.returncode, proc.stdout, proc.stderr, out or where, secs)


def said_before_timeout(e: subprocess.TimeoutExpired, most: int = 12000,
                        frames: int = 8) -> str:
    """What a run that timed out had written to its stderr, for the test's failure: the end of
    it, with the stacks its processes wrote when asked (forkserver.say_stacks) cut to each
    thread's innermost `frames`, where it waited."""
    said = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr or ""
    kept, depth = [], None
    for line in said.splitlines():
        if line.endswith("(most recent call first):"):
            depth = 0
        elif depth is not None and line.startswith("  File "):
            depth += 1
            if depth > frames:
                if depth == frames + 1:
                    kept.append("  ...")
                continue
        else:
            depth = None
        kept.append(line)
    said = "\n".join(kept)
    cut = f"[the first {len(said) - most} characters left out]\n" if len(said) > most else ""
    return f"its stderr when it timed out:\n{cut}{said[-most:]}" if said else \
        "its stderr was empty when it timed out"


def start(args: list[str], cwd: Path, env: dict[str, str], *, stdout: int = subprocess.PIPE,
          stderr: int = subprocess.PIPE, new_session: bool = False, fresh: bool = False):
    """`python -m distbench *args` started, not waited for, as subprocess.Popen(...,
    stdin=DEVNULL, text=True, start_new_session=new_session) starts it, for a test that signals
    it or runs several side by side: forked by the suite's fork server (a forkserver.Popen)
    unless `fresh`, as helpers.distbench decides. `env` is the whole environment (clean_env).
    Within the slots the test reserved (its procs(n) mark)."""
    return _popen("distbench", args, cwd, env, stdout, stderr, new_session, fresh)


def _popen(module: str, args: list[str], cwd: Path, env: dict[str, str], stdout: int,
           stderr: int, new_session: bool, fresh: bool):
    """`python -m <module> *args`, forked by the fork server unless it starts fresh."""
    if _fresh(fresh):
        return subprocess.Popen([sys.executable, "-m", module, *args],
                                stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                                text=True, cwd=cwd, env=env, start_new_session=new_session)
    check_may_start(f"{module} {' '.join(args)}"[:120])
    return forkserver.Popen(list(args), env, cwd, clean_env(), stdout, stderr, new_session,
                            module)


def cli(cwd: Path, *argv: str, dispatch: bool = False, env: dict[str, str] | None = None
        ) -> Run:
    """`distbench *argv` in this process, in `cwd`, outside any launcher (unless `env` sets a
    launcher's variables), with dispatch (where a run would start workers) replaced: its exit
    code, what it printed and what dispatch was handed (Run.dispatched: the resolved options).
    Bad input (exit 2) must never reach dispatch: the in-process form of "refused before any
    worker"; a real process shows the interpreter's part (test_cli's smoke tests).
    dispatch=True keeps the real one, for what runs here (--dry-run): a worker it started
    would fail the test. The suite's one in-process driver of the command line."""
    import io

    import distbench.cli.app as app

    dispatched: list = []
    out, err = io.StringIO(), io.StringIO()
    saved = (os.getcwd(), dict(os.environ), sys.argv, app.dispatch)
    for var in [*LAUNCHER_VARS, *(k for k in os.environ if k.startswith("DISTBENCH_"))]:
        os.environ.pop(var, None)
    os.environ.update(env or {})
    os.chdir(cwd)
    sys.argv = ["distbench", *argv]  # what run.json would record as typed
    if not dispatch:
        app.dispatch = lambda command, opts: dispatched.append((command, opts)) or 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                json_schemas.held(cwd, *_outs(argv)):
            try:
                app.main(list(argv))
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
    finally:
        os.chdir(saved[0])
        os.environ.clear()
        os.environ.update(saved[1])
        sys.argv, app.dispatch = saved[2], saved[3]
    if code == 2:
        assert dispatched == [], f"bad input reached dispatch: {dispatched}"
    return Run(code, out.getvalue(), err.getvalue(), cwd, dispatched=dispatched)


def resolved(cwd: Path, *argv: str, env: dict[str, str] | None = None):
    """The options `distbench *argv` hands dispatch (cli): accepted, dispatched once."""
    res = cli(cwd, *argv, env=env)
    assert res.code == 0, res.stdout + res.stderr
    ((command, opts),) = res.dispatched
    assert command == argv[0]
    return opts


def refused(cwd: Path, *argv: str, env: dict[str, str] | None = None) -> str:
    """The one stderr line `distbench *argv` is refused in (cli): exit 2, nothing dispatched."""
    res = cli(cwd, *argv, env=env)
    assert res.code == 2 and res.dispatched == [], res.stdout + res.stderr
    assert len(res.stderr.splitlines()) == 1, res.stderr
    return res.stderr


def python_c(code: str, cwd: Path | None = None, timeout: float = 60,
             **env: str) -> subprocess.CompletedProcess:
    """`python -c code` in a fresh interpreter (what it imports, from nothing), within the
    budget."""
    with processes(1):
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              cwd=cwd, env=clean_env(**env), timeout=timeout)


class NodeRun(subprocess.CompletedProcess):
    """A torchrun agent's run, and when it ended (time.monotonic()): which node ended first,
    and how long after, does not depend on how long the machine took to start them."""

    def __init__(self, args, returncode: int, stdout: str, stderr: str, ended: float):
        super().__init__(args, returncode, stdout, stderr)
        self.ended = ended


def torchrun_agent(args: list[str], env: dict[str, str], cwd: Path, *,
                   stdout: int = subprocess.PIPE, new_session: bool = False):
    """`torchrun *args` started, not waited for: forked by the fork server as `start` forks a
    launcher (the agent then execs its workers, fresh, as torchrun does everywhere), unless
    runs are fresh. Within the slots the test holds."""
    return _popen("torch.distributed.run", args, cwd, env, stdout, subprocess.PIPE, new_session,
                  False)


def torchrun_nodes(out: Path, nnodes: int, nproc: int, per_node_args: list[list[str]],
                   timeout: float = 180, script: tuple[str, ...] = ("-m", "distbench"),
                   **env: str) -> list[NodeRun]:
    """`nnodes` torchrun agents on 127.0.0.1, as a multi-node job would start them, each
    running `script` (distbench, or a test's own entry point) on its node's arguments."""
    port = free_port()
    command = per_node_args[0][0] if script == ("-m", "distbench") and per_node_args[0] else None
    with processes(nnodes * (nproc + 1)), nccl_rules_held(command, env), \
            json_schemas.held(out):
        procs = [torchrun_agent(["--nnodes", str(nnodes), "--nproc-per-node", str(nproc),
                                 "--node-rank", str(i), "--master-addr", "127.0.0.1",
                                 "--master-port", str(port), *script, *per_node_args[i],
                                 "--out", str(out)], clean_env(**env), out)
                 for i in range(nnodes)]
        said: list[tuple[str, str]] = [("", "")] * nnodes
        ended = [0.0] * nnodes

        def drain(i: int) -> None:
            said[i] = procs[i].communicate()
            ended[i] = time.monotonic()

        drains = [threading.Thread(target=drain, args=(i,), daemon=True) for i in range(nnodes)]
        for t in drains:
            t.start()
        try:
            deadline = time.monotonic() + timeout
            for t in drains:
                t.join(max(0.0, deadline - time.monotonic()))
            if any(t.is_alive() for t in drains):
                raise subprocess.TimeoutExpired(procs[0].args, timeout)
            return [NodeRun(p.args, p.returncode, *said[i], ended=ended[i])
                    for i, p in enumerate(procs)]
        finally:
            for p in procs:  # past the timeout: none is left to run on outside the budget
                if p.poll() is None:
                    power_off(p.pid)
            for t in drains:
                t.join(30)


def assert_one_line_error(proc: subprocess.CompletedProcess | Run, secs: float | None,
                          option: str, ours: bool) -> str:
    """Bad input: exit 2, one stderr line naming the option (ours also give an example), no
    traceback, nothing on stdout, and refused before any worker could start: within `secs`, for
    a real process refused before it imports torch. Refused after torch's import (what the
    backend `auto` resolves to, the memory where the workers would run), the time is the
    import's, which the machine's load sets (5.4 s in CI): those callers pass None and prove
    "before any worker" by the run directory that is not there, which the launcher makes before
    it starts one. Run in-process, the caller checks that nothing was dispatched."""
    where = f"rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.returncode == 2, where
    assert "Traceback" not in proc.stderr + proc.stdout, where
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, f"expected exactly one stderr line\n{where}"
    line = lines[0]
    assert line.startswith("distbench: error:"), where
    assert option in line, f"error line does not name {option}\n{where}"
    if ours:
        assert line.startswith(f"distbench: error: {option}:"), where
        assert "example:" in line, f"error line has no valid example\n{where}"
    assert proc.stdout == "", where
    assert secs is None or secs < 5, \
        f"bad input took {secs:.2f} s to be refused; it must fail before workers"
    return line


@contextlib.contextmanager
def within(seconds: float) -> Iterator[None]:
    """Fail (TimeoutError) a block of this process still running after `seconds`, instead of
    letting it hang the suite: arithmetic that grows with one input (issue 30) is stopped by
    SIGALRM between two bytecodes. Main thread only."""
    def fire(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    saved = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, saved)


def distbench_lines(stderr: str) -> list[str]:
    """What distbench itself said on stderr (torchrun's and torch's own lines left out)."""
    return [line for line in stderr.splitlines() if line.startswith("distbench:")]


children = forkserver.children


def wait_for(what: Callable[[], T], seconds: float, proc) -> T:
    """what()'s first true value, asked every 50 ms while `proc` (a run started by `start`)
    runs; the test fails, with what the run printed, when it ends first or `seconds` pass."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError(f"waited {seconds} s in vain")


def rows_written(out: Path, name: str) -> int:
    """The rows (after the header) of the `name` file in the one run directory under `out`; 0
    before it exists."""
    found = list(out.glob(f"*/{name}"))
    return len(found[0].read_text().splitlines()) - 1 if found else 0


def power_off(pid: int) -> None:
    """A node losing power: its launcher and every worker it started die at once (SIGKILL of
    the launcher alone leaves its workers running, to notice and leave later)."""
    for victim in [*children(pid), pid]:
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass


def processes_naming(path: Path) -> list[int]:
    """Processes (other than this one) whose command line names `path`, or that run in it: a
    run's launcher and workers carry its --out on theirs, or, forked by the fork server, run
    in the directory the run started in (their command line is the server's)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                named = str(path).encode() in (entry / "cmdline").read_bytes()
                named = named or Path(os.readlink(entry / "cwd")).is_relative_to(path)
            except OSError:
                continue
            if named:
                found.append(int(entry.name))
    return found
