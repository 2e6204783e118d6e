"""The peak memory of a command and every process it starts: what the test suite may hold at
once on the shared test machine (the budget is 8 GiB). Samples the resident memory of the
whole process tree from /proc twice a second; prints the peak, when it came and the most
processes seen at once.

    python benchmarks/suite_memory.py [-- COMMAND ...]    # default: the test suite

The default runs `python -m pytest -q -p no:cacheprovider` in the checkout (about 20 minutes
on the 2-core VM). Resident memory counts pages shared between processes (torch's libraries)
once per process, so the figure is an upper bound.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from procs import children, status_kib

INTERVAL_S = 0.5


def tree(root: int) -> list[int]:
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children(pid)
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:160]
    except OSError:
        return f"{pid} (gone)"


def main() -> int:
    args = sys.argv[1:]
    command = args[1:] if args[:1] == ["--"] else args or [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    start = time.monotonic()
    proc = subprocess.Popen(command)
    peak, peak_at, most, crowd = 0, 0.0, 0, []
    while proc.poll() is None:
        pids = tree(proc.pid)
        total = sum(status_kib(p, "VmRSS") * 1024 for p in pids)
        if len(pids) > most:
            most, crowd = len(pids), [_cmdline(p) for p in pids]
        if total > peak:
            peak, peak_at = total, time.monotonic() - start
        time.sleep(INTERVAL_S)
    took = time.monotonic() - start
    print(f"suite_memory: peak {peak / 2**30:.2f} GiB resident at {peak_at:.0f} s of {took:.0f} s; "
          f"at most {most} processes at once (the command included); exit {proc.returncode}",
          file=sys.stderr)
    for line in crowd:  # which test it was, and what it started
        print(f"suite_memory:   {line}", file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
