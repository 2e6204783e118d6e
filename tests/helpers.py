"""Shared by the multi-process tests: run distbench the way users do and read what it wrote."""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# The most processes one test may start on the shared test machine (launchers included).
MAX_PROCESSES = 8
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK",
                 "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS and
           not k.startswith("DISTBENCH_")}
    env.update(NO_COLOR="1", PYTHONUNBUFFERED="1", **extra)
    return env


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


def distbench(out: Path, *args: str, timeout: float = 180, **env: str) -> Run:
    """`distbench collective ...` outside torchrun: it starts its own local workers."""
    if "--workers" in args:
        workers = int(args[args.index("--workers") + 1])
        assert workers + 1 <= MAX_PROCESSES, f"{workers} workers and a launcher: too many"
    proc = subprocess.run(
        [sys.executable, "-m", "distbench", *args, "--out", str(out)],
        capture_output=True, text=True, timeout=timeout, env=clean_env(**env), cwd=out,
    )
    return Run(proc.returncode, proc.stdout, proc.stderr, out)


def torchrun_nodes(out: Path, nnodes: int, nproc: int, per_node_args: list[list[str]],
                   timeout: float = 180, **env: str) -> list[subprocess.CompletedProcess]:
    """`nnodes` torchrun agents on 127.0.0.1, as a multi-node job would start them."""
    assert nnodes * (nproc + 1) <= MAX_PROCESSES, f"{nnodes} agents of {nproc}: too many"
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes),
             "--nproc-per-node", str(nproc), "--node-rank", str(i), "--master-addr", "127.0.0.1",
             "--master-port", str(port), "-m", "distbench", *per_node_args[i], "--out", str(out)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(**env),
            cwd=out,
        )
        for i in range(nnodes)
    ]
    done = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=timeout)
        done.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return done


def assert_one_line_error(proc: subprocess.CompletedProcess, secs: float, option: str,
                          ours: bool) -> str:
    """Bad input: exit 2, one stderr line naming the option (ours also give an example), no
    traceback, nothing on stdout, and refused before any worker could start."""
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
    assert secs < 5, f"bad input took {secs:.2f} s to be refused; it must fail before workers"
    return line


def distbench_lines(stderr: str) -> list[str]:
    """What distbench itself said on stderr (torchrun's and torch's own lines left out)."""
    return [line for line in stderr.splitlines() if line.startswith("distbench:")]


def children(pid: int) -> list[int]:
    """The processes `pid` started (a torchrun agent's workers, in sessions of their own)."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def power_off(pid: int) -> None:
    """A node losing power: its launcher and every worker it started die at once (SIGKILL of
    the launcher alone leaves its workers running, to notice and leave later)."""
    for victim in [*children(pid), pid]:
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass


def processes_naming(path: Path) -> list[int]:
    """Processes (other than this one) whose command line names `path`: a run's launcher and
    workers carry its --out there."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if str(path).encode() in cmdline:
                found.append(int(entry.name))
    return found
