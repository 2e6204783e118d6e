"""Comparing two runs row by row, as asv's `continuous` and pyperf's `compare_to` do for other
fields: rows matched on every identity column, a ratio, each row's separated repetitions judged
against the threshold and the noise both runs show (noise.py), a mark (+ better, - worse, ~ the
same, x not comparable: noisy, or not measured on both sides), a geometric mean per op, and what
differs between the two runs' setups. Every row's samples are checked against the row first: a
run whose samples contradict its CSV is refused, not compared. Torch-free."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pandas as pd

from distbench.core import noise
from distbench.core.contracts import measure_of, outputs
from distbench.core.errors import ReadError
from distbench.core.tables import (
    Output,
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

# --metric's choices; which column each reads in a file is the file's contract's (Output.metric)
METRICS = Output.METRICS


def compared() -> dict[str, Output]:
    """The files compare reads, by name: those whose rows have an identity to match them on
    (core.contracts, and any a kind registered), in the order compared."""
    return {o.file: o for o in outputs() if o.identity and not o.not_compared}


@dataclass(frozen=True)
class Metric:
    name: str
    columns: dict[str, str]  # file -> the column holding it; a file not here is not compared

    @classmethod
    def of(cls, name: str) -> Metric:
        return cls(name, {f: o.metric(name) for f, o in compared().items() if o.metric(name)})

    def higher_is_better(self, file: str) -> bool:
        return measure_of(self.columns[file]).higher_is_better


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


def _higher_is_better(metric: Metric, out: Output, row) -> bool:
    """A row with its own metric (an acceptance check's: its `measured` is whatever the
    profile judged) is judged by it; elsewhere the metric asked for decides."""
    if out.row_metric:
        return check_metric(row[out.row_metric])[1]
    return metric.higher_is_better(out.file)


def _group(out: Output, row) -> str:
    # a training step's rows are one group, its command's
    return out.group(row) if out.group else out.file.removesuffix(".csv")


def _label(out: Output, keys: tuple[str, ...], row) -> str:
    if out.label:
        return out.label(row)
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


def _keys(out: Output, base: pd.DataFrame, new: pd.DataFrame, notes: list[str]
          ) -> tuple[str, ...]:
    """The identity columns both sides record; one side that records none of a column (an
    nccl-tests log printed without its device list: no world size) matches on the rest."""
    keys = []
    for k in out.identity:
        gone = [side for side, f in (("BASE", base), ("NEW", new))
                if k not in f.columns or f[k].isna().all()]
        if len(gone) == 2 and k in out.identity_since:
            continue
        if gone:
            notes.append(f"{out.file}: matched without {k} ({' and '.join(gone)} does not "
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
    files = [f for f in compared() if f in run.tables]
    spreads = [noise.spread(_reps(run, f, i)) for f in files for i in run.samples.get(f, {})]
    spreads += [float(v) for f in files if "spread" in run.tables[f].columns
                for v in run.tables[f]["spread"].dropna()]
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
                label = _label(compared()[file], compared()[file].identity, row)
                raise ReadError(run.path / file, f"row {index} ({label}) contradicts its samples: "
                                f"{why}; refusing to compare it")


def _compare_table(file: str, base: Run, new: Run, metric: Metric, threshold: float,
                   notes: list[str], typical: tuple[float | None, float | None]) -> list[Row]:
    b, n = base.tables[file], new.tables[file]
    if not len(b) or not len(n):
        notes.append(f"{file}: no rows in {'BASE' if not len(b) else 'NEW'}")
        return []
    out = compared()[file]
    keys = _keys(out, b, n, notes)
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
        judged = _judge(_higher_is_better(metric, out, side), threshold, m.get(f"{column}_b"),
                        m.get(f"{column}_n"), _reps(base, file, int(m["_row_b"])),
                        _reps(new, file, int(m["_row_n"])), ok, typical,
                        (_num(m.get("spread_b")), _num(m.get("spread_n"))))
        rows.append(replace(judged, file=file, group=_group(out, side),
                            label=_label(out, keys, side)))
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


def _holds(run: Run) -> str:
    """A run's tables for a refusal, each that compare does not read with why; a run of none
    (topo) says what made it."""
    if not run.tables:
        return f"none (`distbench {run.command}` writes none)" if run.meta else "none"
    why = {o.file: o.not_compared for o in outputs() if o.not_compared}
    return ", ".join(f"{f} ({why[f]})" if f in why else f for f in run.tables)


def compare(base: Run, new: Run, metric: str = "auto",
            threshold: float = DEFAULT_THRESHOLD) -> Comparison:
    """Raises ReadError when the two runs have no row in common."""
    chosen = Metric.of(metric)
    shared = [f for f in compared() if f in base.tables and f in new.tables]
    if not shared:
        raise ReadError(new.path, "shares no table compare reads with "
                        f"{base.path} (it reads {', '.join(compared())}; BASE has "
                        f"{_holds(base)}, NEW has {_holds(new)})")
    files = [f for f in shared if f in chosen.columns]
    if not files:
        others = sorted(m for m in METRICS
                        if all(f in Metric.of(m).columns for f in shared))
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
        why = "; ".join([", ".join(compared()[files[0]].identity)] + notes)
        raise ReadError(new.path, f"no row in common with {base.path} (rows are matched on "
                        f"{why})")
    return Comparison(chosen, threshold, rows, setup_differences(base, new), notes, typical)
