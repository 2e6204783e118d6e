"""`distbench watch`: a small fixed set of probes measured every --interval by one launch that
keeps its process group, judged against a baseline with hysteresis, the ranks the others wait
for named, and the state written where operators look (a Prometheus textfile, watch.jsonl,
watch.csv). The loop is distbench/kinds/watch/loop.py; this module holds the options."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from distbench.core.dtypes import NAMES as DTYPES
from distbench.core.options import (
    OptionError,
    RunOptions,
    at_least,
    check_writable_dir,
    iterations,
    one_of,
    option,
    optional,
    pick,
    require,
    sizes,
)
from distbench.core.sizes import format_size
from distbench.kinds.watch.judge import WARM
from distbench.kinds.watch.records import Probe
from distbench.ops.collectives import names
from distbench.platform import env

if TYPE_CHECKING:
    pass

HELP = ("Watch the fabric over time: probes every --interval, judged with hysteresis, "
        "stragglers named, a Prometheus textfile.")
EXAMPLES = (
    "distbench watch --textfile /var/lib/node_exporter/textfile/distbench.prom",
    "distbench watch --interval 2 --count 30 --workers 2   # then a verdict",
    "distbench watch --once --baseline results/<run>      # a node health check",
    "distbench watch --profile cpu-gloo --baseline results/<an accept run>",
)

# what fits one Slurm HealthCheckProgram run (killed after 60 s) with room for the start
ONCE_CYCLES = 1
MAX_SIZE = 1 << 30  # a probe is a health check, not a sweep: it must stay cheap every cycle
# the probes without --profile, --op, --sizes or --dtype (those default to None, so that one
# given beside --profile is told from one left out)
DEFAULT_OPS, DEFAULT_SIZES, DEFAULT_DTYPE = ("all_reduce",), (1 << 20,), "float32"
MAX_TOLERANCE = 10.0


def _optional(check):
    """`check`, letting None (left out) through; its example and choices kept."""
    return optional(check)


def _positive_seconds(example: str, optional: bool = False):
    return require(lambda v: v > 0 and math.isfinite(v), "must be a number of seconds above 0, "
                   "got {value}", example, float, optional)


@dataclass(kw_only=True)
class WatchOptions(RunOptions):
    ops: list[str] | None = option(
        None, lambda: f"Probe collectives, comma-separated: {', '.join(names())}. Default: "
        "all_reduce.", flag="op", check=_optional(pick(names, "--op all_reduce,all_gather")),
        cli_type=str, show_default=False)
    sizes: list[int] | None = option(
        None, "Probe sizes (a list: 64K,16M; binary suffixes), as collective --sizes counts "
        "them: each rank's buffer, the larger of send and receive, so all_gather's is its whole "
        "output and reduce_scatter's its whole input, one block of it per rank. Default: 1M.",
        check=_optional(sizes("--sizes 1M,64M")), cli_type=str, show_default=False)
    dtype: str | None = option(None, "The probes' dtype. Default: float32.",
                               check=_optional(one_of(DTYPES, "--dtype float32")),
                               show_default=False)
    profile: str | None = option(
        None, "An accept profile, a built-in's name or a TOML file (docs/accept-profiles.md): its "
        "cluster-scope collective checks are the probes, each at its op, size and dtype. Not "
        "with --op, --sizes or --dtype.", cli_type=str, show_default=False)
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
                              check=require(lambda v: 0 < v < MAX_TOLERANCE,
                                            f"must be above 0 and below {MAX_TOLERANCE:g} (a "
                                            f"fraction: 0.15 is 15% slower), got {{value}}",
                                            "--tolerance 0.15", float))
    baseline: Path | None = option(
        None, "An earlier watch run's directory (each probe's median time there) or an accept "
        "run's (the time of its check of the same op, size and dtype on every rank): the "
        "baseline. One measured on another number of ranks or dtype is refused.", cli_type=str,
        show_default=False)
    textfile: Path | None = option(
        None, "Prometheus textfile to keep current (node_exporter's textfile collector reads "
        "*.prom in its directory); each node's first rank writes its own.", cli_type=str,
        show_default=False)
    drain: bool = option(False, "On a fail verdict or a straggler named, print the scontrol "
                         "line that drains the nodes named, and run it where scontrol exists.")
    check: bool = option(True, "Check each probe's result every cycle (wrong data fails it).")
    npd: bool = option(False, "Kubernetes node-problem-detector plugin mode: one message line "
                       "of at most 80 characters; exit 0 OK, 1 problem, 2 unknown.")

    def validate(self) -> None:
        if self.profile is not None:
            given = [f for f, v in (("--op", self.ops), ("--sizes", self.sizes),
                                    ("--dtype", self.dtype)) if v is not None]
            if given:
                raise OptionError("--profile", f"takes the probes from the profile's checks "
                                  f"(op, size, dtype): not with {given[0]}",
                                  "--profile cpu-gloo")
        else:
            # what run.json records, and the workers are handed, as if typed
            self.ops = list(DEFAULT_OPS) if self.ops is None else self.ops
            self.sizes = list(DEFAULT_SIZES) if self.sizes is None else self.sizes
            self.dtype = DEFAULT_DTYPE if self.dtype is None else self.dtype
        if self.agree > self.last:
            raise OptionError("--agree", f"must be at most --last ({self.last}), got "
                              f"{self.agree}", "--agree 3 --last 5")
        probes = probes_of(self)
        too_big = [s for s in self.sizes or () if s > MAX_SIZE]
        if too_big:
            raise OptionError("--sizes", f"a probe runs every cycle: at most 1G, got "
                              f"{too_big[0]} bytes", "--sizes 1M,64M")
        if self.once and (self.count is not None or self.duration is not None):
            raise OptionError("--once", "is one cycle: not with --count or --duration",
                              "--once --baseline results/<run>")
        if self.textfile is not None:
            _check_textfile(self.textfile)
        if self.baseline is not None:
            from distbench.kinds.watch import probe_baseline

            # what needs no world size; check_world does the rest once it is known
            probe_baseline.check(self.baseline, probes, None, self.once)

    def check_world(self, world: int) -> None:
        """A baseline measured on another number of ranks: refused before any worker starts
        where the world is known then (--workers, the local launcher's count, a launcher's
        WORLD_SIZE), else by each rank before it measures anything."""
        if self.baseline is None:
            return
        from distbench.kinds.watch import probe_baseline

        _warn(probe_baseline.check(self.baseline, probes_of(self), world, self.once))

    def host_bytes(self, backend: str, world: int) -> int:
        if backend == "nccl":
            return 0
        return 3 * max(p.size_bytes for p in probes_of(self)) * max(world, 1)

    SIZED_BY = ("--sizes", "--sizes 1M")


def profile_probes(spec: str) -> list[Probe]:
    """An accept profile's cluster-scope collective checks as probes: one per op, size and
    dtype (two metrics of one measurement are one probe). A cycle measures one collective on
    every rank, which is what a cluster check measures; node and pair checks run on parts of
    the world, and p2p ones are no collective. Raises OptionError."""
    from distbench.kinds.accept import profile_files, profile_model

    example = "--profile cpu-gloo"
    if str(spec).strip().lower() == profile_model.AUTO:
        raise OptionError("--profile", f"auto picks a profile by the GPUs the workers find, "
                          f"and watch takes its probes before any starts: name one "
                          f"({', '.join(profile_files.available())}) or a file", example)
    profile = profile_files.resolve(spec)
    assert profile is not None  # only auto resolves to None
    found: dict[str, Probe] = {}
    for c in profile.checks:
        if c.command != "collective" or c.scope != "cluster":
            continue
        if c.size > MAX_SIZE:
            raise OptionError("--profile", f"{profile.name}'s check {c.name!r} measures "
                              f"{format_size(c.size)}, and a probe runs every cycle: at most "
                              f"1G (watch that check's op with --op and --sizes)", example)
        probe = Probe(c.op, c.size, "cluster", c.dtype)
        first = found.setdefault(probe.key, probe)
        if first.dtype != probe.dtype:
            raise OptionError("--profile", f"{profile.name} checks {c.op} "
                              f"{format_size(c.size)} in {first.dtype} and in {c.dtype}: a "
                              f"watch probe is one op at one size, in one dtype", example)
    if not found:
        raise OptionError("--profile", f"{profile.name} has no cluster-scope collective check "
                          f"to probe (a cycle measures one collective on every rank; node, pair "
                          f"and p2p checks are accept's alone)", example)
    return list(found.values())


def _check_textfile(text: str) -> None:
    example = "--textfile /var/lib/node_exporter/distbench.prom"
    path = Path(text)
    if path.suffix != ".prom":
        raise OptionError("--textfile", f"node_exporter reads only *.prom files, got {text!r}",
                          example)
    if path.is_dir():
        raise OptionError("--textfile", f"{text!r} is a directory: name the file to write in "
                          f"it ({str(path / 'distbench.prom')!r})", example)
    if path.exists() and not path.is_file():
        raise OptionError("--textfile", f"{text!r} is not a regular file", example)
    if not path.parent.is_dir():
        raise OptionError("--textfile", f"no directory {str(path.parent)!r}", example)
    check_writable_dir("--textfile", path.parent, "--textfile /tmp/distbench.prom")


def _speaks() -> bool:
    """Whether this process says what the options' checks find: the one the user started, not
    a worker our launcher started (it checked them first), and under another launcher rank 0."""
    return not env.started_by_us() and env.reads_files()


_WARNED: set[str] = set()  # each said once: the options' world is checked up to three times


def _warn(lines: list[str]) -> None:
    for line in lines:
        if line not in _WARNED and _speaks():
            _WARNED.add(line)
            print(f"distbench: warning: {line}", file=sys.stderr, flush=True)


def npd_asked(args: list[str]) -> bool:
    """Whether a command line is `watch ... --npd`: its refusal owes node-problem-detector a
    stdout line (health.npd_refusal) whichever check refused it."""
    return bool(args) and args[0] == "watch" and any(a in ("--npd", "--npd=true") for a in args)


def probes_of(opts) -> list[Probe]:
    """What every cycle measures, in order: --profile's checks, else --op x --sizes."""
    if opts.profile is not None:
        return profile_probes(opts.profile)
    dtype = opts.dtype or DEFAULT_DTYPE
    return [Probe(op, size, "cluster", dtype) for op in opts.ops or DEFAULT_OPS
            for size in opts.sizes or DEFAULT_SIZES]

def cycles_of(opts) -> int | None:
    return ONCE_CYCLES if opts.once else opts.count
