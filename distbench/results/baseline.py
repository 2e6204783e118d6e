"""--baseline RUN_DIR for collective and p2p: at the end of the run, the same comparison as
`distbench compare BASE <this run>`, printed, recorded in run.json, and a slowdown beyond both
the threshold and the noise the two runs show ends the run with exit 4 on every rank (that
gate, which needs the ranks, is bench.baseline_gate)."""

from __future__ import annotations

import functools
from pathlib import Path

from distbench.core.options import OptionError, with_example
from distbench.platform import env

EXAMPLE = "--baseline results/<run>"


@functools.lru_cache(maxsize=4)
def load(value: str | None, tables: tuple[str, ...]):
    """The baseline run, with rows in one of `tables`; raises OptionError. Read once per
    process: the option check and each check_world (flags, local launcher) ask again."""
    from distbench.core.errors import ReadError
    from distbench.results import reader

    path = Path(str(value))
    try:
        run = reader.load(path)
    except ReadError as e:
        raise OptionError("--baseline", str(e), EXAMPLE) from None
    if not any(t in run.tables and len(run.tables[t]) for t in tables):
        raise OptionError("--baseline", f"no rows of {' or '.join(tables)} in {str(path)!r} "
                          "(a previous run of the same command)", EXAMPLE)
    return run


def option_check(*tables: str):
    """Validates --baseline before any worker starts: a directory with rows in one of
    `tables`."""
    def check(option: str, value) -> str | None:
        if value is None:
            return None
        if env.reads_files():
            load(value, tables)
        return str(value)
    return with_example(check, EXAMPLE)


def check_world(value: str | None, tables: tuple[str, ...], world: int) -> None:
    """A baseline measured at another world size has no row to compare: refused now, not
    found out after the whole sweep."""
    if value is None or not env.reads_files():
        return
    run = load(value, tables)
    sizes = sorted({int(w) for t in tables if t in run.tables
                    for w in run.tables[t]["world_size"].dropna()})
    if world not in sizes:
        raise OptionError("--baseline", f"{value!r} was measured on "
                          f"{', '.join(map(str, sizes)) or 'no'} ranks, this run has {world}: "
                          "no row to compare", EXAMPLE)


def print_comparison(s, threshold: float):
    """Rank 0 (the rank with a run directory): this run beside --baseline, as distbench compare
    shows it. The Comparison, or why nothing could be compared (said on the console too)."""
    from distbench.core.errors import ReadError
    from distbench.results import compare, comparison_text, reader

    try:
        base, new = reader.load(Path(s.opts.baseline)), reader.load(s.run_dir)
        c = compare.compare(base, new, threshold=threshold)
    except ReadError as e:  # nothing in common: said, not a failure of the run
        s.console.log(f"warning: --baseline: cannot compare: {e}")
        return str(e)
    s.console.lines(comparison_text.format_text(c, base, new))
    return c
