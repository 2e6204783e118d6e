"""Runs read back for report and compare: a distbench run directory (its CSVs with pandas, each
row's samples, run.json and topo.json), or an nccl-tests log read into collective.csv's rows.
Torch-free; bad input is a ReadError naming the file and what was expected."""

from __future__ import annotations

import csv
import io
import json
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from distbench.core.contracts import NONNEGATIVE, NUMBERS, OUTPUTS, WATCH, measure_of
from distbench.core.errors import ReadError, one_line
from distbench.core.sizes import format_size
from distbench.results import nccltests, samples

# What report and compare need of each CSV (core.contracts): an older run may lack the columns
# added since, not these.
# watch.csv is reported, not compared: its rows are cycles, not repetitions of one measurement.
REQUIRED: dict[str, tuple[str, ...]] = {o.file: o.required for o in (*OUTPUTS, WATCH)}
NCCL_TESTS = "nccl-tests"
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
    frame = pd.DataFrame(rows, columns=list(REQUIRED["collective.csv"]) + [
        k for k in (rows[0] if rows else {}) if k not in REQUIRED["collective.csv"]])
    frame, dropped = _plausible("collective.csv", _numbers(path, frame))
    return Run(path, path.name, NCCL_TESTS, tables={"collective.csv": frame.reset_index(
        drop=True)}, dropped=dropped)


def _load_dir(path: Path) -> Run:
    meta = _json(path / "run.json")
    tables: dict[str, pd.DataFrame] = {}
    kept: dict[str, dict[int, list[float]]] = {}
    dropped: list[str] = []
    cut: list[str] = []
    for name, required in REQUIRED.items():
        csv_path = path / name
        if not csv_path.is_file():
            continue
        frame, cut_here, written = _csv(csv_path, required)
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
                        f"{path.name} columns of docs/results.md)")
    # csv and pandas both skip blank lines, so the n-th row of one is the n-th of the other
    rows = [r for r in csv.reader(io.StringIO(text)) if r][1:]
    width = len(frame.columns)
    short = [i for i, r in enumerate(rows) if len(r) < width and i in frame.index]
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
    where no measurement can be) emptied, and each named; a row whose size is such a cell is
    left out whole."""
    frame, dropped = frame.copy(), []
    for column in NUMBERS:
        if column not in frame.columns:
            continue
        values = frame[column]
        bad = values.notna() & ~(values.abs() < BEYOND)
        if column in NONNEGATIVE:
            bad |= values < 0
        dropped += [f"{name} row {i + 1} {column} {values[i]:g}" for i in values.index[bad]]
        frame[column] = values.where(~bad)
        if column == "size_bytes":
            frame = frame[~bad]
    return frame, dropped


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


def _mapping(value) -> dict:
    return value if isinstance(value, dict) else {}


def versions(run: Run) -> dict:
    return _mapping(run.meta.get("versions"))


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
        for kind in _mapping(_mapping(node.get("gpu_links")).get("links")).values():
            kinds[str(kind)] = kinds.get(str(kind), 0) + 1
        cpu = _mapping(node.get("cpu"))
        if cpu.get("model"):
            cpus.add(f"{cpu.get('model')} x{cpu.get('logical_cores')}")
    parts = [", ".join(f"{n} x {k}" for k, n in sorted(kinds.items()))] if kinds else []
    parts += sorted(cpus)
    return "; ".join(parts) or None


# ---------------------------------------------------------------------------------------------
# A watch run, cycle by cycle: watch.jsonl, else watch.csv (which records no late counts nor the
# judge's words). Every field is read as optional: a line cut short by a crash, or a field a
# later watch renames, leaves a gap, not a traceback.

WATCH_LINES = "watch.jsonl"
PROBE_NUMBERS = ("size_bytes", "time_us", "busbw_gbps")


@dataclass
class WatchHistory:
    """What a watch run recorded, as report shows it. `cycles`: a row per cycle (cycle,
    started, verdict, stragglers and late, each a tuple of ranks); `probes`: a row per cycle
    and probe (cycle, probe: its label, op, size_bytes, scope, status, time_us, busbw_gbps,
    state); `changes`: a row per change (cycle, started, what: a probe or "rank N", change,
    why: the judge's words, or None)."""

    cycles: pd.DataFrame
    probes: pd.DataFrame
    changes: pd.DataFrame
    source: str  # the file read
    window: int | None  # the cycles a late count is over (--last; 1 with --once), if known
    unreadable: int = 0  # lines of watch.jsonl that are no cycle (cut short by a crash)
    interval_s: float | None = None


def watch_history(run: Run) -> WatchHistory | None:
    """The run's cycles; None for a run that is no watch run (no watch.jsonl nor watch.csv)."""
    found = _watch_lines(run)
    if found is None:
        return None
    lines, unreadable, source = found
    lines.sort(key=lambda line: line["cycle"])
    options = _mapping(run.meta.get("options"))
    window = 1 if options.get("once") else _int(options.get("last"))
    interval = _number(options.get("interval"))
    if interval is None and lines:
        interval = _number(lines[0].get("interval_s"))
    late = _late_ranks(lines, window)
    cycles = pd.DataFrame(
        [{"cycle": line["cycle"], "started": _text(line.get("started")),
          "verdict": _text(line.get("verdict")) or UNKNOWN,
          "stragglers": tuple(_ranks(line.get("stragglers"))), "late": ranks}
         for line, ranks in zip(lines, late, strict=True)],
        columns=["cycle", "started", "verdict", "stragglers", "late"])
    probes = _probe_rows(lines)
    return WatchHistory(cycles, probes, _changes(lines, cycles, probes), source, window,
                        unreadable, interval)


def probe_label(op, size, scope) -> str:
    """A probe as watch's change lines name it: "all_reduce 1 MiB cluster"."""
    size = _number(size)
    shown = format_size(int(size)) if size is not None else "?"
    return f"{op} {shown} {scope}"


def _watch_lines(run: Run) -> tuple[list[dict], int, str] | None:
    path = run.path / WATCH_LINES
    if run.path.is_dir() and path.is_file():
        try:
            text = path.read_text(errors="replace")
        except OSError as e:
            raise ReadError(path, f"not readable ({e.strerror})") from None
        lines, unreadable = [], 0
        for raw in text.splitlines():
            if not raw.strip():
                continue
            try:
                line = json.loads(raw)
            except ValueError:
                line = None
            if isinstance(line, dict) and _int(line.get("cycle")) is not None:
                lines.append({**line, "cycle": _int(line["cycle"])})
            else:
                unreadable += 1
        return lines, unreadable, WATCH_LINES
    frame = run.table(WATCH.file)
    if frame is None:
        return None
    lines = []
    for cycle, rows in frame.groupby("cycle", sort=True):
        first = rows.iloc[0]
        lines.append({"cycle": int(cycle), "started": first.get("started"),
                      "verdict": first.get("verdict"), "stragglers": first.get("stragglers"),
                      "probes": rows.to_dict("records")})
    return lines, 0, WATCH.file


def _int(value) -> int | None:
    number = _number(value)
    return int(number) if number is not None and number == int(number) else None


def _number(value) -> float | None:
    """A finite figure, or None: a missing field, null, text, or no measurement's figure."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if abs(number) < BEYOND else None  # NaN and infinities fail it too


def _text(value) -> str:
    return "" if value is None or (isinstance(value, float) and value != value) else str(value)


def _ranks(value) -> list[int]:
    """Ranks as watch.jsonl lists them ([1, 3]) or watch.csv spells them ("1 3", or 1.0 where
    pandas read a lone rank as a number)."""
    if isinstance(value, str):
        value = value.split()
    elif not isinstance(value, list | tuple):
        value = [value]
    return sorted({r for r in map(_int, value) if r is not None and r >= 0})


def _late_counts(line: dict) -> dict[int, int] | None:
    counts = line.get("late_counts")
    if not isinstance(counts, dict):
        return None
    return {rank: n for k, v in counts.items()
            if (rank := _int(k)) is not None and (n := _int(v)) is not None}


def _told(line: dict) -> bool:
    """Whether the judge could tell who came late in the cycle (judge.Tracker._late_ranks): a
    probe measured with a rank the others waited for. Cycles that measured nothing add no late
    count either way."""
    return any(isinstance(p, dict) and p.get("status") == "ok" and (_number(p.get("time_us"))
               or 0) > 0 and p.get("late_rank") is not None and p.get("lateness_us") is not None
               for p in line.get("probes") or [])


def _late_ranks(lines: list[dict], window: int | None) -> list[tuple[int, ...]]:
    """Per cycle, the ranks the judge counted late in it. late_counts is each rank's late
    cycles among the last `window` judged, so a rank was late in this one by as much as its
    count exceeds what the window's other cycles hold: a rise alone misses the late cycle that
    enters as another leaves. `late_rank` is no sign: some rank always arrives last by a hair.
    Where the counts are not recorded (watch.csv), a named straggler is the only sign."""
    judged: deque[dict[int, int]] = deque(maxlen=max(window - 1, 0) if window else 0)
    before: dict[int, int] = {}
    out = []
    for line in lines:
        counts = _late_counts(line)
        if counts is None:
            out.append(tuple(_ranks(line.get("stragglers"))))
            continue
        flags = {}
        if _told(line) or counts != before:
            for rank in set(counts) | {r for f in judged for r in f}:
                now = counts.get(rank, 0)
                flag = now - sum(f.get(rank, 0) for f in judged) if window else -1
                # a window not known, or counts that do not add up (a judge of other rules):
                # a rise is what the counts still say
                flags[rank] = flag if flag in (0, 1) else int(now > before.get(rank, 0))
            judged.append(flags)
        before = counts
        out.append(tuple(sorted(r for r, f in flags.items() if f)))
    return out


def _probe_rows(lines: list[dict]) -> pd.DataFrame:
    rows = [{"cycle": line["cycle"], **p} for line in lines
            for p in line.get("probes") or [] if isinstance(p, dict)]
    columns = ["cycle", "probe", "op", "size_bytes", "scope", "status", "time_us", "busbw_gbps",
               "state"]
    frame = pd.DataFrame(rows, columns=list(dict.fromkeys(columns + [
        k for r in rows for k in r])))
    for column in PROBE_NUMBERS:
        frame[column] = frame[column].map(_number).astype(float)
    for column in ("op", "scope", "status", "state"):
        frame[column] = frame[column].map(_text)
    frame["scope"] = frame["scope"].replace("", "cluster")
    frame["probe"] = [probe_label(*k) for k in zip(frame["op"], frame["size_bytes"],
                                                   frame["scope"], strict=True)]
    # a state not recorded is the one before it: a gap is no change
    frame["state"] = frame["state"].where(frame["state"] != "")
    frame["state"] = frame.groupby("probe", sort=False)["state"].ffill().fillna(UNKNOWN)
    return frame[columns].reset_index(drop=True)


def _why(lines: list[str], prefix: str) -> str | None:
    """The judge's reason in the cycle's change line that starts with `prefix` (the words in
    its parentheses); the line is taken, so each is shown once. None when no line says."""
    for i, line in enumerate(lines):
        if line.startswith(prefix):
            del lines[i]
            rest = line[len(prefix):]
            return rest[rest.index("(") + 1:].removesuffix(")") if "(" in rest else rest
    return None


def _changes(lines: list[dict], cycles: pd.DataFrame, probes: pd.DataFrame) -> pd.DataFrame:
    """Each probe's state changes (from its per-cycle state), the stragglers named and cleared
    (from the per-cycle list), each with the judge's words where its change line says them,
    and any change line of the judge's that neither explains."""
    said = {line["cycle"]: [str(c) for c in line.get("changes") or [] if c]
            for line in lines if isinstance(line.get("changes"), list)}
    started = dict(zip(cycles["cycle"], cycles["started"], strict=True))
    out = []
    before = probes.groupby("probe", sort=False)["state"].shift().fillna(UNKNOWN)
    for row, old in zip(probes.itertuples(), before, strict=True):
        if row.state != old:
            out.append((row.cycle, row.probe, f"{old} -> {row.state}",
                        _why(said.get(row.cycle, []), f"{row.probe}: ")))
    named: set[int] = set()
    for cycle, now in zip(cycles["cycle"], cycles["stragglers"], strict=True):
        for rank in sorted(set(now) ^ named):
            change = "named a straggler" if rank in now else "no longer a straggler"
            out.append((cycle, f"rank {rank}", change, _why(said.get(cycle, []), f"rank {rank}: ")))
        named = set(now)
    out += [(cycle, "-", line, None) for cycle, left in said.items() for line in left]
    frame = pd.DataFrame(out, columns=["cycle", "what", "change", "why"])
    frame.insert(1, "started", frame["cycle"].map(started).fillna(""))
    return frame.sort_values("cycle", kind="stable").reset_index(drop=True)
