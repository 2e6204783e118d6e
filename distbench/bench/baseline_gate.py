"""The end of a sweep run with --baseline: rank 0 compares this run with the baseline
(results.baseline), and every rank ends with exit 4 when a row is worse beyond the threshold
and the noise."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distbench.core.exitcodes import EXIT_BELOW
from distbench.results import compare
from distbench.results.baseline import print_comparison
from distbench.run.peers import agree
from distbench.run.runtime import RunFailure

if TYPE_CHECKING:
    from distbench.run.session import Session


def judge(s: Session) -> None:
    """Every rank, once every row is written."""
    worse: list[compare.Row] = []
    s.phase("comparison with --baseline", s.opts.timeout)
    if s.run_dir is not None:
        c = print_comparison(s, compare.DEFAULT_THRESHOLD)
        if isinstance(c, str):
            s.record.update(baseline={"path": s.opts.baseline, "error": c})
        else:
            worse = c.worse
            s.record.update(baseline={
                "path": s.opts.baseline, "metric": c.metric.name, "threshold": c.threshold,
                "rows": len(c.rows), "worse": len(worse),
                "better": sum(r.mark == "+" for r in c.rows)})
    if not agree(not worse, s.rt.device):
        first = f"; the first: {worse[0].group} {worse[0].label}" if worse else ""
        raise RunFailure(f"{len(worse) or 'some'} rows worse than --baseline by more than "
                         f"{compare.DEFAULT_THRESHOLD:.0%} and beyond the noise{first}",
                         status="below_expectation", exit_code=EXIT_BELOW)
