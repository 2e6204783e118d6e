"""The commands, registered here and nowhere else: a new command is a folder beside these
(its options, its body, its output) and one line below. Each kind's package imports no torch
and no pandas when loaded, so the command line is built and checked from this registry alone."""

from __future__ import annotations

from distbench.kinds import (
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
from distbench.kinds.registry import KINDS, commands, register, tools

for _module in (collective, p2p, topo, tp, pp, dp, step, accept, plan, watch, report, compare):
    register(_module.KIND)

__all__ = ["KINDS", "commands", "register", "tools"]
