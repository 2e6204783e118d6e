"""A one-node Slurm cluster on this machine, for the tests that run distbench as a Slurm site does:
its ranks started by srun, and `watch --once --drain` as slurmd's HealthCheckProgram draining the
node (docs/monitoring.md). Debian's slurm-wlm (.ci/run installs it where apt can); `missing()`
says why there can be none here, and the tests then skip.

slurmctld -c (no saved state) and slurmd, each started in the foreground (so each is known by
its PID, not by a pid file) in a session of its own, both reading a slurm.conf generated in a
temporary directory: NodeName is this machine's hostname unless the test names the node
otherwise (slurmd -N then tells slurmd which entry is its own, as at a site whose node names are
not its hosts'), every address loopback, both ports free ones, so two clusters on one machine
do not collide.
The block waits until sinfo shows the node idle (about 1 s here); when it ends, however it ends,
each daemon is sent SIGTERM by its PID, SIGKILL after STOP_S, and nothing started in the
cluster's directory may outlive them.

What it costs of the suite's budget of 8 processes (tests/helpers.py), counted here because
every test of it runs at the edge of that budget:
- DAEMON_PROCESSES, 3: slurmctld, the slurmscriptd it forks (always, since Slurm 21.08), slurmd.
- srun is 2 processes (it forks a shepherd that cancels the step should srun die), and slurmd
  starts one slurmstepd a step, so `srun -n2` is 5 with its ranks: 8 with the daemons.
- No munged: Debian's auth/none and cred/none plugins instead of auth/munge. Sites run munge,
  but munged would be a 4th daemon, and `srun -n2` (the fewest ranks that show a straggler)
  would not fit. The cluster listens on 127.0.0.1 only and lives for one test.
A cluster lives for one test, not a module: the budget's slots are held test by test (the
test's procs(n) mark counts the daemons too), and daemons that outlived a test would run beside
whatever took the slots between two tests."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers import clean_env, free_port, processes, processes_naming

DAEMONS = ("slurmctld", "slurmd")
DAEMON_PROCESSES = 3  # the daemons and slurmctld's slurmscriptd
SRUN_PROCESSES = 3  # srun, its shepherd, and the step's slurmstepd, besides the tasks
CLIENTS = ("srun", "sinfo", "scontrol", "scancel")
# slurmd and slurmctld live in sbin, which a CI user's PATH may lack
SEARCH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
START_S = 30  # from the first daemon's start to the node idle: about 1 s here
STOP_S = 10  # from a daemon's SIGTERM to its exit, before SIGKILL (they take well under 1 s)
COMMAND_S = 30  # a client command (sinfo, scontrol, scancel)
TRIES = 3  # a free port may be taken before the daemon binds it
# The daemons' whole environment, nothing of the test's: their children (slurmstepd, the
# HealthCheckProgram) see no DISTBENCH_* variable unless the test hands it to them itself
DAEMON_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C"}


def _which(name: str) -> str | None:
    return shutil.which(name, path=SEARCH)


def missing() -> str | None:
    """Why there can be no cluster here, or None."""
    absent = [name for name in DAEMONS + CLIENTS if _which(name) is None]
    if absent:
        return (f"no {', '.join(absent)}: Debian's slurm-wlm is not installed (.ci/run "
                f"installs it with apt-get where it can)")
    if os.geteuid() != 0:
        return "not root: slurmd runs as root, to start each job's tasks as its user"
    return None


def hostname() -> str:
    """This machine's name as slurmd looks itself up in slurm.conf: the short hostname."""
    return socket.gethostname().split(".")[0]


@dataclass
class Cluster:
    dir: Path  # everything of the cluster: slurm.conf, state, spool, logs
    conf: Path
    node: str
    daemons: dict[str, subprocess.Popen] = field(default_factory=dict)

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a client command or srun on this cluster: the test's (as
        helpers.clean_env makes it) less any Slurm variable of a job the suite itself may run
        in, with SLURM_CONF naming this cluster's."""
        env = {k: v for k, v in clean_env().items() if not k.startswith("SLURM")}
        env.update(extra, SLURM_CONF=str(self.conf))
        return env

    def command(self, *argv: str, timeout: float = COMMAND_S) -> subprocess.CompletedProcess:
        """A client command (sinfo, scontrol, scancel) on this cluster: one process."""
        with processes(1):
            return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                                  env=self.env(), cwd=self.dir, stdin=subprocess.DEVNULL)

    def node_state(self) -> tuple[str, str]:
        """The node's state as sinfo says it ("idle", "drained", "draining", "idle*", ...) and
        its reason ("none" where it has none)."""
        got = self.command("sinfo", "-h", "-N", "-n", self.node, "-o", "%T|%E")
        assert got.returncode == 0 and got.stdout.strip(), \
            f"sinfo exited {got.returncode}: {got.stdout}{got.stderr}\n{self.logs()}"
        state, _, reason = got.stdout.strip().partition("|")
        return state, reason

    def wait_state(self, want: Callable[[str], bool], timeout: float, why: str
                   ) -> tuple[str, str]:
        """node_state() once `want(state)` holds, within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            state, reason = self.node_state()
            if want(state):
                return state, reason
            assert time.monotonic() < deadline, \
                f"{why}: the node is {state!r} ({reason}) after {timeout} s\n{self.logs()}"
            time.sleep(0.2)

    def resume(self) -> None:
        """`scontrol update NodeName=<node> State=resume`, as an operator brings a node back."""
        got = self.command("scontrol", "update", f"NodeName={self.node}", "State=resume")
        assert got.returncode == 0, f"scontrol resume: {got.stdout}{got.stderr}"

    def srun(self, tasks: int, argv: list[str], cwd: Path, timeout: float, **env: str
             ) -> subprocess.CompletedProcess:
        """`srun -n<tasks> --overcommit *argv` from `cwd`, with `env` besides the test's: its
        exit code (the tasks' highest) and what it printed. SRUN_PROCESSES and the tasks are
        the test's processes (its procs mark). Past the timeout srun is killed and every job of
        the cluster cancelled, so no task runs on."""
        proc = subprocess.Popen(["srun", f"-n{tasks}", "--overcommit", *argv], cwd=cwd,
                                env=self.env(**env), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # srun and its shepherd
            out, err = proc.communicate()
            self.command("scancel", "--full", "--signal=KILL", "--state=RUNNING")
            raise AssertionError(f"srun {' '.join(argv)} still running after {timeout} s\n"
                                 f"stdout:\n{out}\nstderr:\n{err}") from None
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def logs(self, lines: int = 15) -> str:
        """The last lines of each daemon's log, for a failure's message."""
        parts = []
        for name in DAEMONS:
            path = self.dir / f"{name}.log"
            with contextlib.suppress(OSError):
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {path.name} ---\n" + "\n".join(tail))
        return "\n".join(parts)


def _conf(d: Path, node: str, ports: tuple[int, int], extra: str) -> str:
    return f"""\
ClusterName=distbench
SlurmctldHost=localhost
SlurmUser=root
AuthType=auth/none
CredType=cred/none
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmctldPort={ports[0]}
SlurmdPort={ports[1]}
ReturnToService=2
KillWait=5
NodeName={node} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES State=UP
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
{extra}"""


class _DaemonDied(AssertionError):
    pass


def _start(cluster: Cluster, name: str, *args: str) -> None:
    """A daemon in the foreground, in a session of its own, its output in <name>.out."""
    with open(cluster.dir / f"{name}.out", "ab") as out:
        cluster.daemons[name] = subprocess.Popen(
            [_which(name) or name, *args], stdin=subprocess.DEVNULL, stdout=out,
            stderr=subprocess.STDOUT, cwd=cluster.dir, start_new_session=True,
            env={**DAEMON_ENV, "SLURM_CONF": str(cluster.conf)})


def _idle(cluster: Cluster) -> bool:
    got = cluster.command("sinfo", "-h", "-N", "-n", cluster.node, "-o", "%T")
    return got.returncode == 0 and got.stdout.strip() == "idle"


def _launch(cluster: Cluster, extra: str) -> None:
    d = cluster.dir
    for sub in ("state", "spool"):
        (d / sub).mkdir()
    cluster.conf.write_text(_conf(d, cluster.node, (free_port(), free_port()), extra))
    _start(cluster, "slurmctld", "-D", "-c", "-f", str(cluster.conf))
    _start(cluster, "slurmd", "-D", "-N", cluster.node, "-f", str(cluster.conf))
    deadline = time.monotonic() + START_S
    while not _idle(cluster):
        dead = {n: p.returncode for n, p in cluster.daemons.items() if p.poll() is not None}
        if dead:
            said = "\n".join(f"--- {p.name} ---\n{p.read_text(errors='replace')[-3000:]}"
                             for p in sorted(d.glob("*.out")))
            raise _DaemonDied(f"{dead} exited before the node was idle\n{said}\n"
                              f"{cluster.logs()}")
        assert time.monotonic() < deadline, \
            f"the node not idle within {START_S} s\n{cluster.logs()}"
        time.sleep(0.1)


def _stop(cluster: Cluster) -> list[str]:
    """Each daemon stopped by its PID, slurmd first: SIGTERM, SIGKILL after STOP_S. Those
    still alive, as lines (slurmctld's slurmscriptd ends with it)."""
    left = []
    for name in reversed(list(cluster.daemons)):
        proc = cluster.daemons[name]
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(STOP_S)
        if proc.returncode is None:
            left.append(f"{name} (pid {proc.pid})")
    return left


def _teardown(cluster: Cluster) -> None:
    left = _stop(cluster)
    # slurmscriptd, a step daemon or a health check left behind runs in the cluster's
    # directory or names its slurm.conf: none may
    deadline = time.monotonic() + STOP_S
    while processes_naming(cluster.dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    strays = processes_naming(cluster.dir)
    for pid in strays:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not left and not strays, (f"still running after the cluster stopped: daemons "
                                     f"{left}, processes in {cluster.dir}: {strays}")


@contextlib.contextmanager
def one_node_cluster(extra_conf: str = "", node: str | None = None) -> Iterator[Cluster]:
    """A one-node cluster for the block (the module docstring); `extra_conf`: lines added to
    slurm.conf (HealthCheckProgram=...); `node`: Slurm's name for the node, else this machine's
    hostname. Skips the test, saying why, where there can be none.
    Within the running test's slots (DAEMON_PROCESSES of them, one more while a client runs)."""
    why = missing()
    if why:
        pytest.skip(why)
    for attempt in range(TRIES):
        d = Path(tempfile.mkdtemp(prefix="distbench-slurm-"))
        cluster = Cluster(d, d / "slurm.conf", node or hostname())
        try:
            try:
                _launch(cluster, extra_conf)
            except _DaemonDied as e:
                if "Address already in use" not in str(e) or attempt == TRIES - 1:
                    raise
                continue
            yield cluster
            return
        finally:
            try:
                _teardown(cluster)
            finally:
                shutil.rmtree(d, ignore_errors=True)
