"""What bounds the test suite's time: how many of the 8 process slots (tests/helpers.py) are held
and how busy the cores are, sampled twice a second while a command runs. Slots held with the
cores idle are processes waiting (timeouts, launches); all 8 held is the pool itself binding.

    python benchmarks/suite_slots.py [-- COMMAND ...]   # default: the multi-process tests

The default runs `python -m pytest -q -p no:cacheprovider --dist loadfile -n 2 -m multiproc`
in the checkout (about 8 minutes on the 2-core VM). A slot is held while its lock file is
locked (flock): /proc/locks says which.
"""

from __future__ import annotations

import collections
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from helpers import MAX_PROCESSES as SLOTS  # noqa: E402  (the pool the suite's tests share)
from helpers import SLOTS_DIR  # noqa: E402

INTERVAL_S = 0.5


def held(inodes: dict[int, int]) -> int:
    """Slots whose lock file some process holds a lock on."""
    taken = set()
    for line in Path("/proc/locks").read_text().splitlines():
        parts = line.split()
        if len(parts) > 5 and parts[1] != "->":  # "->": a waiter, not a holder
            try:
                ino = int(parts[5].split(":")[2])
            except (IndexError, ValueError):
                continue
            if ino in inodes:
                taken.add(inodes[ino])
    return len(taken)


def cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of every core since boot."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle and iowait
    return sum(fields) - idle, sum(fields)


def main() -> int:
    argv = sys.argv[1:]
    command = argv[argv.index("--") + 1:] if "--" in argv else [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--dist", "loadfile",
        "-n", "2", "-m", "multiproc"]
    SLOTS_DIR.mkdir(exist_ok=True)
    inodes = {}
    for i in range(SLOTS):
        path = SLOTS_DIR / f"slot{i}"
        path.touch()
        inodes[path.stat().st_ino] = i
    counts: collections.Counter[int] = collections.Counter()
    busy_fractions = []
    idle_held = 0
    start = time.monotonic()
    proc = subprocess.Popen(command, cwd=Path(__file__).resolve().parent.parent)
    last = cpu_ticks()
    while proc.poll() is None:
        time.sleep(INTERVAL_S)
        now = cpu_ticks()
        busy = (now[0] - last[0]) / max(now[1] - last[1], 1)
        last = now
        n = held(inodes)
        counts[n] += 1
        busy_fractions.append(busy)
        idle_held += busy < 0.6 and n >= 6
    took = time.monotonic() - start
    samples = sum(counts.values()) or 1
    print(f"{' '.join(command)}: exit {proc.returncode} after {took:.0f} s")
    print(f"cores busy {sum(busy_fractions) / samples:.0%} on average; slots held "
          f"{sum(k * v for k, v in counts.items()) / samples:.1f} of {SLOTS} on average")
    for k in sorted(counts):
        print(f"  {k} held: {counts[k] * INTERVAL_S:5.0f} s ({counts[k] / samples:.0%})")
    print(f"6 or more held with the cores under 60% busy: {idle_held * INTERVAL_S:.0f} s")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
