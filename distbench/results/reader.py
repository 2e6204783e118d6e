"""Runs read back for report and compare: a distbench run directory (its CSVs with pandas, each
row's samples, run.json and topo.json), or an nccl-tests log read into collective.csv's rows.
Torch-free; bad input is a ReadError naming the file and what was expected."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from distbench.core.contracts import NONNEGATIVE, NUMBERS, measure_of, outputs
from distbench.core.errors import ReadError, one_line
from distbench.results import nccltests, samples

NCCL_TESTS = "nccl-tests"


def required() -> dict[str, tuple[str, ...]]:
    """Each CSV report and compare read (core.contracts, and any a kind registered), and the
    columns they need of it: an older run may lack the columns added since, not these."""
    return {o.file: o.required for o in outputs()}
# Beyond any time (us), bandwidth (GB/s), size or ratio a run can record: such a cell is a
# broken write, and drawn it would squash every real figure into one pixel.
BEYOND = 1e18


@dataclass
class Run:
    path: Path
    name: str  # the short label plots and tables use
    command: str  # what made it: a distbench command, or "nccl-tests"
    meta: dict = field(default_factory=dict)  # run.json ({} for an nccl-tests log)
    topo: dict = field(default_factory=dict)  # topo.json
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)  # file name -> rows
    samples: dict[str, dict[int, samples.Kept]] = field(default_factory=dict)
    # what was read but left out, as "<file> row N <column> <value>": cells no measurement can
    # take, and rows cut short (a write that stopped mid-row); report and compare name them
    dropped: list[str] = field(default_factory=list)
    cut: list[str] = field(default_factory=list)

    def table(self, name: str) -> pd.DataFrame | None:
        return self.tables.get(name)


def load(path: Path) -> Run:
    path = Path(path)
    if path.is_dir():
        return _load_dir(path)
    if not path.exists():
        raise ReadError(path, "no such file or directory (expected a distbench run directory "
                        "or an nccl-tests log)")
    rows = nccltests.read(path)  # raises ReadError when it is no nccl-tests output either
    table = nccltests.contract().file
    columns = required()[table]
    frame = pd.DataFrame(rows, columns=list(columns) + [
        k for k in (rows[0] if rows else {}) if k not in columns])
    frame, dropped = _plausible(table, _numbers(path, frame))
    return Run(path, path.name, NCCL_TESTS, tables={table: frame.reset_index(
        drop=True)}, dropped=dropped)


def _load_dir(path: Path) -> Run:
    meta = _json(path / "run.json")
    tables: dict[str, pd.DataFrame] = {}
    kept: dict[str, dict[int, list[float]]] = {}
    dropped: list[str] = []
    cut: list[str] = []
    for name, columns in required().items():
        csv_path = path / name
        if not csv_path.is_file():
            continue
        frame, cut_here, written = _csv(csv_path, columns)
        frame, dropped_here = _plausible(name, frame)
        dropped += dropped_here
        cut += cut_here
        kept[name] = _renumbered(samples.read(samples.path_for(csv_path)), frame.index,
                                 written)
        tables[name] = frame.reset_index(drop=True)
    if not tables and meta is None:
        raise ReadError(path, "no run here (expected run.json and a CSV such as "
                        "collective.csv, as distbench writes in results/<run>/)")
    # run.json alone is still a run: topo writes no CSV, and a run that failed before its
    # first row says how it ended
    meta = meta or {}
    command = str(meta.get("command") or (next(iter(tables)).removesuffix(".csv") if tables
                                          else UNKNOWN))
    return Run(path, path.resolve().name, command, meta, _json(path / "topo.json") or {}, tables,
               kept, dropped, cut)


def _json(path: Path) -> dict | None:
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise ReadError(path, f"not readable JSON ({e})") from None
    if not isinstance(data, dict):
        raise ReadError(path, "expected a JSON object")
    return data


def _csv(path: Path, required: tuple[str, ...]) -> tuple[pd.DataFrame, list[str], int]:
    """The rows, less those cut short; those named ("<file> row N (k of n cells)"); and how
    many rows the file holds. pandas
    fills a short row's missing cells with nothing, so a row a crash stopped mid-write would be
    read as a measurement: `...,262144,65536,10,11` is a time of 11 us where 1136 was being
    written."""
    try:
        text = path.read_text(encoding="utf-8")
        frame = pd.read_csv(io.StringIO(text), keep_default_na=False, na_values=[""])
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise ReadError(path, f"not a readable CSV ({one_line(e, whole=True)})") from None
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise ReadError(path, f"missing columns {', '.join(missing)} (expected the "
                        f"{path.name} columns of docs/columns.md)")
    # csv and pandas both skip blank lines, so the n-th row of one is the n-th of the other
    rows = [r for r in csv.reader(io.StringIO(text)) if r][1:]
    width = len(frame.columns)
    short = [i for i, r in enumerate(rows) if len(r) < width and i in frame.index]
    if short:
        frame = frame.drop(index=short)
    if "status" in frame.columns:
        frame["status"] = frame["status"].fillna("ok")
    return _numbers(path, frame), [f"{path.name} row {i + 1} ({len(rows[i])} of {width} cells)"
                                   for i in short], len(rows)


def _renumbered(kept: dict, rows: pd.Index, written: int) -> dict:
    """Samples are kept by row number: a row left out takes its samples with it, and the rows
    after it move up. Samples of a row the file never held keep a number past the table's end,
    for compare to refuse them (a CSV edited after the run)."""
    position = {row: i for i, row in enumerate(rows)}
    gone = written - len(rows)
    return {position.get(row, row - gone): v for row, v in kept.items()
            if row in position or row >= written}


def _numbers(path: Path, frame: pd.DataFrame) -> pd.DataFrame:
    """Numeric columns as numbers (an empty cell, or nan, is no value)."""
    for column in NUMBERS:
        if column not in frame.columns:
            continue
        if pd.api.types.is_bool_dtype(frame[column]):
            frame[column] = frame[column].astype("int64")
            continue
        if pd.api.types.is_numeric_dtype(frame[column]):
            continue  # read as numbers already: the checks below cost a millisecond a column
        values = frame[column].map(_bool_as_int)
        numbers = pd.to_numeric(values, errors="coerce")
        bad = numbers.isna() & values.notna() & ~values.astype(str).str.strip().str.lower().isin(
            ["", "nan", "none"])
        if bad.any():
            row = int(bad.idxmax())
            raise ReadError(path, f"column {column} holds {values[row]!r} in row {row + 1}, "
                            "not a number")
        frame[column] = numbers
    return frame


def _plausible(name: str, frame: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The table with every cell no measurement can take (infinite, beyond BEYOND, or negative
    where no measurement can be) emptied, and each named, column by column in NUMBERS' order; a
    row whose size is such a cell is left out whole, and the columns after size_bytes no longer
    name its cells. Judged on one array of all the columns: column by column in pandas, the
    checks were most of what reading a run cost."""
    columns = [c for c in NUMBERS if c in frame.columns]
    if not columns:
        return frame, []
    values = np.column_stack([frame[c].to_numpy(dtype=float) for c in columns])
    nonnegative = np.array([c in NONNEGATIVE for c in columns])
    bad = ~np.isnan(values) & ~(np.abs(values) < BEYOND) | (values < 0) & nonnegative
    if not bad.any():
        return frame, []
    size = columns.index("size_bytes") if "size_bytes" in columns else len(columns)
    gone = bad[:, size] if size < len(columns) else np.zeros(len(frame), dtype=bool)
    frame, dropped = frame.copy(), []
    for j, column in enumerate(columns):
        named = bad[:, j] & ~gone if j > size else bad[:, j]
        dropped += [f"{name} row {i + 1} {column} {frame.at[i, column]:g}"
                    for i in frame.index[named]]
        if bad[:, j].any():
            frame[column] = frame[column].where(~bad[:, j])
    return frame[~gone], dropped


def left_out(run: Run) -> list[str]:
    """What was read but left out, one sentence each (no full stop), the first five named."""
    def named(items: list[str]) -> str:
        return "; ".join(items[:5]) + ("; ..." if len(items) > 5 else "")

    lines = []
    if run.dropped:
        lines.append(f"Left out {len(run.dropped)} value(s) no measurement can take (not "
                     f"finite, negative, or beyond {BEYOND:g}): {named(run.dropped)}")
    if run.cut:
        lines.append(f"Left out {len(run.cut)} row(s) cut short, fewer cells than the header "
                     f"(a write that stopped mid-row): {named(run.cut)}")
    return lines


def _bool_as_int(v):
    return int(v) if isinstance(v, bool) else v


def load_all(paths: list[Path]) -> list[Run]:
    """Each input once, with labels that tell them apart (docs/report.md)."""
    runs = [load(p) for p in paths]
    for run, name in zip(runs, labels(runs), strict=True):
        run.name = name
    return runs


def labels(runs: list[Run]) -> list[str]:
    """Different inputs of one name get their parent's name in front; inputs still alike (the
    same one given twice) are numbered, every one of them, so none passes for the only one."""
    where: dict[str, set[Path]] = {}
    for r in runs:
        where.setdefault(r.name, set()).add(r.path.resolve())
    names = [f"{r.path.resolve().parent.name}/{r.name}" if len(where[r.name]) > 1 else r.name
             for r in runs]
    seen: dict[str, int] = {}
    out = []
    for name in names:
        if names.count(name) > 1:
            seen[name] = seen.get(name, 0) + 1
            name = f"{name} ({seen[name]})"
        out.append(name)
    return out


def as_mapping(value) -> dict:
    return value if isinstance(value, dict) else {}


def versions(run: Run) -> dict:
    return as_mapping(run.meta.get("versions"))


UNKNOWN = "unknown"


def check_metric(metric: str) -> tuple[str, bool]:
    """(unit, higher is better) of an accept.csv row's metric. A metric this version does not
    know (a newer run's) is read by its suffix: a time in us is better lower."""
    measure = measure_of(metric)
    return measure.unit, measure.higher_is_better


def is_retest(frame: pd.DataFrame) -> pd.Series:
    """accept.csv's rows measured again, as a mask (the column is 1/0, True/False in JSON)."""
    return frame["retest"].fillna(0).astype(float) != 0


def world_size(run: Run) -> str:
    """The ranks a run ran on, for people: run.json's figure, else what its rows say (an
    nccl-tests log's device list); "unknown" where nothing says, as a log printed without its
    device list."""
    return _setup_figure(run, "world_size")


def nnodes(run: Run) -> str:
    """The nodes a run ran on, as world_size() tells its ranks."""
    return _setup_figure(run, "nnodes")


def _setup_figure(run: Run, key: str) -> str:
    value = run.meta.get(key)
    if value is not None:
        return str(value)
    # a log may hold several tests, each of its own world: all of them are the run's
    found = sorted({int(v) for frame in run.tables.values() if key in frame.columns
                    for v in frame[key].dropna()})
    return ", ".join(map(str, found)) or UNKNOWN


def dp_mode(row) -> str:
    """A dp.csv row as run.json's dp section names it: "ddp 25 MiB", "zero3"."""
    bucket = row.get("bucket_cap_mb")
    return str(row["mode"]) + ("" if bucket is None or pd.isna(bucket) else f" {bucket:g} MiB")


def measured(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows that hold a measurement (not skipped, not failed)."""
    if "status" not in frame.columns:
        return frame
    return frame[frame["status"].isin(["ok", "wrong"])]


def topo_nodes(run: Run) -> list[dict]:
    """topo.json's nodes, each a dict ([] where it has none, or is not of that shape)."""
    nodes = run.topo.get("nodes")
    return [n for n in nodes if isinstance(n, dict)] if isinstance(nodes, list) else []


def gpu_model(run: Run) -> str | None:
    names = sorted({str(g.get("name")) for node in topo_nodes(run)
                    for g in (node.get("gpus") if isinstance(node.get("gpus"), list) else [])
                    if isinstance(g, dict) and g.get("name")})
    return ", ".join(names) or None


def topology_summary(run: Run) -> str | None:
    """One line: the GPU-GPU link kinds and the CPU, as topo.json records them."""
    kinds: dict[str, int] = {}
    cpus = set()
    for node in topo_nodes(run):
        for kind in as_mapping(as_mapping(node.get("gpu_links")).get("links")).values():
            kinds[str(kind)] = kinds.get(str(kind), 0) + 1
        cpu = as_mapping(node.get("cpu"))
        if cpu.get("model"):
            cpus.add(f"{cpu.get('model')} x{cpu.get('logical_cores')}")
    parts = [", ".join(f"{n} x {k}" for k, n in sorted(kinds.items()))] if kinds else []
    parts += sorted(cpus)
    return "; ".join(parts) or None
