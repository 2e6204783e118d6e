"""`distbench watch`: a small fixed set of probes measured every --interval by one launch that
keeps its process group, judged against a baseline with hysteresis, the ranks the others wait
for named, and the state written where operators look (a Prometheus textfile, watch.jsonl,
watch.csv). The loop is distbench/watch/loop.py; this module holds the options."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from distbench.core.dtypes import NAMES as DTYPES
from distbench.core.exitcodes import EXIT_BELOW, EXIT_OK
from distbench.core.options import (
    OptionError,
    RunOptions,
    at_least,
    check_writable_dir,
    iterations,
    one_of,
    option,
    pick,
    require,
    sizes,
)
from distbench.ops.collectives import names
from distbench.watch.judge import WARM

if TYPE_CHECKING:
    from distbench.run.session import Session

HELP = ("Watch the fabric over time: probes every --interval, judged with hysteresis, "
        "stragglers named, a Prometheus textfile.")
EXAMPLES = (
    "distbench watch --textfile /var/lib/node_exporter/textfile/distbench.prom",
    "distbench watch --interval 2 --count 30 --workers 2   # then a verdict",
    "distbench watch --once --baseline results/<run>      # a node health check",
)

# what fits one Slurm HealthCheckProgram run (killed after 60 s) with room for the start
ONCE_CYCLES = 1
MAX_SIZE = 1 << 30  # a probe is a health check, not a sweep: it must stay cheap every cycle


def _positive_seconds(example: str, optional: bool = False):
    return require(lambda v: v > 0 and math.isfinite(v), "must be a number of seconds above 0, "
                   "got {value}", example, float, optional)


@dataclass(kw_only=True)
class WatchOptions(RunOptions):
    ops: list[str] = option(
        "all_reduce", lambda: f"Probe collectives, comma-separated: {', '.join(names())}.",
        flag="op", check=pick(names, "--op all_reduce,all_gather"), cli_type=str)
    sizes: list[int] = option("1M", "Probe sizes per rank (a list: 64K,16M). Binary suffixes.",
                              check=sizes("--sizes 1M,64M"), cli_type=str)
    dtype: str = option("float32", "The probes' dtype.", check=one_of(DTYPES, "--dtype float32"))
    iters: int = option(20, "Timed ops of each probe per cycle.",
                        check=iterations("--iters 20"))
    interval: float = option(10.0, "Seconds from one cycle's start to the next's.",
                             check=_positive_seconds("--interval 10"))
    count: int | None = option(None, "Stop after this many cycles (default: until --duration "
                               "or SIGTERM).", check=at_least(1, "--count 30", optional=True),
                               show_default=False)
    duration: float | None = option(None, "Stop after this many seconds.",
                                    check=_positive_seconds("--duration 3600", optional=True),
                                    show_default=False)
    once: bool = option(False, "One cycle, judged against --baseline (--agree = --last = "
                        "1): a node health check within Slurm's 60 s.")
    window: int = option(20, "Cycles the rolling median, p95 and coefficient of variation "
                         "cover.", check=at_least(2, "--window 20"))
    # not --k/--n: torchrun would take --n for its own --nnodes or --nproc-per-node
    agree: int = option(3, "A state changes when --agree of the --last cycles agree (and "
                        "clears after --agree clean ones); a rank the others waited for in "
                        "--agree of --last is a straggler.", check=at_least(1, "--agree 3"))
    last: int = option(5, "See --agree.", check=at_least(1, "--last 5"))
    warm: int = option(WARM, "Without --baseline, the first cycles whose median is the "
                       "baseline (fewer: false alarms on a noisy machine, judge.WARM says how "
                       "many).", check=at_least(1, "--warm 20"))
    tolerance: float = option(0.15, "Worse than the baseline by more than this (and beyond "
                              "the noise) warns; by twice this fails.",
                              check=require(lambda v: 0 < v < 10, "must be above 0, got "
                                            "{value}", "--tolerance 0.15", float))
    baseline: str | None = option(None, "A previous watch run directory: each probe's median "
                                  "there is its baseline.", cli_type=str, show_default=False)
    textfile: str | None = option(
        None, "Prometheus textfile to keep current (node_exporter's textfile collector reads "
        "*.prom in its directory); each node's first rank writes its own.", cli_type=str,
        show_default=False)
    drain: bool = option(False, "On a fail verdict, print the scontrol line that drains the "
                         "nodes named, and run it where scontrol exists.")
    check: bool = option(True, "Check each probe's result every cycle (wrong data fails it).")
    npd: bool = option(False, "Kubernetes node-problem-detector plugin mode: one message line "
                       "of at most 80 characters; exit 0 OK, 1 problem, 2 unknown.")

    def validate(self) -> None:
        if self.agree > self.last:
            raise OptionError("--agree", f"must be at most --last ({self.last}), got "
                              f"{self.agree}", "--agree 3 --last 5")
        too_big = [s for s in self.sizes if s > MAX_SIZE]
        if too_big:
            raise OptionError("--sizes", f"a probe runs every cycle: at most 1G, got "
                              f"{too_big[0]} bytes", "--sizes 1M,64M")
        if self.interval >= self.timeout:
            raise OptionError("--interval", f"the ranks wait for the next cycle in a collective, "
                              f"which --timeout ({self.timeout:g} s) ends: --interval must be "
                              f"shorter, got {self.interval:g}", "--interval 10 --timeout 300")
        if self.once and (self.count is not None or self.duration is not None):
            raise OptionError("--once", "is one cycle: not with --count or --duration",
                              "--once --baseline results/<run>")
        if self.textfile is not None:
            path = Path(self.textfile)
            if path.suffix != ".prom":
                raise OptionError("--textfile", f"node_exporter reads only *.prom files, got "
                                  f"{self.textfile!r}", "--textfile /var/lib/node_exporter/"
                                  "distbench.prom")
            if not path.parent.is_dir():
                raise OptionError("--textfile", f"no directory {str(path.parent)!r}",
                                  "--textfile /var/lib/node_exporter/distbench.prom")
            check_writable_dir("--textfile", path.parent, "--textfile /tmp/distbench.prom")
        if self.baseline is not None:
            from distbench.watch.probe_baseline import read_baseline

            read_baseline(self.baseline)  # refused now, one line, when unreadable

    def host_bytes(self, backend: str, world: int) -> int:
        return 0 if backend == "nccl" else 3 * max(self.sizes) * max(world, 1)

    SIZED_BY = ("--sizes", "--sizes 1M")

    def cycles(self) -> int | None:
        return ONCE_CYCLES if self.once else self.count


# node-problem-detector's custom plugin codes for distbench's: OK, a problem, unknown
NPD_CODES = {EXIT_OK: 0, EXIT_BELOW: 1}
NPD_UNKNOWN = 2


def exit_code(opts: WatchOptions, code: int) -> int:
    """What the local launcher exits with: with --npd, node-problem-detector's 0, 1 or 2 (any
    other outcome, a failure or bad input included, is "unknown" to it)."""
    return NPD_CODES.get(code, NPD_UNKNOWN) if opts.npd else code


def run(s: Session) -> int:
    from distbench.watch.loop import run as loop

    return loop(s)
