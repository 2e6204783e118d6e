"""A watch run read back, cycle by cycle, for report: watch.jsonl, else watch.csv (which records
no late counts nor the judge's words). Every field is read as optional: a line cut short by a
crash, or a field a later watch renames, leaves a gap, not a traceback."""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass

import pandas as pd

from distbench.core.errors import ReadError
from distbench.core.sizes import format_size
from distbench.results.reader import BEYOND, UNKNOWN, Run, as_mapping

WATCH_LINES = "watch.jsonl"
WATCH_CSV = "watch.csv"  # kinds/watch/output.py's contract
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
    options = as_mapping(run.meta.get("options"))
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
    frame = run.table(WATCH_CSV)
    if frame is None:
        return None
    lines = []
    for cycle, rows in frame.groupby("cycle", sort=True):
        first = rows.iloc[0]
        lines.append({"cycle": int(cycle), "started": first.get("started"),
                      "verdict": first.get("verdict"), "stragglers": first.get("stragglers"),
                      "probes": rows.to_dict("records")})
    return lines, 0, WATCH_CSV


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
