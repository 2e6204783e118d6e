"""The suite's fork server: `distbench ...` run as a child of a process that has imported torch
and distbench once, not as a fresh interpreter that imports them again. A fresh one costs about
2 CPU-seconds and 2 s of wall time before it parses its first option, and the multi-process
tests start about 130 runs through helpers.distbench, about 45 through helpers.start (the
launchers and hand-started ranks a test signals or runs side by side: Popen, below) and about
20 torchrun agents through helpers.torchrun_agent (`torch.distributed.run`, whose workers the
agent execs, fresh, as torchrun always does).

The child is what exec would have made (distbench.run.forked_workers.as_if_exec, as a forked
worker is: default signal handlers, no inherited descriptors but its stdin, stdout and stderr,
the environment given, unbuffered output), in the directory given, and runs the entry point
`python -m distbench` runs. It is a real process: it starts, forks or execs its own workers, is
signalled, times out and exits as one. What it does not show is the interpreter's own start:
the tests of that (start-up cost, bad input refused before torch loads, a launcher killed
while its workers load torch) start a fresh one (fresh=True).

One server per pytest process, started on its first run; it ends with that process. It starts
nothing on its own, and its children are counted in the suite's process budget as the runs
they are. Only on a machine with no GPU device (the server would otherwise have to stay clear of
CUDA for its children's sake, as forked workers do: launch.forks_workers)."""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import importlib
import json
import locale
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# What a launcher imports before it starts its workers: imported once, here, and then what any
# command preloads for its workers (Command.preload).
PRELOAD = ("torch", "torch.distributed.run", "distbench.cli.app", "distbench.kinds",
           "distbench.run.launch", "distbench.run.session")
# What the server runs: distbench, and torchrun's agent (whose workers it execs, as torchrun
# always does).
MODULES = ("distbench", "torch.distributed.run")
_MAX_MESSAGE = 1 << 20
_POLL_S = 0.02
_START_TIMEOUT_S = 120
# What makes a run's process write every thread's Python stack to its stderr (faulthandler,
# registered in the server, so in every process forked from it: the runs and their forked
# workers) and go on. Sent to each process of a run that times out, before it is killed: a
# hang in CI then says where it hung.
STACKS_SIGNAL = signal.SIGUSR2
_STACKS_WAIT_S = 2.0
_STACKS_APART_S = 0.2


# --- the server ------------------------------------------------------------------------------

def serve(path: str) -> None:
    """Listen at `path` until the process that started this one is gone. Each connection is one
    run: a JSON request ({argv, env, cwd, new_session, module}) with three descriptors (stdin,
    stdout, stderr); the reply is {"pid"} once the child is started (in a session of its own if
    asked), then {"exit"} (Popen.returncode's form) once it has ended."""
    parent = os.getppid()
    faulthandler.register(STACKS_SIGNAL, file=sys.stderr, all_threads=True)
    for name in PRELOAD:
        importlib.import_module(name)
    from distbench.kinds import commands
    from distbench.run.forked_workers import as_if_exec

    for name in {name for command in commands().values() for name in command.preload}:
        importlib.import_module(name)

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    running: dict[int, socket.socket] = {}
    while os.getppid() == parent:
        readable, _, _ = select.select([listener], [], [], _POLL_S)
        if readable:
            conn, _ = listener.accept()
            _start(conn, [listener, *running.values()], running, as_if_exec)
        _reap(running)


def _start(conn: socket.socket, others: list[socket.socket], running: dict, as_if_exec) -> None:
    try:
        message, fds, _, _ = socket.recv_fds(conn, _MAX_MESSAGE, 3)
        request = json.loads(message)
        assert len(fds) == 3, f"{len(fds)} descriptors, not stdin, stdout and stderr"
    except (OSError, ValueError, AssertionError) as e:
        with contextlib.suppress(OSError):
            conn.send(json.dumps({"error": str(e)}).encode())
        conn.close()
        return
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            for sock in (conn, *others):
                sock.detach()  # closed with every other descriptor; never again by its object
            os.close(ready_r)
            if request.get("new_session"):
                os.setsid()
            os.chdir(request["cwd"])
            sys.path[0] = request["cwd"]  # as `python -m` puts it
        except BaseException as e:
            os.write(fds[2], f"forkserver: {e}\n".encode())
            os._exit(1)
        finally:
            os.close(ready_w)
        if request["module"] != "distbench":  # a package runs its __main__, never imported here
            # run as `python -m` runs a module it has not imported (runpy warns of one it has)
            sys.modules.pop(request["module"], None)
        as_if_exec(request["argv"], request["env"], tuple(fds), module=request["module"])
    for fd in (*fds, ready_w):
        os.close(fd)
    # its pid is given once it is in its own session, as Popen returns once its child has
    # exec'd: a test may signal its process group at once
    os.read(ready_r, 1)
    os.close(ready_r)
    conn.send(json.dumps({"pid": pid}).encode())
    running[pid] = conn


def _reap(running: dict[int, socket.socket]) -> None:
    while running:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if not pid:
            return
        conn = running.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):  # the client gave up on it (its timeout)
                conn.send(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode())
            conn.close()


# --- the client (in a pytest process) ---------------------------------------------------------

class _Server:
    lock = threading.Lock()
    proc: subprocess.Popen | None = None
    path: str | None = None


def available() -> bool:
    """Whether runs can be forked here: not where a GPU device exists (see the module's note)."""
    from distbench.platform.limits import nvidia_devices

    return not nvidia_devices()


def _ensure(env: dict[str, str]) -> str:
    with _Server.lock:
        if _Server.proc is not None and _Server.proc.poll() is None:
            return _Server.path
        where = tempfile.mkdtemp(prefix="distbench-forkserver-")
        path = os.path.join(where, "socket")
        proc = subprocess.Popen([sys.executable, __file__, path], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, env=env, cwd=where, text=True)
        ready, _, _ = select.select([proc.stdout], [], [], _START_TIMEOUT_S)
        line = proc.stdout.readline() if ready else ""
        if line.strip() != "ready":
            proc.kill()
            proc.wait()
            raise RuntimeError(f"the fork server did not start (exit {proc.returncode})")
        _Server.proc, _Server.path = proc, path
        atexit.register(_stop, proc, where)
        return path


def _stop(proc: subprocess.Popen, where: str) -> None:
    proc.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(where, "socket"))
        os.rmdir(where)


def _request(argv: list[str], env: dict[str, str], cwd: Path, stdio: list[int],
             server_env: dict[str, str], new_session: bool = False, module: str = "distbench"
             ) -> tuple[socket.socket, int]:
    """Ask this pytest process's server (started with `server_env` if it is not yet) to fork
    `python -m <module> *argv` with `stdio` as its descriptors 0, 1 and 2 (closed here once
    sent): the connection its exit code will come on, and its pid."""
    assert module in MODULES, module
    path = _ensure(server_env)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(path)
        request = {"argv": list(argv), "env": env, "cwd": str(cwd), "new_session": new_session,
                   "module": module}
        socket.send_fds(conn, [json.dumps(request).encode()], stdio)
    finally:
        for fd in stdio:
            os.close(fd)
    started = json.loads(conn.recv(_MAX_MESSAGE) or b"{}")
    if "pid" not in started:
        conn.close()
        raise RuntimeError(f"the fork server refused the run: {started}")
    return conn, started["pid"]


def run(argv: list[str], env: dict[str, str], cwd: Path, stdin: str | None, timeout: float,
        server_env: dict[str, str]) -> subprocess.CompletedProcess:
    """`python -m distbench *argv`, forked by this pytest process's server, as
    subprocess.run(capture_output=True, text=True, ...) would run it: the same result, and the
    same TimeoutExpired after killing it."""
    ends = [os.pipe() for _ in range(3)]  # stdin, stdout, stderr: (read, write)
    try:
        conn, pid = _request(argv, env, cwd, [ends[0][0], ends[1][1], ends[2][1]], server_env)
    except BaseException:
        for fd in (ends[0][1], ends[1][0], ends[2][0]):
            os.close(fd)
        raise
    deadline = time.monotonic() + timeout
    with conn:
        out, err = _Reader(ends[1][0]), _Reader(ends[2][0])
        _Writer(ends[0][1], stdin or "")
        code = _await_exit(conn, deadline)
        if code is None:  # as subprocess.run does on its timeout: killed, then waited for
            # but first its processes' stacks, into what it wrote (each goes on once it has)
            ended = _await_exit(conn, time.monotonic() + _STACKS_WAIT_S) \
                if say_stacks(pid) else None
            if ended is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                _await_exit(conn, None)
            # undecoded, as subprocess.run leaves what it had read when it timed out
            raise subprocess.TimeoutExpired(["distbench", *argv], timeout,
                                            output=out.data(0), stderr=err.data(_POLL_S))
    # like communicate(): everything its processes wrote, until the last of them closed it
    left = max(0.0, deadline - time.monotonic())
    stdout, stderr = out.text(left), err.text(left)
    if out.open or err.open:
        raise subprocess.TimeoutExpired(["distbench", *argv], timeout, output=out.data(0),
                                        stderr=err.data(0))
    return subprocess.CompletedProcess(["distbench", *argv], code, stdout, stderr)


def say_stacks(pid: int) -> int:
    """Ask `pid` and every process under it that catches STACKS_SIGNAL (the server's forks; an
    exec'd one, such as a torchrun agent's worker, would die of it) to write their threads'
    stacks to their stderr; how many were asked."""
    asked = 0
    for each in _tree(pid):
        if not _catches(each, STACKS_SIGNAL):
            continue
        if asked:
            time.sleep(_STACKS_APART_S)  # or their lines interleave in the one pipe
        with contextlib.suppress(ProcessLookupError):
            os.kill(each, STACKS_SIGNAL)
            asked += 1
    return asked


def _catches(pid: int, signum: int) -> bool:
    """Whether `pid` has a handler for `signum` (SigCgt in /proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            caught = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(caught >> (signum - 1) & 1)


def _tree(pid: int) -> list[int]:
    """`pid` and its descendants, the deepest first (a worker's stack before its launcher's)."""
    return [*(each for child in children(pid) for each in _tree(child)), pid]


def children(pid: int) -> list[int]:
    """The processes `pid` started (a torchrun agent's workers, in sessions of their own)."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


class Popen:
    """subprocess.Popen([python, "-m", "distbench", *argv], stdin=DEVNULL, text=True, ...)
    forked by this pytest process's server: what the tests use of one. `pid` is the run's own
    process, to signal and to find the children of; `stdout` and `stderr` are PIPE or DEVNULL;
    `new_session` is start_new_session. Its exit comes from the server, which is its parent."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path,
                 server_env: dict[str, str], stdout: int = subprocess.PIPE,
                 stderr: int = subprocess.PIPE, new_session: bool = False,
                 module: str = "distbench"):
        self.args = ["distbench" if module == "distbench" else "torchrun", *argv]
        self.returncode: int | None = None
        self._readers: dict[int, _Reader] = {}
        stdio, mine = [os.open(os.devnull, os.O_RDWR)], []
        for how in (stdout, stderr):
            assert how in (subprocess.PIPE, subprocess.DEVNULL), how
            if how == subprocess.PIPE:
                r, w = os.pipe()
                stdio.append(w)
                mine.append(r)
            else:
                stdio.append(os.open(os.devnull, os.O_WRONLY))
                mine.append(None)
        try:
            self._conn, self.pid = _request(argv, env, cwd, stdio, server_env, new_session,
                                            module)
        except BaseException:
            for fd in mine:
                if fd is not None:
                    os.close(fd)
            raise
        self._out, self._err = mine

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = _await_exit(self._conn, time.monotonic())
            if self.returncode is not None:
                self._conn.close()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            deadline = None if timeout is None else time.monotonic() + timeout
            code = _await_exit(self._conn, deadline)
            if code is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self.returncode = code
            self._conn.close()
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str | None, str | None]:
        """As Popen.communicate: everything it wrote, once its ends of the pipes are closed and
        it has exited; TimeoutExpired, with it left running, to be called again."""
        deadline = None if timeout is None else time.monotonic() + timeout
        texts = []
        for fd in (self._out, self._err):
            if fd is None:
                texts.append(None)
                continue
            if fd not in self._readers:
                self._readers[fd] = _Reader(fd)
            reader = self._readers[fd]
            reader.data(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.open:
                raise subprocess.TimeoutExpired(self.args, timeout)
            texts.append(reader.text(0))
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return texts[0], texts[1]

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _await_exit(conn: socket.socket, deadline: float | None) -> int | None:
    """The run's exit code, or None if it has not come by the deadline (None: no deadline)."""
    left = None if deadline is None else max(0.0, deadline - time.monotonic())
    readable, _, _ = select.select([conn], [], [], left)
    if not readable:
        return None
    message = conn.recv(_MAX_MESSAGE)
    if not message:
        raise RuntimeError("the fork server ended while a run was running")
    return json.loads(message)["exit"]


def _decode(data: bytes) -> str:
    """As text=True decodes: the locale's encoding, universal newlines."""
    text = data.decode(locale.getpreferredencoding(False))
    return text.replace("\r\n", "\n").replace("\r", "\n")


class _Reader:
    """One end of a pipe read to its end from a thread, as communicate() reads it."""

    def __init__(self, fd: int):
        self.chunks: list[bytes] = []
        self.thread = threading.Thread(target=self._read, args=(fd,), daemon=True)
        self.thread.start()

    def _read(self, fd: int) -> None:
        with os.fdopen(fd, "rb", buffering=0) as f:
            while chunk := f.read(1 << 16):
                self.chunks.append(chunk)

    @property
    def open(self) -> bool:
        return self.thread.is_alive()

    def data(self, wait_s: float) -> bytes:
        self.thread.join(wait_s)
        return b"".join(self.chunks)

    def text(self, wait_s: float) -> str:
        return _decode(self.data(wait_s))


class _Writer:
    def __init__(self, fd: int, text: str):
        def write():
            with contextlib.suppress(BrokenPipeError), os.fdopen(fd, "wb") as f:
                f.write(text.encode(locale.getpreferredencoding(False)))
        threading.Thread(target=write, daemon=True).start()


if __name__ == "__main__":
    serve(sys.argv[1])
