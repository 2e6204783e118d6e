"""How often does `distbench compare` cry wolf, and how often does it catch a real slowdown? The
issue-18 check, rerunnable: the same small collective sweep run again and again on this machine,
consecutive plain runs compared (A/A: a pair that exits 4 is a false alarm), and runs with rank 1
slowed by the fault hook compared against a plain run (a pair that exits 4 is a detection).

    python benchmarks/false_alarms.py [--pairs 10] [--delay 0.002] [--workers 2]
                                      [--args "collective --op all_reduce,all_gather ..."]

Prints one line per pair (its exit code and marks), then the two rates. Runs go to a temporary
directory that is removed at the end. On the 2-core VM one run takes about 6 s, so the default
(11 plain runs, 10 slowed) takes two to three minutes.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

DEFAULT = "collective --op all_reduce,all_gather --sizes 4K,64K,1M"


def run(out: Path, args: list[str], workers: int, env: dict[str, str]) -> Path:
    out.mkdir(parents=True)
    done = subprocess.run([sys.executable, "-m", "distbench", *args, "--workers", str(workers),
                           "--out", str(out)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **env})
    if done.returncode != 0:
        sys.exit(f"false_alarms: a run failed (exit {done.returncode}): {done.stderr.strip()}")
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return run_dir


def compare(base: Path, new: Path) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "distbench", "compare", str(base), str(new)],
                          capture_output=True, text=True, timeout=120)
    if done.returncode not in (0, 4):
        sys.exit(f"false_alarms: compare failed (exit {done.returncode}): {done.stderr.strip()}")
    return done.returncode, done.stdout.strip().splitlines()[-1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=10)
    p.add_argument("--delay", type=float, default=0.002,
                   help="seconds rank 1 waits before each op in the slowed runs")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--args", default=DEFAULT, help="the distbench command line to repeat")
    a = p.parse_args()
    args = shlex.split(a.args)
    with tempfile.TemporaryDirectory(prefix="distbench-false-alarms-") as tmp:
        root = Path(tmp)
        plain = [run(root / f"plain{i}", args, a.workers, {}) for i in range(a.pairs + 1)]
        alarms = 0
        print(f"# A/A: {a.pairs} pairs of consecutive plain runs of `distbench {a.args}`")
        for i in range(a.pairs):
            code, verdict = compare(plain[i], plain[i + 1])
            alarms += code == 4
            print(f"A/A    {i + 1:>3}  exit {code}  {verdict.lstrip('# ')}", flush=True)
        slow = {"DISTBENCH_TEST_SLOW_RANK": f"1:{a.delay}"}
        caught = 0
        print(f"# detection: {a.pairs} runs with rank 1 waiting {a.delay * 1e3:g} ms before "
              "each op, each against a plain run")
        for i in range(a.pairs):
            slowed = run(root / f"slow{i}", args, a.workers, slow)
            code, verdict = compare(plain[i], slowed)
            caught += code == 4
            print(f"slowed {i + 1:>3}  exit {code}  {verdict.lstrip('# ')}", flush=True)
    print(f"false-alarm rate {alarms}/{a.pairs} = {alarms / a.pairs:.0%}; "
          f"detection rate {caught}/{a.pairs} = {caught / a.pairs:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
