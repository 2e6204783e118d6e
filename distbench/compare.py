"""Comparing two runs row by row, as asv's `continuous` and pyperf's `compare_to` do for other
fields: rows matched on every identity column, a ratio and a Mann-Whitney U p-value on the
per-iteration samples per row, a mark (+ better, - worse, ~ within the threshold or not
significant, x not comparable), a geometric mean per op, and what differs between the two runs'
setups. Torch-free."""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass

import pandas as pd

from distbench.reading import ReadError
from distbench.rundirs import Run, gpu_model, topology_summary, versions
from distbench.tables import Column, format_row, format_table

# A row is worse (or better) only when the two runs' samples differ at this level too.
SIGNIFICANCE = 0.05
DEFAULT_THRESHOLD = 0.05

IDENTITY: dict[str, tuple[str, ...]] = {
    "collective.csv": ("op", "dtype", "redop", "root", "in_place", "world_size", "nnodes",
                       "size_bytes"),
    "p2p.csv": ("pattern", "dtype", "world_size", "nnodes", "pairs", "size_bytes"),
    "p2p_matrix.csv": ("direction", "src_rank", "dst_rank", "dtype", "world_size", "nnodes",
                       "size_bytes"),
    # a check's figure on a target; its metric (a profile's choice) says which way is better
    "accept.csv": ("check", "scope", "target", "metric", "retest"),
}


@dataclass(frozen=True)
class Metric:
    name: str
    columns: dict[str, str]  # file -> the column holding it
    higher_is_better: bool


METRICS = {
    "busbw": Metric("busbw", {"collective.csv": "busbw_gbps", "p2p.csv": "busbw_gbps",
                              "p2p_matrix.csv": "gbps", "accept.csv": "measured"}, True),
    "time": Metric("time", {**dict.fromkeys(IDENTITY, "time_us"), "accept.csv": "measured"},
                   False),
    "p99": Metric("p99", {**dict.fromkeys(IDENTITY, "p99_us"), "accept.csv": "measured"},
                  False),
}
MARKS = {"better": "+", "worse": "-", "same": "~", "incomparable": "x"}


def rank_test(a: list[float], b: list[float]) -> tuple[float, float]:
    """(p, slower share) from one ranking of both samples. p: the two-sided p-value of the
    Mann-Whitney U test, by the normal approximation with the tie correction and a continuity
    correction (good from about 8 samples a side; with fewer, the p-value is on the large side,
    so a row is less readily called worse); NaN below 2 a side. Slower share: how often an
    iteration of b takes longer than one of a (ties count half), the U statistic of b over
    n1 * n2: above 0.5, b's iterations are generally the slower ones."""
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
    p_value: float | None  # None: no samples on one side
    mark: str
    note: str = ""


@dataclass
class Comparison:
    metric: Metric
    threshold: float
    rows: list[Row]
    setup: list[tuple[str, str, str]]  # what differs: (what, base, new)
    unmatched: list[str]  # notes on identity columns left out, rows found on one side only

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
        from distbench.profiles import METRICS as CHECK_METRICS

        return CHECK_METRICS.get(str(row["metric"]), {}).get("higher_is_better", True)
    return metric.higher_is_better


def _group(file: str, row) -> str:
    if file == "accept.csv":
        return str(row["check"])
    if file == "collective.csv":
        return str(row["op"])
    if file == "p2p.csv":
        return str(row["pattern"])
    return f"matrix {row['direction']}"


def _label(file: str, keys: tuple[str, ...], row) -> str:
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


def _judge(higher_is_better: bool, threshold: float, base_v, new_v, base_s, new_s, ok: bool
           ) -> tuple[float | None, float | None, str, str]:
    if not ok or pd.isna(base_v) or pd.isna(new_v) or float(base_v) <= 0:
        return None, None, MARKS["incomparable"], "not measured on both sides"
    ratio = float(new_v) / float(base_v)
    # the share by which NEW is better: busbw up by 10%, or time down by 10%, is +0.10
    gain = ratio - 1 if higher_is_better else 1 - ratio
    p, slower = rank_test(base_s, new_s) if base_s and new_s else (None, None)
    if p is not None and math.isnan(p):
        p = None
    if abs(gain) <= threshold:
        return ratio, p, MARKS["same"], ""
    if p is None:
        return ratio, p, MARKS["better"] if gain > 0 else MARKS["worse"], \
            "no samples: by the threshold alone"
    if p >= SIGNIFICANCE:
        return ratio, p, MARKS["same"], "not significant"
    if (slower > 0.5) != (gain < 0):
        # the row's figure (a mean) and its iterations point opposite ways: a few outliers
        # moved the mean; most iterations went the other way
        return ratio, p, MARKS["same"], "the mean and most iterations disagree"
    return ratio, p, MARKS["better"] if gain > 0 else MARKS["worse"], ""


def _compare_table(file: str, base: Run, new: Run, metric: Metric, threshold: float,
                   notes: list[str]) -> list[Row]:
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
        bs = base.samples.get(file, {}).get(int(m["_row_b"]), [])
        ns = new.samples.get(file, {}).get(int(m["_row_n"]), [])
        ratio, p, mark, note = _judge(_higher_is_better(metric, file, side), threshold,
                                      m.get(f"{column}_b"),
                                      m.get(f"{column}_n"), bs, ns, ok)
        rows.append(Row(file, _group(file, side), _label(file, keys, side),
                        _num(m.get(f"{column}_b")), _num(m.get(f"{column}_n")), ratio, p, mark,
                        note))
    if only["left_only"] or only["right_only"]:
        notes.append(f"{file}: {only['left_only']} rows only in BASE, {only['right_only']} "
                     "only in NEW (not compared)")
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
                "CUDA": v.get("cuda"), "world size": run.meta.get("world_size"),
                "nodes": run.meta.get("nnodes"), "backend": run.meta.get("backend"),
                "GPU": gpu_model(run), "topology": topology_summary(run),
                "command": run.command}
    fb, fn = facts(base), facts(new)
    return [(k, str(fb[k]), str(fn[k])) for k in fb if fb[k] != fn[k]]


def compare(base: Run, new: Run, metric: str = "busbw",
            threshold: float = DEFAULT_THRESHOLD) -> Comparison:
    """Raises ReadError when the two runs have no row in common."""
    chosen = METRICS[metric]
    files = [f for f in IDENTITY if f in base.tables and f in new.tables]
    if not files:
        raise ReadError(new.path, "shares no table compare reads with "
                        f"{base.path} (it reads {', '.join(IDENTITY)}; BASE has "
                        f"{', '.join(base.tables) or 'none'}, NEW has "
                        f"{', '.join(new.tables) or 'none'})")
    notes: list[str] = []
    rows = [r for f in files for r in _compare_table(f, base, new, chosen, threshold, notes)]
    if not rows:
        why = "; ".join([", ".join(IDENTITY[files[0]])] + notes)
        raise ReadError(new.path, f"no row in common with {base.path} (rows are matched on "
                        f"{why})")
    return Comparison(chosen, threshold, rows, setup_differences(base, new), notes)


# ---------------------------------------------------------------------------------------------
# Presentation: lines, the caller prints them.

COLUMNS = (
    Column("group", "op", "", 16), Column("label", "row", "", 30),
    Column("base", "BASE", "", 11, ".4g"), Column("new", "NEW", "", 11, ".4g"),
    Column("ratio", "ratio", "", 8, ".3f"), Column("p", "p", "", 9, ".2g"),
    Column("mark", "", "", 3),
)


def _cells(r: Row) -> dict:
    return {"group": r.group, "label": r.label, "base": r.base, "new": r.new, "ratio": r.ratio,
            "p": r.p_value, "mark": r.mark}


def format_text(c: Comparison, base: Run, new: Run) -> list[str]:
    unit = "GB/s" if c.metric.higher_is_better else "us"
    lines = [f"# compare {c.metric.name} ({unit}): BASE {base.name} vs NEW {new.name}, "
             f"threshold {c.threshold:.0%}, significance p < {SIGNIFICANCE}"]
    lines += _setup_lines(c)
    lines += [f"# note: {n}" for n in c.unmatched]
    lines += format_table(COLUMNS, [], title="rows")
    lines += [format_row(COLUMNS, _cells(r)) + (f"  {r.note}" if r.note else "")
              for r in c.rows]
    lines += ["#", "# geometric mean of NEW/BASE per op"]
    lines += [f"#   {g:<24} {gm:8.3f}  ({k} rows)" for _, g, gm, k in c.geomeans()]
    lines.append(_verdict(c))
    return lines


def _setup_lines(c: Comparison) -> list[str]:
    if not c.setup:
        return ["# setup: the same (torch, NCCL, driver, CUDA, world size, nodes, backend, GPU, "
                "topology)"]
    return ["# setup differs:"] + [f"#   {k}: {b} -> {n}" for k, b, n in c.setup]


def _verdict(c: Comparison) -> str:
    counts = {m: sum(r.mark == m for r in c.rows) for m in MARKS.values()}
    summary = ", ".join(f"{counts[m]} {m}" for m in MARKS.values())
    if c.worse:
        return (f"# {len(c.worse)} rows worse by more than {c.threshold:.0%} and significant "
                f"({summary})")
    return f"# no row worse by more than {c.threshold:.0%} and significant ({summary})"


def format_markdown(c: Comparison, base: Run, new: Run) -> list[str]:
    unit = "GB/s" if c.metric.higher_is_better else "us"
    lines = [f"**compare {c.metric.name} ({unit})**: BASE `{base.name}` vs NEW `{new.name}`, "
             f"threshold {c.threshold:.0%}, significance p < {SIGNIFICANCE}", ""]
    if c.setup:
        lines += ["| setup | BASE | NEW |", "|---|---|---|"]
        lines += [f"| {k} | {b} | {n} |" for k, b, n in c.setup]
        lines.append("")
    lines += [f"- {n}" for n in c.unmatched]
    lines += ["| op | row | BASE | NEW | ratio | p | |", "|---|---|---:|---:|---:|---:|---|"]
    for r in c.rows:
        cells = _cells(r)
        shown = ["-" if cells[col.key] is None else format(cells[col.key], col.fmt)
                 for col in COLUMNS[:-1]]
        lines.append("| " + " | ".join(shown) + f" | {r.mark} {r.note}".rstrip() + " |")
    lines += ["", "| op | geometric mean NEW/BASE | rows |", "|---|---:|---:|"]
    lines += [f"| {g} | {gm:.3f} | {k} |" for _, g, gm, k in c.geomeans()]
    lines += ["", _verdict(c).lstrip("# ")]
    return lines


def format_csv(c: Comparison) -> list[str]:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["file", "op", "row", "metric", "base", "new", "ratio", "p_value", "mark",
                "note"])
    for r in c.rows:
        w.writerow([r.file, r.group, r.label, c.metric.name, _csv_num(r.base), _csv_num(r.new),
                    _csv_num(r.ratio), _csv_num(r.p_value), r.mark, r.note])
    return buf.getvalue().splitlines()


def _csv_num(v: float | None) -> str:
    return "" if v is None else f"{v:.6g}"
