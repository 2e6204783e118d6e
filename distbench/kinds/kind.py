"""`Kind`: one command, all in one place. What the command line is built from (its help, its
options, its examples), what runs on every rank or on this machine (its bodies), the CSVs it
writes (its contracts) and what report and compare make of its runs (its section of report.md,
its plots, its fits). distbench/kinds/__init__.py registers every kind; the generic boxes below
are handed kinds and never name one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from distbench.core.tables import Output

if TYPE_CHECKING:
    from pathlib import Path

    from distbench.core.options import RunOptions
    from distbench.results.reader import Run


@dataclass(frozen=True)
class Kind:
    name: str
    help: str = ""
    # the options dataclass (None for a tool such as report, whose Typer function is `command`)
    options: type[RunOptions] | None = None
    run: Callable[..., int] | None = None  # (Session) -> exit code, on every rank
    run_local: Callable[[RunOptions], int] | None = None  # (options) -> exit code, no workers
    # (options) -> whether run_local runs it here with no worker (plan from earlier runs); None:
    # always, where there is a run_local
    local: Callable[[RunOptions], bool] | None = None
    # (options) -> exit code, for --dry-run: what the run would do, with no worker and no file
    dry_run: Callable[[RunOptions], int] | None = None
    # (options, exit code) -> what the local launcher exits with (watch --npd's plugin codes)
    exit_code: Callable[[RunOptions, int], int] | None = None
    # command lines shown under --help, each whole on one line at 80 columns
    examples: tuple[str, ...] = ()
    # modules each worker imports at a cost: imported once by a launcher that forks its
    # workers (run/forked_workers.py), not once per worker
    preload: tuple[str, ...] = ()
    # a tool that reads results back: its own Typer function, no launcher, no options dataclass
    command: Callable[..., None] | None = None
    # the CSVs it writes, in the order report shows them and compare compares them
    outputs: tuple[Output, ...] = ()
    # what report makes of a run (results.report.Reported): each reads the tables it knows,
    # whichever command wrote them
    section: Callable[[Run], list[str]] | None = None
    plots: Callable[[list[Run], Path], list[Path]] | None = None
    fits: Callable[[Run], list[dict]] | None = None
    world_note: Callable[[Run], str] | None = None
