"""The commands, registered here and nowhere else: one table, statically imported, from a name to
its options, its per-rank body (run under a launcher, with a Session) and, where it has one, its
local body (run on this machine without starting workers); and the tools that read results
back (TOOLS). Command modules import torch only inside their bodies, so
the command line can be built and validated from this table without it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from distbench.cli.commands import (
    accept,
    collective,
    compare,
    dp,
    p2p,
    plan,
    pp,
    report,
    step,
    topo,
    tp,
    watch,
)
from distbench.core.options import RunOptions
from distbench.run.forked_workers import TRAINING


@dataclass(frozen=True)
class Command:
    help: str
    options: type[RunOptions]
    run: Callable[..., int]  # (Session) -> exit code, on every rank
    run_local: Callable[[RunOptions], int] | None = None  # (options) -> exit code
    # (options) -> exit code, for --dry-run: what the run would do, with no worker and no file
    dry_run: Callable[[RunOptions], int] | None = None
    # (options, exit code) -> what the local launcher exits with (watch --npd's plugin codes)
    exit_code: Callable[[RunOptions, int], int] | None = None
    # command lines shown under --help, each whole on one line at 80 columns
    examples: tuple[str, ...] = ()
    # modules each worker imports at a cost: imported once by a launcher that forks its
    # workers (run/forked_workers.py), not once per worker
    preload: tuple[str, ...] = ()


COMMANDS: dict[str, Command] = {
    "collective": Command(collective.HELP, collective.CollectiveOptions, collective.run,
                          examples=collective.EXAMPLES),
    "p2p": Command(p2p.HELP, p2p.P2POptions, p2p.run, examples=p2p.EXAMPLES),
    "topo": Command(topo.HELP, topo.TopoOptions, topo.run, topo.run_local,
                    examples=topo.EXAMPLES),
    "tp": Command(tp.HELP, tp.TPOptions, tp.run, examples=tp.EXAMPLES, preload=TRAINING),
    "pp": Command(pp.HELP, pp.PPOptions, pp.run, examples=pp.EXAMPLES),
    "dp": Command(dp.HELP, dp.DPOptions, dp.run, examples=dp.EXAMPLES, preload=TRAINING),
    "step": Command(step.HELP, step.StepCommandOptions, step.run, examples=step.EXAMPLES,
                    preload=TRAINING),
    "accept": Command(accept.HELP, accept.AcceptOptions, accept.run, dry_run=accept.dry_run,
                      examples=accept.EXAMPLES),
    "plan": Command(plan.HELP, plan.PlanOptions, plan.run, plan.run_local,
                    examples=plan.EXAMPLES, preload=plan.PRELOAD),
    "watch": Command(watch.HELP, watch.WatchOptions, watch.run, exit_code=watch.exit_code,
                     examples=watch.EXAMPLES),
}

# The commands that read results back (no launcher, no option dataclass): each module's HELP and
# `command`, registered under the module's name.
TOOLS = (report, compare)
