"""--baseline RUN_DIR for collective and p2p: at the end of the run, the same comparison as
`distbench compare BASE <this run>`, printed, recorded in run.json, and a significant slowdown
beyond the threshold ends the run with exit 4 on every rank."""

from __future__ import annotations

from pathlib import Path

from distbench.options import OptionError, with_example

EXAMPLE = "--baseline results/<run>"


def option_check(table: str):
    """Validates --baseline before any worker starts: a directory whose `table` can be read."""
    def check(option: str, value) -> str | None:
        if value is None:
            return None
        from distbench import rundirs
        from distbench.reading import ReadError

        path = Path(str(value))
        try:
            run = rundirs.load(path)
        except ReadError as e:
            raise OptionError(option, str(e), EXAMPLE) from None
        if table not in run.tables:
            raise OptionError(option, f"no {table} in {str(path)!r} (a previous run of the same "
                              "command)", EXAMPLE)
        return str(path)
    return with_example(check, EXAMPLE)


def judge(s) -> None:
    """Every rank, once every row is written."""
    from distbench import compare, rundirs
    from distbench.exitcodes import EXIT_BELOW
    from distbench.memory import agree
    from distbench.reading import ReadError
    from distbench.runtime import RunFailure

    worse: list[compare.Row] = []
    s.step("comparison with --baseline", s.opts.timeout)
    if s.run_dir is not None:
        base, new = rundirs.load(Path(s.opts.baseline)), rundirs.load(s.run_dir)
        try:
            c = compare.compare(base, new)
        except ReadError as e:  # nothing in common: said, not a failure of the run
            s.console.log(f"--baseline: cannot compare: {e}")
        else:
            s.console.lines(compare.format_text(c, base, new))
            worse = c.worse
            s.record.update(baseline={
                "path": s.opts.baseline, "metric": c.metric.name, "threshold": c.threshold,
                "rows": len(c.rows), "worse": len(worse),
                "better": sum(r.mark == "+" for r in c.rows)})
    if not agree(not worse, s.rt.device):
        first = f"; the first: {worse[0].group} {worse[0].label}" if worse else ""
        raise RunFailure(f"{len(worse) or 'some'} rows worse than --baseline by more than "
                         f"{compare.DEFAULT_THRESHOLD:.0%} and significant{first}",
                         status="below_expectation", exit_code=EXIT_BELOW)
