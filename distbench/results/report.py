"""`distbench report`'s machinery: read runs (run directories and nccl-tests logs) are written
out as report.md, the plots beside it and model.json (the alpha-beta fits). What each kind of
run adds (its section, its plots, its fits) is the kind's own (distbench/kinds/<name>/output.py),
handed in as `Reported` objects; what lies here is shared by every kind. Torch-free: it never
starts a worker, so it stays fast."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

import pandas as pd

from distbench.core.layout_label import row_label
from distbench.core.sizes import format_size
from distbench.core.tables import markdown_table, missing, number
from distbench.results import alphabeta, reader
from distbench.results.reader import Run, measured


class Reported(Protocol):
    """What a kind of run adds to a report (a kinds.Kind): each may be None. `section`: its
    lines of report.md, from the tables it knows, whichever command wrote them; `plots`: the
    PNGs it draws of every run, in the output directory; `fits`: a run's alpha-beta models
    (model.json, --predict), each naming its run ("run"); `world_note`: what the header adds
    after the run's world size."""

    section: Callable[[Run], list[str]] | None
    plots: Callable[[list[Run], Path], list[Path]] | None
    fits: Callable[[Run], list[dict]] | None
    world_note: Callable[[Run], str] | None


def peaks(frame: pd.DataFrame, group: list[str], rate: str) -> list[dict]:
    """Per group: the peak rate, the size it is reached at, and the time at the smallest size."""
    out = []
    for key, rows in measured(frame).groupby(group, sort=False, dropna=False):
        rows = rows[rows[rate].notna()].sort_values("size_bytes")
        if not len(rows):
            continue
        best = rows.loc[rows[rate].idxmax()]
        first = rows.iloc[0]
        out.append({**dict(zip(group, key if isinstance(key, tuple) else (key,), strict=True)),
                    "peak": float(best[rate]), "peak_at": int(best["size_bytes"]),
                    "small": int(first["size_bytes"]), "small_us": float(first["time_us"])})
    return out


def fixed(v, spec: str) -> str:
    """A figure in a fixed format (".1f"); "-" for none."""
    return "-" if missing(v) else format(v, spec)


def size_cell(v) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format_size(int(v))


def _world(run: Run, kinds: list[Reported]) -> str:
    ranks, nodes = reader.world_size(run), reader.nnodes(run)
    if ranks == reader.UNKNOWN and nodes != reader.UNKNOWN:  # a run of no ranks (topo's)
        return f"{nodes} node(s)"
    if reader.UNKNOWN in (ranks, nodes):  # a log printed without its device list
        return f"ranks {ranks}, nodes {nodes}"
    return f"{ranks} ranks on {nodes} node(s)" + "".join(
        kind.world_note(run) for kind in kinds if kind.world_note)


def _run_header(run: Run, kinds: list[Reported]) -> list[str]:
    m = run.meta
    if not m:
        return [f"## {run.name}", "", f"{run.command} output read from `{run.path}`: "
                f"{_world(run, kinds)}.", ""]
    versions = reader.versions(run)
    bits = [f"`distbench {m.get('command')}`", f"status **{m.get('status')}** "
            f"(exit {m.get('exit_code')})", _world(run, kinds)]
    # a fact the run did not record (topo starts no backend) is left out, not printed "None"
    bits += [f"{name} {value}" for name, value in (
        ("backend", m.get("backend")), ("torch", versions.get("torch")),
        ("NCCL", versions.get("nccl"))) if value]
    lines = [f"## {run.name}", "", ", ".join(bits) + f"; `{run.path}`.", ""]
    if m.get("error"):
        lines += [f"Ended with: {m['error']}", ""]
    return lines


def redop_root(fit: dict) -> str:
    root = fit.get("root")
    return str(fit["redop"]) + (f" root {root}" if root is not None and root >= 0 else "")


def step_table(run: Run, file: str, title: str, header: list[str],
                  cells: Callable[[pd.Series], list[str]]) -> list[str]:
    """A training-step command's section: its measured rows, one line each."""
    frame = run.table(file)
    if frame is None:
        return []
    return [f"### {title}", ""] + markdown_table(
        header, [cells(r) for _, r in measured(frame).iterrows()]) + [""]


def layout_text(row: pd.Series) -> str:
    return row_label(row.to_dict())


def ms(row: pd.Series, column: str) -> str:
    value = row.get(column)
    return "-" if missing(value) else number(float(value) / 1e3)


def skipped(frame: pd.DataFrame) -> list[str]:
    skipped = frame[frame["status"] == "skipped"]
    if not len(skipped):
        return []
    why = sorted({str(n) for n in skipped.get("note", pd.Series(dtype=str)).dropna()})
    return [f"{len(skipped)} rows skipped" + (": " + "; ".join(why[:5]) if why else ""), ""]


def _no_results(run: Run, kinds: list[Reported]) -> list[str]:
    """Why a run no section reads shows nothing: a CSV report does not know, or none."""
    others = sorted(p.name for p in run.path.glob("*.csv")) if run.path.is_dir() else []
    if others and not run.tables:
        return [f"No table report reads: {', '.join(others)} is not one of "
                f"{', '.join(reader.required())}.", ""]
    return [f"No result rows: `distbench {run.command}` wrote none.", ""]


def _dropped(run: Run) -> list[str]:
    return [f"{line}." for line in reader.left_out(run)] + [""] * bool(run.dropped or run.cut)


def markdown(runs: list[Run], kinds: Iterable[Reported], images: list[Path]) -> list[str]:
    lines = ["# distbench report", "", "Runs: " + ", ".join(f"`{r.name}`" for r in runs), ""]
    kinds = list(kinds)
    for run in runs:
        lines += _run_header(run, kinds)
        lines += _dropped(run)
        sections = [line for kind in kinds if kind.section for line in kind.section(run)]
        lines += sections or _no_results(run, kinds)
    if images:
        lines += ["## Plots", ""] + [f"![{p.stem}]({p.name})" for p in images] + [""]
    return lines


def fits_of(run: Run, kinds: Iterable[Reported]) -> list[dict]:
    return [f for kind in kinds if kind.fits for f in kind.fits(run)]


def write(runs: list[Run], out: Path, kinds: Iterable[Reported]) -> tuple[list[str], list[Path]]:
    """report.md, model.json and the plots in `out`; returns report.md's lines and the files."""
    from distbench.results.writer import write_json

    kinds = list(kinds)
    out.mkdir(parents=True, exist_ok=True)
    fits = [f for run in runs for f in fits_of(run, kinds)]
    images = [p for kind in kinds if kind.plots for p in kind.plots(runs, out)]
    lines = markdown(runs, kinds, images)
    (out / "report.md").write_text("\n".join(lines) + "\n")
    files = [out / "report.md", *images]
    if fits:
        write_json(out / "model.json", {"schema_version": 1, "model": "T(S) = alpha + S / beta",
                                         "fits": fits})
        files.insert(1, out / "model.json")
    return lines, files


def predict(fits: Iterable[dict], op: str, size: int) -> list[str]:
    """The time and busbw each fit (`fits_of`'s, each naming its run) predicts for `op` at
    `size`, one line per fit."""
    lines = []
    for f in fits:
        if f["op"] != op or f.get("alpha_us") is None:
            continue
        t_us, busbw = alphabeta.predict_row(f, size)
        place = "in-place" if f["in_place"] else "out-of-place"
        lines.append(f"{f['run']}: {op} {f['dtype']} {redop_root(f)} {place} at "
                     f"{format_size(size)}: "
                     f"{number(t_us)} us, busbw {number(busbw)} GB/s (alpha "
                     f"{number(f['alpha_us'], 3)} us, busbw asymptote "
                     f"{number(f['busbw_gbps'])} GB/s)")
    return lines
