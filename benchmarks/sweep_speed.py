"""Is the default `collective` sweep faster or slower than at another revision? Both run side by
side in one session, alternating (old, new, new, old, ...), so the machine's noise hits both
alike; prints each run's wall time and the median ratio new / old.

    python benchmarks/sweep_speed.py --old REV [--rounds 3] [--args "collective --workers 2"]

REV is checked out into a temporary git worktree (removed at the end) and run from there with
this interpreter; "new" is the tree this script sits in. Each run writes to a temporary
directory. The default sweep on 2 gloo workers takes about 20 to 30 s on the 2-core VM.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def timed_run(tree: Path, args: list[str], out: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "distbench", *args, "--out", str(out)],
                          capture_output=True, text=True, timeout=900, env=env, cwd=tree)
    took = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"sweep_speed: a run in {tree} failed (exit {done.returncode}): "
                 f"{done.stderr.strip()[-500:]}")
    return took


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old", required=True, help="the git revision to compare with")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--args", default="collective --workers 2")
    a = p.parse_args()
    args = shlex.split(a.args)
    with tempfile.TemporaryDirectory(prefix="distbench-sweep-speed-") as tmp:
        old_tree = Path(tmp) / "old"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old_tree),
                        a.old], check=True, capture_output=True)
        try:
            times: dict[str, list[float]] = {"old": [], "new": []}
            trees = {"old": old_tree, "new": ROOT}
            for r in range(a.rounds):
                for which in (("old", "new") if r % 2 == 0 else ("new", "old")):
                    out = Path(tmp) / f"{which}{r}"
                    took = timed_run(trees[which], args, out)
                    times[which].append(took)
                    print(f"round {r + 1}  {which:>3}  {took:6.1f} s", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                            str(old_tree)], capture_output=True)
    old, new = statistics.median(times["old"]), statistics.median(times["new"])
    print(f"`distbench {a.args}`: old ({a.old}) median {old:.1f} s, new median {new:.1f} s, "
          f"new/old {new / old:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
