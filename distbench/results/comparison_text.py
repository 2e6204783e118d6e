"""A comparison (results.compare) as lines the caller prints: a text table, Markdown for a pull
request, or CSV."""

from __future__ import annotations

import csv
import io
from dataclasses import replace

from distbench.core import noise
from distbench.core.contracts import measure_of
from distbench.core.tables import (
    Column,
    format_row,
    format_table,
    markdown_table,
    percent,
    plural,
)
from distbench.results.compare import MARKS, METRICS, Comparison, Metric, Row, compared
from distbench.results.reader import Run

COLUMNS = (
    Column("group", "op", "", 16), Column("label", "row", "", 30),  # see _columns
    Column("base", "BASE", "", 11, ".4g"), Column("new", "NEW", "", 11, ".4g"),
    Column("ratio", "ratio", "", 8, ".3f"), Column("noise", "noise", "", 7, ".0%"),
    Column("p", "p", "", 9, ".2g"), Column("mark", "", "", 3),
)


def _per(c: Comparison) -> str:
    """What a group is: an op, unless every row's file groups by something else (accept.csv's
    rows by check)."""
    named = {compared()[r.file].grouped_by for r in c.rows}
    return named.pop() if len(named) == 1 else "op"


def _columns(c: Comparison) -> tuple[Column, ...]:
    """COLUMNS, the op column named for its groups and widened to the longest (accept's check
    names run past 16)."""
    wide = max([len(r.group) for r in c.rows] + [16])
    return (replace(COLUMNS[0], header=_per(c), width=wide), *COLUMNS[1:])


def _cells(r: Row) -> dict:
    return {"group": r.group, "label": r.label, "base": r.base, "new": r.new, "ratio": r.ratio,
            "noise": r.noise, "p": r.p_value, "mark": r.mark}


def _what(c: Comparison) -> str:
    """The metric and its unit; the rows of a file judged by their own metric (accept.csv's)
    are each in their check's own unit. `auto` is named by what it read (busbw, or a training
    step's time)."""
    files = {r.file for r in c.rows}
    name = " and ".join(sorted({_metric_name(c.metric, f) for f in files}))
    own = {f: compared()[f].grouped_by for f in files if compared()[f].row_metric}
    if own and files == set(own):
        return f"{name} (each {' or '.join(sorted(set(own.values())))} in its own unit)"
    unit = ", ".join(sorted({measure_of(c.metric.columns[f]).unit for f in files - set(own)}))
    if own:
        return f"{name} ({unit}; " + "; ".join(
            f"{f} rows each in their {g}'s own unit" for f, g in sorted(own.items())) + ")"
    return f"{name} ({unit})"


def _rule(c: Comparison) -> str:
    shown = [noise.shown(x, c.threshold) if x is not None else "unknown" for x in c.noise]
    return (f"threshold {percent(c.threshold)}, and beyond the noise (repetitions' spread; typical "
            f"BASE {shown[0]}, NEW {shown[1]})")


def format_text(c: Comparison, base: Run, new: Run) -> list[str]:
    lines = [f"# compare {_what(c)}: BASE {base.name} vs NEW {new.name}, {_rule(c)}"]
    lines += _setup_lines(c)
    lines += [f"# note: {n}" for n in c.unmatched]
    columns = _columns(c)
    lines += format_table(columns, [], title="rows")
    lines += [format_row(columns, _cells(r)) + (f"  {r.note}" if r.note else "")
              for r in c.rows]
    width = max([len(g) for _, g, _, _ in c.geomeans()] + [24])
    lines += ["#", f"# geometric mean of NEW/BASE per {_per(c)}"]
    lines += [f"#   {g:<{width}} {gm:8.3f}  ({plural(k, 'row')})" for _, g, gm, k in c.geomeans()]
    lines.append(_verdict(c))
    return lines


def _setup_lines(c: Comparison) -> list[str]:
    if not c.setup:
        return ["# setup: the same (torch, NCCL, driver, CUDA, world size, nodes, backend, GPU, "
                "topology)"]
    return ["# setup differs:"] + [f"#   {k}: {b} -> {n}" for k, b, n in c.setup]


def _verdict(c: Comparison) -> str:
    counts = {m: sum(r.mark == m for r in c.rows) for m in MARKS.values()}
    summary = (f"{counts['+']} +, {counts['-']} -, {counts['~']} ~, {counts['x']} x")
    noisy = sum(r.mark == "x" and r.ratio is not None for r in c.rows)
    tail = f"; {noisy} of the x too noisy to tell" if noisy else ""
    alone = sum(r.by_threshold and r.mark == "-" for r in c.rows)
    how = (f" ({alone} of them by the threshold alone: no repetitions to measure the noise)"
           if alone else "")
    if c.worse:
        return (f"# {plural(len(c.worse), 'row')} worse by more than {percent(c.threshold)} and "
                f"beyond the noise{how} ({summary}{tail})")
    return (f"# no row worse by more than {percent(c.threshold)} and beyond the noise "
            f"({summary}{tail})")


def format_markdown(c: Comparison, base: Run, new: Run) -> list[str]:
    """Every block (table, list, paragraph) stands apart by a blank line: GitHub renders a table
    that follows a list line as more of the list item's text."""
    lines = [f"**compare {_what(c)}**: BASE `{base.name}` vs NEW `{new.name}`, {_rule(c)}", ""]
    if c.setup:
        lines += markdown_table(["setup", "BASE", "NEW"], c.setup) + [""]
    if c.unmatched:
        lines += [f"- {n}" for n in c.unmatched] + [""]
    lines += markdown_table([_per(c), "row", "BASE", "NEW", "ratio", "noise", "p", ""],
                            [_md_cells(r) for r in c.rows], align="llrrrrrl")
    lines += [""] + markdown_table([_per(c), "geometric mean NEW/BASE", "rows"],
                                   [[g, f"{gm:.3f}", k] for _, g, gm, k in c.geomeans()],
                                   align="lrr")
    lines += ["", _verdict(c).lstrip("# ")]
    return lines


def _md_cells(r: Row) -> list[str]:
    """A row's cells as the text table shows them ("-" for none), its mark with its note."""
    cells = _cells(r)
    shown = ["-" if cells[col.key] is None else format(cells[col.key], col.fmt)
             for col in COLUMNS[:-1]]
    return [*shown, f"{r.mark} {r.note}".rstrip()]


def format_csv(c: Comparison) -> list[str]:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["file", "op", "row", "metric", "base", "new", "ratio", "p_value", "mark",
                "note", "noise"])
    for r in c.rows:
        w.writerow([r.file, r.group, r.label, _metric_name(c.metric, r.file), _csv_num(r.base),
                    _csv_num(r.new),
                    _csv_num(r.ratio), _csv_num(r.p_value), r.mark, r.note, _csv_num(r.noise)])
    return buf.getvalue().splitlines()


def _metric_name(metric: Metric, file: str) -> str:
    """What `auto` read in `file`, named as the metric that reads the same column."""
    if metric.name != "auto":
        return metric.name
    return next(m for m in METRICS
                if m != "auto" and Metric.of(m).columns.get(file) == metric.columns[file])


def _csv_num(v: float | None) -> str:
    return "" if v is None else f"{v:.6g}"
