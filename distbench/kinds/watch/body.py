"""`distbench watch`'s runs: what each rank does under a launcher, and what runs here
without workers. torch is imported inside them, when a run starts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distbench.core.exitcodes import EXIT_BELOW, EXIT_OK
from distbench.kinds.watch.health import NPD_OK, NPD_PROBLEM, NPD_UNKNOWN
from distbench.kinds.watch.options import WatchOptions

if TYPE_CHECKING:
    from distbench.run.session import Session

# node-problem-detector's custom plugin codes for distbench's: OK, a problem, unknown
NPD_CODES = {EXIT_OK: NPD_OK, EXIT_BELOW: NPD_PROBLEM}


def exit_code(opts: WatchOptions, code: int) -> int:
    """What the local launcher exits with: with --npd, node-problem-detector's 0, 1 or 2 (any
    other outcome, a failure or bad input included, is "unknown" to it)."""
    return NPD_CODES.get(code, NPD_UNKNOWN) if opts.npd else code


def run(s: Session) -> int:
    from distbench.kinds.watch.loop import run as loop

    return loop(s)
