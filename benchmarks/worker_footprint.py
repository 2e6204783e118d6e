"""What one worker holds in memory: the figure behind distbench.platform.limits.WORKER_BYTES, which
the local launcher multiplies by --workers before it starts any. Runs small self-launched runs
of each command and samples the peak resident memory (VmHWM) of every worker and of the
launcher, from /proc, until they end.

    python benchmarks/worker_footprint.py [--workers 2] [--commands collective,dp]

Prints one line per command (the largest worker's and the launcher's peak) and the bound in
use. Runs go to a temporary directory that is removed at the end; on the 2-core VM the
default takes about a minute.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from procs import children, status_kib

from distbench.platform.limits import WORKER_BYTES

SMALL = {
    "collective": ["--sizes", "4K", "--iters", "50"],
    "p2p": ["--sizes", "4K", "--iters", "50"],
    "tp": ["--hidden-size", "64", "--ffn-size", "128", "--heads", "4", "--seq-len", "16",
           "--iters", "2"],
    "pp": ["--hidden-size", "64", "--seq-len", "16", "--iters", "2"],
    "dp": ["--hidden-size", "64", "--ffn-size", "128", "--seq-len", "16", "--iters", "2"],
}


def measure(command: str, workers: int, out: Path) -> tuple[int, int]:
    proc = subprocess.Popen([sys.executable, "-m", "distbench", command, *SMALL[command],
                             "--backend", "gloo", "--workers", str(workers), "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    worker, launcher = 0, 0
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        launcher = max(launcher, status_kib(proc.pid, "VmHWM"))
        for child in children(proc.pid):
            worker = max(worker, status_kib(child, "VmHWM"))
        time.sleep(0.05)
    if proc.poll() is None:
        proc.kill()
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"{command} failed ({proc.returncode}): {err.strip()[-400:]}")
    return worker * 1024, launcher * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--commands", default="collective,dp")
    args = parser.parse_args()
    mib = 2**20
    worst = 0
    with tempfile.TemporaryDirectory() as tmp:
        for command in args.commands.split(","):
            worker, launcher = measure(command, args.workers, Path(tmp) / command)
            worst = max(worst, worker)
            print(f"{command:11s} worker peak {worker / mib:6.0f} MiB   launcher peak "
                  f"{launcher / mib:6.0f} MiB")
    print(f"largest worker {worst / mib:.0f} MiB; limits.WORKER_BYTES = {WORKER_BYTES / mib:.0f} "
          f"MiB ({'holds' if WORKER_BYTES >= worst else 'TOO SMALL'})")


if __name__ == "__main__":
    main()
