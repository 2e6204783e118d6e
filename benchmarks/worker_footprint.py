"""What one worker holds in memory: the figure behind distbench.platform.limits.WORKER_BYTES, which
the local launcher multiplies by --workers before it starts any, and each command's own bound
beside it. Runs small self-launched runs of each command and samples the peak resident memory
(VmHWM) of every worker and of the launcher, from /proc, until they end.

    python benchmarks/worker_footprint.py [--workers 2] [--commands collective,dp]
    python benchmarks/worker_footprint.py --workers 4 --commands plan --args "--validate 6"

Prints one line per command: each worker's peak and the launcher's, and the bound the launcher
checked the run against per worker (WORKER_BYTES + the command's host_bytes: what no rank may
pass). Runs go to a temporary directory that is removed at the end; on the 2-core VM the
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
    "step": ["--iters", "2", "--warmup", "1"],
    "plan": ["--validate", "1", "--min-time", "0.5"],
}


def bound(command: str, argv: list[str], workers: int) -> int:
    """What the launcher lets each worker hold for this run: WORKER_BYTES + host_bytes."""
    from distbench.core.options import build
    from distbench.kinds import commands

    def value(text: str):
        for kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                pass
        return text

    raw, it = {}, iter(argv)
    for flag in it:
        raw[flag.removeprefix("--")] = value(next(it))
    opts = build(commands()[command].options, raw, argv=[])
    return WORKER_BYTES + opts.host_bytes("gloo", workers)


def measure(command: str, argv: list[str], workers: int, out: Path) -> tuple[list[int], int]:
    proc = subprocess.Popen([sys.executable, "-m", "distbench", command, *argv,
                             "--backend", "gloo", "--workers", str(workers), "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peaks: dict[int, int] = {}
    launcher = 0
    deadline = time.monotonic() + 900
    while proc.poll() is None and time.monotonic() < deadline:
        launcher = max(launcher, status_kib(proc.pid, "VmHWM"))
        for child in children(proc.pid):
            peaks[child] = max(peaks.get(child, 0), status_kib(child, "VmHWM"))
        time.sleep(0.05)
    if proc.poll() is None:
        proc.kill()
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"{command} failed ({proc.returncode}): {err.strip()[-400:]}")
    return [k * 1024 for _, k in sorted(peaks.items())], launcher * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--commands", default="collective,dp")
    parser.add_argument("--args", default=None,
                        help="the command's options instead of the small run's, e.g. "
                        "\"--validate 6\" (flags with a value each)")
    args = parser.parse_args()
    mib = 2**20
    worst = 0
    with tempfile.TemporaryDirectory() as tmp:
        for command in args.commands.split(","):
            argv = args.args.split() if args.args is not None else SMALL[command]
            workers, launcher = measure(command, argv, args.workers, Path(tmp) / command)
            worst = max(worst, *workers)
            each = " ".join(f"{w / mib:.0f}" for w in workers)
            print(f"{command:11s} workers' peaks {each} MiB; launcher {launcher / mib:.0f} MiB; "
                  f"bound a worker {bound(command, argv, args.workers) / mib:.0f} MiB")
    print(f"largest worker {worst / mib:.0f} MiB; limits.WORKER_BYTES = {WORKER_BYTES / mib:.0f} "
          f"MiB ({'holds' if WORKER_BYTES >= worst else 'TOO SMALL'})")


if __name__ == "__main__":
    main()
