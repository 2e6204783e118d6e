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

from procs import children, status_kib

INTERVAL_S = 0.5


def tree(root: int) -> list[int]:
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children(pid)
    return found


def main() -> int:
    args = sys.argv[1:]
    command = args[1:] if args[:1] == ["--"] else args or [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    start = time.monotonic()
    proc = subprocess.Popen(command)
    peak, peak_at, most = 0, 0.0, 0
    while proc.poll() is None:
        pids = tree(proc.pid)
        total = sum(status_kib(p, "VmRSS") * 1024 for p in pids)
        most = max(most, len(pids))
        if total > peak:
            peak, peak_at = total, time.monotonic() - start
        time.sleep(INTERVAL_S)
    took = time.monotonic() - start
    print(f"suite_memory: peak {peak / 2**30:.2f} GiB resident at {peak_at:.0f} s of {took:.0f} s; "
          f"at most {most} processes at once (the command included); exit {proc.returncode}",
          file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
