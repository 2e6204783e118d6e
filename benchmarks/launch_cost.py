"""What one small self-launched run costs: the wall time to its first row, its whole wall time
and the CPU-seconds of the launcher and its workers together. Most of it is the interpreters:
`import torch` in the launcher, then in every worker. The test suite starts a few hundred
such runs, so this is also the suite's cost per run.

    python benchmarks/launch_cost.py [--runs 5] [--workers 2]
    python benchmarks/launch_cost.py --tree /tmp/old-checkout   # side by side, interleaved
    python benchmarks/launch_cost.py --against-exec --backend gloo  # forked workers vs exec'd

With --tree, each round runs the other checkout's distbench (a directory holding its
`distbench/` package, e.g. a `git worktree add` of an older commit) and then this one's, so the
two are compared under the same load; the ratios are the figure to quote. With --against-exec,
the other side is this checkout with its workers started as fresh interpreters
(DISTBENCH_FORK_WORKERS=0), as every run on a machine with a GPU starts them. Runs go to a
temporary directory that is removed at the end.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
COMMAND = ["collective", "--op", "all_reduce", "--sizes", "4K", "--iters", "20"]


def one_run(tree: Path, workers: int, out: Path, extra: list[str],
            env: dict[str, str] | None = None) -> tuple[float, float, float]:
    """(seconds to the first row, seconds in all, CPU-seconds) of one run from `tree`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    first = None
    # `python -m distbench` takes the package from its working directory first
    with subprocess.Popen([sys.executable, "-m", "distbench", *COMMAND, *extra, "--workers",
                           str(workers), "--out", str(out)], cwd=tree, text=True,
                          env={**os.environ, **(env or {})},
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as proc:
        for line in proc.stdout:
            if first is None and line.strip() and not line.startswith("#"):
                first = time.monotonic() - start
        code = proc.wait(timeout=300)
    total = time.monotonic() - start
    if code != 0 or first is None:
        raise SystemExit(f"launch_cost: the run from {tree} exited {code} with no row")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return first, total, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--tree", type=Path, help="another checkout to run beside this one")
    ap.add_argument("--against-exec", action="store_true",
                    help="run this checkout beside itself with its workers exec'd, not forked")
    ap.add_argument("--backend", help="the runs' --backend (a GPU host's default is nccl, "
                    "which never forks)")
    args = ap.parse_args()
    if args.tree is not None and args.against_exec:
        raise SystemExit("launch_cost: --tree or --against-exec, not both")
    if args.tree is not None and not (args.tree / "distbench" / "__main__.py").is_file():
        raise SystemExit(f"launch_cost: no distbench package in {args.tree}")
    exec_env = {"DISTBENCH_FORK_WORKERS": "0"}
    sides = ({"other": (args.tree, None)} if args.tree else
             {"exec": (HERE, exec_env)} if args.against_exec else {})
    sides["fork" if args.against_exec else "this"] = (HERE, None)
    extra = ["--backend", args.backend] if args.backend else []
    got: dict[str, list[tuple[float, float, float]]] = {name: [] for name in sides}
    with tempfile.TemporaryDirectory(prefix="distbench-launch-") as tmp:
        for i in range(args.runs):
            for name, (tree, env) in sides.items():
                got[name].append(one_run(tree, args.workers, Path(tmp), extra, env))
            print(f"round {i + 1}/{args.runs} done", file=sys.stderr)
    print(f"collective --workers {args.workers}, {args.runs} runs each; medians")
    print(f"{'side':>6} {'first row s':>12} {'wall s':>8} {'CPU s':>7}")
    med = {}
    for name, runs in got.items():
        med[name] = [statistics.median(col) for col in zip(*runs, strict=True)]
        print(f"{name:>6} {med[name][0]:12.2f} {med[name][1]:8.2f} {med[name][2]:7.2f}")
    if len(sides) == 2:
        first, second = sides
        ratios = [t / o for t, o in zip(med[second], med[first], strict=True)]
        print(f"{second + '/' + first:>6} {ratios[0]:12.2f} {ratios[1]:8.2f} {ratios[2]:7.2f}")


if __name__ == "__main__":
    main()
