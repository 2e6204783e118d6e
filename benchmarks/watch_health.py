"""`distbench watch` measured as issue 32 asks, rerunnable:

    python benchmarks/watch_health.py false-alarms [--runs 3] [--cycles 30] [--workers 2]
    python benchmarks/watch_health.py memory [--cycles 300] [--interval 0.05] [--workers 2]
    python benchmarks/watch_health.py once [--runs 30] [--slowed 5] [--workers 2]

false-alarms: an unchanged machine watched --runs times for --cycles cycles each; a false alarm
is a cycle whose verdict is warn or fail or that names a straggler, and a state change is any
line in a cycle's `changes` other than the first ones out of "unknown". Prints each run's
counts.

memory: one watch of --cycles cycles at the shortest interval; the resident memory (VmRSS) of
the launcher and every worker sampled every second from the 30th cycle on (once torch and the
buffers are settled), and each process's last sample against its first: the issue's bar is
within +-10%.

once (issue 45): the Slurm and node-problem-detector mode. A healthy 20-cycle watch is made the
baseline; then --runs healthy `watch --once --baseline` runs, each judged alone (k = n = 1),
and --slowed more with a rank 10 ms late before every op. Prints each run's verdict, the late
rank's share of the op (how long the others waited for it over the op's time: judge.LATE_FLOOR
is the line a given baseline holds it to) and the stragglers named: the issue's bar is 0 of 30
healthy runs naming anyone, and every slowed run naming the slowed rank.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from procs import children, status_kib

ARGS = ["watch", "--sizes", "64K", "--iters", "10", "--timeout", "30"]


def _run_dir(out: Path) -> Path:
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return run_dir


def false_alarms(runs: int, cycles: int, workers: int) -> int:
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(runs):
            out = Path(tmp) / str(i)
            out.mkdir()
            done = subprocess.run([sys.executable, "-m", "distbench", *ARGS, "--interval", "0.2",
                                   "--count", str(cycles), "--workers", str(workers), "--out",
                                   str(out)], capture_output=True, text=True, timeout=900)
            lines = [json.loads(x) for x in
                     (_run_dir(out) / "watch.jsonl").read_text().splitlines()]
            alarms = [x["cycle"] for x in lines
                      if x["stragglers"] or x["verdict"] in ("warn", "fail")]
            changes = [c for x in lines for c in x["changes"] if "unknown ->" not in c]
            bad += bool(alarms or changes)
            print(f"run {i + 1}: {len(lines)} cycles, exit {done.returncode}, verdict "
                  f"{lines[-1]['verdict']}, false alarms in {len(alarms)} cycles, "
                  f"{len(changes)} state changes {changes[:3]}", flush=True)
    print(f"{bad} of {runs} runs raised an alarm or changed a state")
    return 1 if bad else 0


def _tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children(p)
    return out


def memory(cycles: int, interval: float, workers: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        proc = subprocess.Popen([sys.executable, "-m", "distbench", *ARGS, "--interval",
                                 str(interval), "--count", str(cycles), "--workers",
                                 str(workers), "--out", str(out)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, env=os.environ.copy())
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        while proc.poll() is None:
            time.sleep(1)
            try:
                done = sum(1 for _ in (_run_dir(out) / "watch.jsonl").open())
            except (OSError, ValueError):
                continue
            if done < 30 or done >= cycles:
                continue
            for pid in _tree(proc.pid):
                rss = status_kib(pid, "VmRSS")
                if rss:
                    first.setdefault(pid, rss)
                    last[pid] = rss
        proc.wait()
        worst = 0.0
        for pid, rss in first.items():
            change = last[pid] / rss - 1
            worst = max(worst, abs(change))
            print(f"pid {pid}: {rss / 1024:.1f} MiB at cycle 30, {last[pid] / 1024:.1f} MiB near "
                  f"the end ({change:+.1%})")
        print(f"{cycles} cycles at {interval:g} s, exit {proc.returncode}: the largest change "
              f"{worst:.1%} (bar: 10%)")
        return 0 if first and worst <= 0.10 else 1


def _once(out: Path, baseline: Path, workers: int, env: dict[str, str]
          ) -> tuple[dict | None, int, str]:
    """(the one cycle's line, or None where the run measured none; exit code; its last line)"""
    out.mkdir()
    done = subprocess.run([sys.executable, "-m", "distbench", *ARGS, "--once", "--baseline",
                           str(baseline), "--workers", str(workers), "--out", str(out)],
                          capture_output=True, text=True, timeout=300, env=env)
    said = (done.stderr.strip().splitlines() or [""])[-1]
    try:
        (line,) = [json.loads(x) for x in
                   (_run_dir(out) / "watch.jsonl").read_text().splitlines()]
    except (OSError, ValueError):
        return None, done.returncode, said
    return line, done.returncode, said


def once(runs: int, slowed: int, workers: int) -> int:
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "baseline"
        base.mkdir()
        subprocess.run([sys.executable, "-m", "distbench", *ARGS, "--interval", "0.2", "--count",
                        "20", "--workers", str(workers), "--out", str(base)], check=True,
                       capture_output=True, timeout=600)
        for kind, n, env in (("healthy", runs, os.environ.copy()),
                             ("slowed", slowed, {**os.environ, "DISTBENCH_TEST_SLOW_RANK":
                                                 f"{workers - 1}:0.01"})):
            named = failed = 0
            for i in range(n):
                line, code, said = _once(Path(tmp) / f"{kind}{i}", _run_dir(base), workers, env)
                if line is None:
                    failed += 1
                    print(f"{kind} {i + 1}: exit {code}, no cycle measured: {said}", flush=True)
                    continue
                p = line["probes"][0]
                share = p["lateness_us"] / p["time_us"] if p["time_us"] else float("nan")
                named += bool(line["stragglers"])
                print(f"{kind} {i + 1}: exit {code}, verdict {line['verdict']}, late rank "
                      f"{p['late_rank']} kept the others {share:.3f} of the op, stragglers "
                      f"{line['stragglers']}", flush=True)
            print(f"{kind}: {named} of {n - failed} runs that measured named a straggler "
                  f"({failed} measured nothing)", flush=True)
            bad += failed + (named if kind == "healthy" else n - failed - named)
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    fa = sub.add_parser("false-alarms")
    fa.add_argument("--runs", type=int, default=3)
    fa.add_argument("--cycles", type=int, default=30)
    fa.add_argument("--workers", type=int, default=2)
    mem = sub.add_parser("memory")
    mem.add_argument("--cycles", type=int, default=300)
    mem.add_argument("--interval", type=float, default=0.05)
    mem.add_argument("--workers", type=int, default=2)
    one = sub.add_parser("once")
    one.add_argument("--runs", type=int, default=30)
    one.add_argument("--slowed", type=int, default=5)
    one.add_argument("--workers", type=int, default=2)
    a = ap.parse_args(argv)
    if a.what == "once":
        return once(a.runs, a.slowed, a.workers)
    if a.what == "false-alarms":
        return false_alarms(a.runs, a.cycles, a.workers)
    return memory(a.cycles, a.interval, a.workers)


if __name__ == "__main__":
    sys.exit(main())
