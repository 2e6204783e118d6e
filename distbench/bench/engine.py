"""The sweep engine. A command declares what it measures as Series, one per table section
(an op with its dtype, redop and placement; a p2p pattern; the link matrix at a dtype); the
engine owns the rest: the skip rules (the backend cannot run it, a size too small for the rank
count, a size that does not fit in memory), the buffers, each measurement, the row, the CSV
sink, the console table and the progress bar."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from distbench.bench import timing
from distbench.bench.measure import Settings, Skipped, measure_case, stats_columns
from distbench.core.accounting import Accounting, Buffer, bandwidth, buffer_of
from distbench.core.errors import one_line
from distbench.core.tables import Output, format_row, format_table
from distbench.ops.case import Case
from distbench.run.buffers import allocate_fitting, release
from distbench.run.peers import agree

if TYPE_CHECKING:
    from distbench.run.session import Session

NO_FIT = "does not fit in device memory"


@dataclass
class Point:
    """One measurement at one size; `columns` turns its statistics into the row's cells."""

    what: str  # names it in progress, errors and timeouts
    case: Case
    columns: Callable[[timing.Stats], dict]
    scale: float = 1.0  # timed call -> reported time (0.5: one way of a round trip)
    steps: int = 1  # progress steps it stands for


@dataclass
class Series:
    """The same measurement over every size of the sweep."""

    name: str  # what setup steps are called: "all_reduce float32"
    output: Output
    title: str | None  # the console section; None: the rows go to the CSV only
    accounting: Accounting
    elt: int  # element size in bytes
    alloc: Callable[[int], Any]  # per-rank element count -> buffers
    points: Callable[[Any, Buffer], list[Point]]
    row: dict  # the cells every row of the series shares
    too_small: str  # the skip note for a size that gives a rank no element
    steps_per_size: int = 1
    skip: str = ""  # decided before any measurement: every size is skipped
    probe: Callable[[], Case] | None = None  # one element: can the backend run this at all?
    on_skip: Callable[[int, Buffer | None, str], None] | None = None  # instead of a skipped row
    after_size: Callable[[Buffer], None] | None = None
    ranks: int | None = None  # the ranks each op runs on (a group's size); None: the world


def bandwidth_point(s: Session, what: str, case: Case, acc: Accounting, lay: Buffer,
                    scale: float = 1.0, ranks: int | None = None) -> Point:
    """The usual point: the statistics plus algbw and busbw by the op's byte accounting, on
    `ranks` ranks (the op's group; None: the world)."""
    def columns(st: timing.Stats) -> dict:
        algbw, busbw = bandwidth(acc, lay.size_bytes, st.time_us / 1e6, ranks or s.rt.world)
        return {**stats_columns(st, s.opts.check), "algbw_gbps": algbw, "busbw_gbps": busbw}
    return Point(what, case, columns, scale)


def run(s: Session, series: list[Series]) -> list[str]:
    """Measure every series over opts.sizes; what was wrong, for measure.fail_if_wrong once the
    command has done the rest of its work (every row is written by then)."""
    sizes = s.opts.sizes
    s.console.start_progress(sum(len(sizes) * ser.steps_per_size for ser in series))
    m = Settings.of(s)
    bad: list[str] = []
    for ser in series:
        _run_series(s, m, ser, sizes, bad)
    s.console.stop_progress()
    return bad


def _run_series(s: Session, m: Settings, ser: Series, sizes: list[int], bad: list[str]
                ) -> None:
    console, n = s.console, ser.ranks or s.rt.world
    sink = s.sink(ser.output)
    if ser.title is not None:
        console.lines(format_table(ser.output.console, [], title=ser.title))
    sized = [(size, buffer_of(ser.accounting, size, ser.elt, n)) for size in sizes]
    skip = ser.skip
    if not skip and ser.probe is not None:
        s.phase(f"{ser.name} probe", s.opts.timeout)
        skip = _probe(ser.probe, s.rt.device)
    bufs, fitted = None, 0
    counts = [lay.per_rank_count for _, lay in sized if lay]
    if not skip and counts:
        s.phase(f"{ser.name} allocation", s.opts.timeout)
        bufs, fitted = allocate_fitting(ser.alloc, counts, s.rt.device, s.opts.headroom)
    for size, lay in sized:
        reason = skip or (ser.too_small if lay is None else
                          NO_FIT if lay.per_rank_count > fitted else "")
        if reason:
            _skipped(s, ser, sink, size, lay, reason)
            continue
        for point in ser.points(bufs, lay):
            console.working_on(point.what)
            try:
                st = measure_case(m, point.case, point.what, size, point.scale)
            except Skipped as e:  # agreed by every rank: this point cannot be measured here
                _skipped(s, ser, sink, size, lay, str(e), point.steps)
                continue
            row = {**ser.row, "size_bytes": lay.size_bytes, "count": lay.count,
                   **point.columns(st)}
            if st.wrong:
                bad.append(f"{point.what}: {st.wrong} wrong")
            sink.append(row, st.per_iter_us, st.reps_us)
            if ser.title is not None:
                console.lines([format_row(ser.output.console, row)])
            console.advance(point.steps)
        if ser.after_size is not None:
            ser.after_size(lay)
    del bufs
    release(s.rt.device)


def _skipped(s: Session, ser: Series, sink, size: int, lay: Buffer | None, reason: str,
             steps: int | None = None) -> None:
    if ser.on_skip is not None:
        ser.on_skip(size, lay, reason)
    else:
        row = {**ser.row, "size_bytes": lay.size_bytes if lay else size,
               "count": lay.count if lay else None, "status": "skipped", "note": reason}
        sink.append(row)
        if ser.title is not None:
            s.console.lines([format_row(ser.output.console, row)])
    s.console.advance(ser.steps_per_size if steps is None else steps)


def _probe(build: Callable[[], Case], device) -> str:
    """Run the combination once on one element per rank: a dtype or redop the backend lacks
    becomes a skip reason here instead of a crash mid-sweep."""
    reason = ""
    try:
        case = build()
        case.prepare()
        case.run()
        timing.sync(device)
    except (RuntimeError, ValueError) as e:
        reason = f"{dist.get_backend()} cannot run this: {one_line(e, 200, mark='')}"
    if agree(not reason, device):
        return ""
    return reason or "another rank could not run this combination"
