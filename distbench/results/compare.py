"""Comparing two runs row by row, as asv's `continuous` and pyperf's `compare_to` do for other
fields: rows matched on every identity column, a ratio, each row's separated repetitions judged
against the threshold and the noise both runs show (noise.py), a mark (+ better, - worse, ~ the
same, x not comparable: noisy, or not measured on both sides), a geometric mean per op, and what
differs between the two runs' setups. Every row's samples are checked against the row first: a
run whose samples contradict its CSV is refused, not compared. Torch-free."""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, replace

import pandas as pd

from distbench.core import noise
from distbench.core.contracts import OUTPUTS, measure_of
from distbench.core.errors import ReadError
from distbench.core.layout_label import row_label
from distbench.core.tables import (
    Column,
    format_row,
    format_table,
    markdown_table,
    percent,
    plural,
)
from distbench.results import samples
from distbench.results.reader import (
    Run,
    check_metric,
    gpu_model,
    left_out,
    nnodes,
    topology_summary,
    versions,
    world_size,
)

DEFAULT_THRESHOLD = 0.05

# The files compare reads: those whose rows have an identity to match them on (core.contracts).
IDENTITY: dict[str, tuple[str, ...]] = {o.file: o.identity for o in OUTPUTS if o.identity}
# identity columns added since older runs were written: left out in silence when neither side
# records them (two runs made before them match as they always did)
SINCE: dict[str, tuple[str, ...]] = {o.file: o.identity_since for o in OUTPUTS}


# A training step's figure is its step time: those files record no time_us of one call.
STEP_TIMES = dict.fromkeys(("tp.csv", "pp.csv", "dp.csv", "step.csv"), "step_us")


@dataclass(frozen=True)
class Metric:
    name: str
    columns: dict[str, str]  # file -> the column holding it; a file not here is not compared

    def higher_is_better(self, file: str) -> bool:
        return measure_of(self.columns[file]).higher_is_better


BUSBW = {"collective.csv": "busbw_gbps", "p2p.csv": "busbw_gbps", "p2p_matrix.csv": "gbps",
         "accept.csv": "measured"}
TIME = {"collective.csv": "time_us", "p2p.csv": "time_us", "p2p_matrix.csv": "time_us",
        **STEP_TIMES, "accept.csv": "measured"}
METRICS = {
    # each file by what it is read for: a bandwidth where it records one, else its time
    "auto": Metric("auto", {**TIME, **BUSBW}),
    "busbw": Metric("busbw", BUSBW),
    "time": Metric("time", TIME),
    "p99": Metric("p99", {**{f: "p99_us" for f in IDENTITY}, "accept.csv": "measured"}),
}
MARKS = {"better": "+", "worse": "-", "same": "~", "incomparable": "x"}


def rank_test(a: list[float], b: list[float]) -> tuple[float, float]:
    """(p, slower share) from one ranking of both samples. p: the two-sided p-value of the
    Mann-Whitney U test, by the normal approximation with the tie correction and a continuity
    correction, as scipy.stats.mannwhitneyu(method="asymptotic") gives it (pinned in the tests);
    NaN below 2 a side. Slower share: how often a value of b is above one of a (ties count
    half), the U statistic of b over n1 * n2. compare shows it for the two runs' repetitions,
    for information: with 5 a side it cannot fall below about 0.01, and a row's mark rests on
    the noise rule (noise.py), not on it."""
    n1, n2 = len(a), len(b)
    if n1 < 2 or n2 < 2:
        return math.nan, math.nan
    both = pd.Series(list(a) + list(b))
    ranks = both.rank(method="average")
    u = float(ranks.iloc[:n1].sum()) - n1 * (n1 + 1) / 2
    share = 1 - u / (n1 * n2)  # U of a and U of b sum to n1 * n2
    n = n1 + n2
    ties = both.value_counts()
    tie_term = float(((ties ** 3) - ties).sum()) / (n * (n - 1))
    sigma = math.sqrt(n1 * n2 / 12 * ((n + 1) - tie_term))
    if sigma == 0:
        return 1.0, share
    z = max(abs(u - n1 * n2 / 2) - 0.5, 0.0) / sigma
    return math.erfc(z / math.sqrt(2)), share


@dataclass(frozen=True)
class Row:
    file: str
    group: str  # what the geometric mean is per: the op, the pattern, the matrix direction
    label: str  # the rest of the row's identity, for people
    base: float | None
    new: float | None
    ratio: float | None  # new / base
    p_value: float | None  # the repetitions' rank test; None: no repetitions on one side
    mark: str
    note: str = ""
    noise: float | None = None  # the spread the row was judged against (0.3: 30%)
    by_threshold: bool = False  # no repetitions on a side: judged by the threshold alone


@dataclass
class Comparison:
    metric: Metric
    threshold: float
    rows: list[Row]
    setup: list[tuple[str, str, str]]  # what differs: (what, base, new)
    unmatched: list[str]  # notes on identity columns left out, rows found on one side only
    noise: tuple[float | None, float | None] = (None, None)  # each run's typical spread

    @property
    def worse(self) -> list[Row]:
        return [r for r in self.rows if r.mark == "-"]

    def geomeans(self) -> list[tuple[str, str, float, int]]:
        """(file, group, geometric mean of new/base, rows) over the comparable rows."""
        out: dict[tuple[str, str], list[float]] = {}
        for r in self.rows:
            if r.ratio is not None and r.ratio > 0:
                out.setdefault((r.file, r.group), []).append(r.ratio)
        return [(f, g, math.exp(sum(map(math.log, v)) / len(v)), len(v))
                for (f, g), v in out.items()]


def _higher_is_better(metric: Metric, file: str, row) -> bool:
    """An acceptance check's own metric decides (its `measured` is whatever the profile
    judged); elsewhere the metric asked for."""
    if file == "accept.csv":
        return check_metric(row["metric"])[1]
    return metric.higher_is_better(file)


def _group(file: str, row) -> str:
    if file == "accept.csv":
        return str(row["check"])
    if file == "collective.csv":
        return str(row["op"])
    if file == "p2p.csv":
        return str(row["pattern"])
    if file == "p2p_matrix.csv":
        return f"matrix {row['direction']}"
    return file.removesuffix(".csv")  # a training step: one group per command


def _label(file: str, keys: tuple[str, ...], row) -> str:
    if file == "step.csv":  # a layout reads as its label, not as five bare numbers
        return f"{row_label(row)} {row.get('dtype')}"
    skip = {"op", "pattern", "direction", "world_size", "nnodes", "check", "scope", "metric"}
    parts = []
    for k in keys:
        if k in skip or pd.isna(row.get(k)):
            continue
        v = row[k]
        if k == "retest":
            if _key_text(v) in ("1", "true"):
                parts.append("(retest)")
        elif k == "in_place":
            parts.append("in" if int(v) else "out")
        elif k == "root" and int(v) < 0:
            continue
        elif k in ("src_rank", "dst_rank"):
            parts.append(f"{k[:3]} {int(v)}")
        elif k == "size_bytes":
            parts.append(f"{int(v)} B")
        elif k == "group_size":  # said only where the groups are not the whole world
            if pd.isna(row.get("world_size")) or int(v) != int(row["world_size"]):
                parts.append(f"groups of {int(v)}")
        elif k == "group_stride":
            if int(v) != 1:
                parts.append(f"stride {int(v)}")
        else:
            parts.append(str(v))
    return " ".join(parts)


def _keys(file: str, base: pd.DataFrame, new: pd.DataFrame, notes: list[str]
          ) -> tuple[str, ...]:
    """The identity columns both sides record; one side that records none of a column (an
    nccl-tests log printed without its device list: no world size) matches on the rest."""
    keys = []
    for k in IDENTITY[file]:
        gone = [side for side, f in (("BASE", base), ("NEW", new))
                if k not in f.columns or f[k].isna().all()]
        if len(gone) == 2 and k in SINCE.get(file, ()):
            continue
        if gone:
            notes.append(f"{file}: matched without {k} ({' and '.join(gone)} does not "
                         "record it)")
        else:
            keys.append(k)
    return tuple(keys)


def _normalized(frame: pd.DataFrame, keys: tuple[str, ...]) -> pd.DataFrame:
    """Identity cells as strings of one form, so 1024 and 1024.0 (or True and 1) match; rows
    that share an identity (a log holding the same test twice) pair up in order."""
    out = frame.copy()
    out["_row"] = range(len(out))
    for k in keys:
        out[f"_k_{k}"] = out[k].map(_key_text)
    out["_k_nth"] = out.groupby([f"_k_{k}" for k in keys], sort=False).cumcount()
    return out


def _key_text(v) -> str:
    if isinstance(v, bool):
        return str(int(v))
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v).strip().lower()


def _judge(higher_is_better: bool, threshold: float, base_v, new_v, base_r: list[float],
           new_r: list[float], ok: bool, typical: tuple[float | None, float | None],
           spreads: tuple[float | None, float | None] = (None, None)) -> Row:
    """A row's ratio, p, mark, note and noise (group and label left empty). base_r/new_r: the
    repetitions (times); `spreads`: a row's spread where no repetitions are kept (accept.csv)."""
    def row(ratio, p, mark, note="", spread=None, alone=False) -> Row:
        return Row("", "", "", _num(base_v), _num(new_v), ratio, p, MARKS[mark], note, spread,
                   alone)

    if not ok or pd.isna(base_v) or pd.isna(new_v) or float(base_v) <= 0 or float(new_v) <= 0:
        return row(None, None, "incomparable", "not measured on both sides")
    ratio = float(new_v) / float(base_v)
    if ratio == 1 and base_r == new_r:  # a run against itself (or its copy): nothing changed,
        return row(ratio, None, "same", "identical")  # however noisy its repetitions were
    # the row's own figure, as a time ratio: busbw up by 10% is a time ratio of 1/1.1
    time_ratio = 1 / ratio if higher_is_better else ratio
    if len(base_r) >= 2 and len(new_r) >= 2:
        p, _ = rank_test(base_r, new_r)
        c = noise.call(base_r, new_r, threshold, *typical)
    elif all(x is not None for x in spreads):
        p, c = None, noise.judge(time_ratio, threshold, [*spreads, *typical])
    else:  # nothing says how noisy the row is: the threshold alone
        c = noise.judge(time_ratio, threshold, [])
        return row(ratio, None, c.mark, "" if c.mark == "same" else
                   "no repetitions: by the threshold alone", alone=True)
    p = None if p is None or math.isnan(p) else p
    if c.mark in ("better", "worse"):
        # the row's figure (a mean) must point the same way, beyond the threshold: a few stalls
        # can move a mean while the repetitions' medians stay put, and the other way round
        if abs(math.log(time_ratio)) <= math.log1p(threshold) or \
                (time_ratio > 1) != (c.time_ratio > 1):
            return row(ratio, p, "incomparable", "the row's mean and its repetitions disagree",
                       c.noise)
    return row(ratio, p, "incomparable" if c.mark == "noisy" else c.mark, c.note, c.noise)


def _reps(run: Run, file: str, index: int) -> list[float]:
    """A row's repetitions: as kept, or, in a run made before they were kept, read back from its
    loop's samples (noise.split); [] where it has none (an nccl-tests log)."""
    kept = run.samples.get(file, {}).get(index)
    if kept is None:
        return []
    return kept.reps or noise.split(kept.us)


def typical_noise(run: Run) -> float | None:
    """The noise a run shows: the median spread of its rows' repetitions (or of accept.csv's
    spread column)."""
    spreads = [noise.spread(_reps(run, f, i)) for f in IDENTITY if f in run.tables
               for i in run.samples.get(f, {})]
    accept = run.tables.get("accept.csv")
    if accept is not None and "spread" in accept.columns:
        spreads += [float(v) for v in accept["spread"].dropna()]
    return noise.typical(spreads)


def check_samples(run: Run) -> None:
    """Raises ReadError when a row's samples contradict the row (samples.contradiction): a CSV
    edited after the run, or samples from another run, must not be compared as measured."""
    for file, kept in run.samples.items():
        table = run.tables.get(file)
        if table is None:
            continue
        for index, row_samples in kept.items():
            if index >= len(table):
                raise ReadError(samples.path_for(run.path / file), f"samples for row {index}, "
                                f"but {file} has {plural(len(table), 'row')}")
            row = table.iloc[index]
            why = samples.contradiction(row.to_dict(), row_samples)
            if why is not None:
                raise ReadError(run.path / file, f"row {index} ({_label(file, IDENTITY[file], row)}"
                                f") contradicts its samples: {why}; refusing to compare it")


def _compare_table(file: str, base: Run, new: Run, metric: Metric, threshold: float,
                   notes: list[str], typical: tuple[float | None, float | None]) -> list[Row]:
    b, n = base.tables[file], new.tables[file]
    if not len(b) or not len(n):
        notes.append(f"{file}: no rows in {'BASE' if not len(b) else 'NEW'}")
        return []
    keys = _keys(file, b, n, notes)
    bk, nk = _normalized(b, keys), _normalized(n, keys)
    kcols = [f"_k_{k}" for k in keys] + ["_k_nth"]
    merged = bk.merge(nk, on=kcols, how="outer", suffixes=("_b", "_n"), indicator=True)
    merged = merged.sort_values(["_row_n", "_row_b"])  # the runs' own row order, not the keys'
    column = metric.columns[file]
    rows: list[Row] = []
    only = {"left_only": 0, "right_only": 0}
    for _, m in merged.iterrows():
        if m["_merge"] != "both":
            only[m["_merge"]] += 1
            continue
        side = {k: m[f"{k}_b"] for k in keys}
        ok = all(_measured(m.get(f"status{s}")) for s in ("_b", "_n"))
        judged = _judge(_higher_is_better(metric, file, side), threshold, m.get(f"{column}_b"),
                        m.get(f"{column}_n"), _reps(base, file, int(m["_row_b"])),
                        _reps(new, file, int(m["_row_n"])), ok, typical,
                        (_num(m.get("spread_b")), _num(m.get("spread_n"))))
        rows.append(replace(judged, file=file, group=_group(file, side),
                            label=_label(file, keys, side)))
    if only["left_only"] or only["right_only"]:
        notes.append(f"{file}: {plural(only['left_only'], 'row')} only in BASE, "
                     f"{only['right_only']} only in NEW (not compared)")
    return rows


def _measured(status) -> bool:
    """A row with a measurement: ok, or wrong (timed all the same); no status column (the
    matrix) counts as ok."""
    return status is None or pd.isna(status) or str(status) in ("ok", "wrong")


def _num(v) -> float | None:
    return None if v is None or pd.isna(v) else float(v)


def setup_differences(base: Run, new: Run) -> list[tuple[str, str, str]]:
    def facts(run: Run) -> dict[str, object]:
        v = versions(run)
        return {"torch": v.get("torch"), "NCCL": v.get("nccl"), "driver": v.get("driver"),
                "CUDA": v.get("cuda"), "world size": world_size(run),
                "nodes": nnodes(run), "backend": run.meta.get("backend"),
                "GPU": gpu_model(run), "topology": topology_summary(run),
                "command": run.command}
    def shown(v) -> str:  # an nccl-tests log records no versions: unknown, not "None"
        return "unknown" if v is None else str(v)

    fb, fn = facts(base), facts(new)
    return [(k, shown(fb[k]), shown(fn[k])) for k in fb if fb[k] != fn[k]]


# Tables a run may hold that compare does not read, and why: said where a run holds only these
NOT_COMPARED = {
    "plan.csv": "predictions, not measurements: plan --validate measures step.csv",
    "validation.csv": "each prediction against one measurement: its step.csv is compared",
    "watch.csv": "cycles watch judges itself, against its own baseline",
}


def _holds(run: Run) -> str:
    """A run's tables for a refusal, each that compare does not read with why; a run of none
    (topo) says what made it."""
    if not run.tables:
        return f"none (`distbench {run.command}` writes none)" if run.meta else "none"
    return ", ".join(f"{f} ({NOT_COMPARED[f]})" if f in NOT_COMPARED else f for f in run.tables)


def compare(base: Run, new: Run, metric: str = "auto",
            threshold: float = DEFAULT_THRESHOLD) -> Comparison:
    """Raises ReadError when the two runs have no row in common."""
    chosen = METRICS[metric]
    shared = [f for f in IDENTITY if f in base.tables and f in new.tables]
    if not shared:
        raise ReadError(new.path, "shares no table compare reads with "
                        f"{base.path} (it reads {', '.join(IDENTITY)}; BASE has "
                        f"{_holds(base)}, NEW has {_holds(new)})")
    files = [f for f in shared if f in chosen.columns]
    if not files:
        others = sorted(m for m, x in METRICS.items() if all(f in x.columns for f in shared))
        raise ReadError(new.path, f"--metric {metric}: {', '.join(shared)} records none; "
                        f"compare these runs with --metric {' or '.join(others)}")
    for run in (base, new):
        check_samples(run)
    typical = (typical_noise(base), typical_noise(new))
    notes = [f"{side}: {line}" for side, run in (("BASE", base), ("NEW", new))
             for line in left_out(run)]
    rows = [r for f in files
            for r in _compare_table(f, base, new, chosen, threshold, notes, typical)]
    if not rows:
        why = "; ".join([", ".join(IDENTITY[files[0]])] + notes)
        raise ReadError(new.path, f"no row in common with {base.path} (rows are matched on "
                        f"{why})")
    return Comparison(chosen, threshold, rows, setup_differences(base, new), notes, typical)


# ---------------------------------------------------------------------------------------------
# Presentation: lines, the caller prints them.

COLUMNS = (
    Column("group", "op", "", 16), Column("label", "row", "", 30),  # see _columns
    Column("base", "BASE", "", 11, ".4g"), Column("new", "NEW", "", 11, ".4g"),
    Column("ratio", "ratio", "", 8, ".3f"), Column("noise", "noise", "", 7, ".0%"),
    Column("p", "p", "", 9, ".2g"), Column("mark", "", "", 3),
)


def _per(c: Comparison) -> str:
    """What a group is: accept.csv's rows are grouped by check, the others by op."""
    return "check" if {r.file for r in c.rows} == {"accept.csv"} else "op"


def _columns(c: Comparison) -> tuple[Column, ...]:
    """COLUMNS, the op column named for its groups and widened to the longest (accept's check
    names run past 16)."""
    wide = max([len(r.group) for r in c.rows] + [16])
    return (replace(COLUMNS[0], header=_per(c), width=wide), *COLUMNS[1:])


def _cells(r: Row) -> dict:
    return {"group": r.group, "label": r.label, "base": r.base, "new": r.new, "ratio": r.ratio,
            "noise": r.noise, "p": r.p_value, "mark": r.mark}


def _what(c: Comparison) -> str:
    """The metric and its unit; accept.csv's rows are each in their check's own unit. `auto`
    is named by what it read (busbw, or a training step's time)."""
    files = {r.file for r in c.rows}
    name = " and ".join(sorted({_metric_name(c.metric, f) for f in files}))
    if files == {"accept.csv"}:
        return f"{name} (each check in its own unit)"
    unit = ", ".join(sorted({measure_of(c.metric.columns[f]).unit
                             for f in files - {"accept.csv"}}))
    if "accept.csv" in files:
        return f"{name} ({unit}; accept.csv rows each in their check's own unit)"
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
    return next(m.name for m in METRICS.values()
                if m.name != "auto" and m.columns.get(file) == metric.columns[file])


def _csv_num(v: float | None) -> str:
    return "" if v is None else f"{v:.6g}"
