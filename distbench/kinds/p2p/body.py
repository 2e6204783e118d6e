"""`distbench p2p`'s runs: what each rank does under a launcher, and what runs here
without workers. torch is imported inside them, when a run starts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distbench.core.exitcodes import EXIT_BELOW, EXIT_OK
from distbench.core.tables import percent, plural
from distbench.kinds.p2p.output import MATRIX_OUTPUT, OUTPUT

if TYPE_CHECKING:
    from distbench.run.session import Session


def run(s: Session) -> int:
    """Per rank, under a launcher."""
    from distbench.bench import engine, series
    from distbench.bench.measure import fail_if_wrong

    opts = s.opts
    todo = [series.p2p_pattern(s, pattern, dtype, OUTPUT)
            for pattern in ("ring", "pingpong") if pattern in opts.patterns
            for dtype in opts.dtypes]
    links: list = []
    if "matrix" in opts.patterns:
        todo += [series.matrix(s, dtype, MATRIX_OUTPUT, links) for dtype in opts.dtypes]
    bad = engine.run(s, todo)
    if "matrix" in opts.patterns:
        _judge(s, links)  # slow links fail the run before wrong results do
    fail_if_wrong(bad)
    if opts.baseline:
        from distbench.bench.baseline_gate import judge

        judge(s)
    return EXIT_OK


def _judge(s, links) -> None:
    from distbench.results.links import blind_spots, culprits, find_outliers, references
    from distbench.run.runtime import RunFailure

    opts, console = s.opts, s.console
    # one reference per class for both thresholds; a hardware profile's expectation, when there
    # is one, goes in here in place of the derived one
    refs = references(links)
    outliers = find_outliers(links, opts.outlier_below, refs)
    suspects = culprits(outliers, {r["rank"]: r["gpu_bus_id"] for r in s.rt.ranks
                                   if r.get("gpu_bus_id")})
    failing = find_outliers(links, opts.fail_below, refs) if opts.fail_below else []
    cannot_tell = blind_spots(links)
    if outliers:
        console.log(f"{len(outliers)} of {plural(len(links), 'link')} below "
                    f"{percent(opts.outlier_below)} of "
                    "what the healthy links of their class reach:")
        for o in outliers[:20]:
            console.log(f"  slow link {o.describe()}")
        for name in suspects:
            console.log(f"  likely culprit: {name}")
    else:
        console.log(f"matrix: no link below {percent(opts.outlier_below)} of what the healthy "
                    f"links of its class reach ({plural(len(links), 'link')})")
    for line in cannot_tell:
        console.log(f"matrix: cannot tell: {line}")
    if s.record is not None:
        s.record.update(matrix={
            "outlier_below": opts.outlier_below, "links": len(links),
            "outliers": [o.describe() for o in outliers], "culprits": suspects,
            "fail_below": opts.fail_below, "failing": [o.describe() for o in failing],
            "references": [{"direction": d, "size_bytes": size, "link": kind, "gbps": ref.gbps,
                            "basis": ref.basis} for (d, size, kind), ref in refs.items()],
            "cannot_tell": cannot_tell})
    if failing:
        raise RunFailure(
            f"{plural(len(failing), 'link')} below --fail-below {percent(opts.fail_below)} of "
            "what the healthy "
            f"links of their class reach, the worst {failing[0].describe()}"
            + (f"; likely culprit {suspects[0]}" if suspects else ""),
            status="slow_links", exit_code=EXIT_BELOW)
