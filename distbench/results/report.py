"""`distbench report`: read run directories (and nccl-tests logs) back and write report.md, the
plots beside it and model.json (the alpha-beta fit per op). Torch-free: it never starts a
worker, so it stays fast."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from distbench.core.layout_label import row_label
from distbench.core.sizes import format_size
from distbench.core.tables import markdown_table, missing, number, plural
from distbench.core.validation_table import validation_table
from distbench.results import alphabeta, reader
from distbench.results.reader import NCCL_TESTS, Run, measured


def models(run: Run) -> list[dict]:
    """The alpha-beta fit of every op (and dtype, redop, placement) of a run's collective.csv,
    plus the run's name."""
    frame = run.table("collective.csv")
    if frame is None:
        return []
    return [{"run": run.name, **m} for m in alphabeta.fit_rows(frame)]


def _peaks(frame: pd.DataFrame, group: list[str], rate: str) -> list[dict]:
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


def _fmt(v, spec: str) -> str:
    """A figure in a fixed format (".1f"); "-" for none."""
    return "-" if missing(v) else format(v, spec)


def _size(v) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format_size(int(v))


def _world(run: Run) -> str:
    ranks, nodes = reader.world_size(run), reader.nnodes(run)
    if ranks == reader.UNKNOWN and nodes != reader.UNKNOWN:  # a run of no ranks (topo's)
        return f"{nodes} node(s)"
    if reader.UNKNOWN in (ranks, nodes):  # a log printed without its device list
        return f"ranks {ranks}, nodes {nodes}"
    return f"{ranks} ranks on {nodes} node(s)" + _groups(run)


def _groups(run: Run) -> str:
    """How a `collective --group-size` run split its world, said where it did."""
    frame = run.tables.get("collective.csv")
    if frame is None or "group_size" not in frame.columns or not len(frame):
        return ""
    row = frame.iloc[0]
    if missing(row.get("groups")) or int(row["groups"]) <= 1:
        return ""
    return (f", in {int(row['groups'])} groups of {int(row['group_size'])} at stride "
            f"{int(row['group_stride'])} ({int(row['per_node'])} a node) all at once")


def _run_header(run: Run) -> list[str]:
    m = run.meta
    if not m:
        return [f"## {run.name}", "", f"{run.command} output read from `{run.path}`: "
                f"{_world(run)}.", ""]
    versions = reader.versions(run)
    bits = [f"`distbench {m.get('command')}`", f"status **{m.get('status')}** "
            f"(exit {m.get('exit_code')})", _world(run)]
    # a fact the run did not record (topo starts no backend) is left out, not printed "None"
    bits += [f"{name} {value}" for name, value in (
        ("backend", m.get("backend")), ("torch", versions.get("torch")),
        ("NCCL", versions.get("nccl"))) if value]
    lines = [f"## {run.name}", "", ", ".join(bits) + f"; `{run.path}`.", ""]
    if m.get("error"):
        lines += [f"Ended with: {m['error']}", ""]
    return lines


def _collective_section(run: Run, fits: list[dict]) -> list[str]:
    frame = run.table("collective.csv")
    if frame is None:
        return []
    lines = ["### Collectives", ""]
    group = ["op", "dtype", "redop", "in_place"]
    peaks = _peaks(frame, group, "busbw_gbps")
    lines += markdown_table(["op", "dtype", "redop", "place", "peak busbw (GB/s)", "at size",
                             "smallest size", "time there (us)"],
                            [[p["op"], p["dtype"], str(p["redop"]),
                              "in" if p["in_place"] else "out", number(p["peak"]),
                              _size(p["peak_at"]), _size(p["small"]), number(p["small_us"])]
                             for p in peaks])
    lines += [""] + _skipped(frame)
    lines += ["#### Alpha-beta model", "",
              "`T(S) = alpha + S / beta`, alpha fitted on the small sizes and beta past the "
              "knee (docs/report.md).", ""]
    lines += markdown_table(["op", "dtype", "redop", "place", "alpha (us)",
                             "busbw asymptote (GB/s)", "fit error (median / max %)", "n_half",
                             "n_90%", "note"],
                            [[f["op"], f["dtype"], _redop_root(f),
                              "in" if f["in_place"] else "out", number(f["alpha_us"], 3),
                              number(f["busbw_gbps"]),
                              f"{_fmt(f['err_pct'], '.1f')} / {_fmt(f['max_err_pct'], '.1f')}",
                              _size(f["n_half_bytes"]), _size(f["n90_bytes"]),
                              f.get("note") or ""]
                             for f in fits])
    return lines + [""]


def _redop_root(fit: dict) -> str:
    root = fit.get("root")
    return str(fit["redop"]) + (f" root {root}" if root is not None and root >= 0 else "")


def _p2p_section(run: Run) -> list[str]:
    lines = []
    frame = run.table("p2p.csv")
    if frame is not None:
        lines += ["### Point-to-point", ""]
        lines += markdown_table(["pattern", "dtype", "peak busbw (GB/s)", "at size",
                                 "smallest size", "time there (us)"],
                                [[p["pattern"], p["dtype"], number(p["peak"]),
                                  _size(p["peak_at"]), _size(p["small"]), number(p["small_us"])]
                                 for p in _peaks(frame, ["pattern", "dtype"], "busbw_gbps")])
        lines.append("")
    frame = run.table("p2p_matrix.csv")
    if frame is not None:
        from distbench.results.plots import matrix_outliers

        slow = sorted((dtype, *link) for dtype, rows in frame.groupby("dtype", sort=False)
                      for link in matrix_outliers(run, rows))
        lines += ["### Link matrix", "",
                  f"{len(frame)} measurements; {len(slow)} slow links by the run's own rule"
                  + (":" if slow else "."), ""]
        lines += [f"- {dtype} {d} {format_size(int(size))}: rank {src} "
                  f"{'<->' if d == 'bi' else '->'} rank {dst}"
                  for dtype, d, size, src, dst in slow[:20]]
        culprits = (run.meta.get("matrix") or {}).get("culprits") or []
        if culprits:
            lines += ["", "Likely culprit: " + ", ".join(culprits)]
        lines.append("")
    return lines


def _step_section(run: Run, file: str, title: str, header: list[str],
                  cells: Callable[[pd.Series], list[str]]) -> list[str]:
    """A training-step command's section: its measured rows, one line each."""
    frame = run.table(file)
    if frame is None:
        return []
    return [f"### {title}", ""] + markdown_table(
        header, [cells(r) for _, r in measured(frame).iterrows()]) + [""]


def _tp_section(run: Run) -> list[str]:
    return _step_section(
        run, "tp.csv", "Tensor parallel",
        ["block", "dtype", "ranks", "step (ms)", "compute only (ms)", "comm %"],
        lambda r: [str(r["block"]), str(r["dtype"]), str(r["world_size"]),
                   number(r["step_us"] / 1e3), number(r["compute_only_us"] / 1e3),
                   _fmt(r["comm_pct"], ".1f")])


def _pp_section(run: Run) -> list[str]:
    return _step_section(
        run, "pp.csv", "Pipeline parallel",
        ["schedule", "micro-batches", "stages", "step (ms)", "bubble measured",
         "bubble analytic"],
        lambda r: [str(r["schedule"]), str(r["micro_batches"]), str(r.get("stages")),
                   number(r["step_us"] / 1e3), _fmt(r["bubble_measured"], ".3f"),
                   _fmt(r["bubble_analytic"], ".3f")])


def _dp_section(run: Run) -> list[str]:
    lines = _step_section(
        run, "dp.csv", "Data parallel",
        ["mode", "dtype", "ranks", "step (ms)", "compute only (ms)", "exposed comm (ms)",
         "comm alone (ms)", "overlap %", "state per rank", "ZeRO table"],
        lambda r: [reader.dp_mode(r), str(r["dtype"]), str(r["world_size"]),
                   number(r["step_us"] / 1e3), number(r["compute_only_us"] / 1e3),
                   number(r["exposed_comm_us"] / 1e3), number(r["comm_alone_us"] / 1e3),
                   _fmt(r["overlap_pct"], ".1f"), _size(r["state_bytes_per_rank"]),
                   _size(r.get("state_bytes_formula"))])
    return (lines + _skipped(run.table("dp.csv"))) if lines else []


def _layout_text(row: pd.Series) -> str:
    return row_label(row.to_dict())


def _ms(row: pd.Series, column: str) -> str:
    value = row.get(column)
    return "-" if missing(value) else number(float(value) / 1e3)


def _memory_cells(row: pd.Series) -> list[str]:
    """The measured peak beside the model's figure, and how far the model is."""
    peak, model = row.get("peak_mem_bytes"), row.get("model_mem_bytes")
    known = not missing(peak) and not missing(model) and float(peak) > 0
    error = f"{(float(model) - float(peak)) / float(peak):+.1%}" if known else "-"
    return [_size(peak), _size(model), error]


def _step_run_section(run: Run) -> list[str]:
    lines = _step_section(
        run, "step.csv", "Training step per layout",
        ["layout", "step (ms)", "compute only (ms)", "exposed tp (ms)", "exposed pp (ms)",
         "exposed dp (ms)", "bubble (ms)", "peak memory", "model memory", "model error"],
        lambda r: [_layout_text(r), _ms(r, "step_us"), _ms(r, "compute_only_us"),
                   _ms(r, "tp_exposed_us"), _ms(r, "pp_exposed_us"), _ms(r, "dp_exposed_us"),
                   _ms(r, "bubble_us"), *_memory_cells(r)])
    return (lines + _skipped(run.table("step.csv"))) if lines else []


PLAN_SHOWN = 10  # the fastest layouts that fit, as the console shows them


def _plan_section(run: Run) -> list[str]:
    lines = []
    frame = run.table("plan.csv")
    if frame is not None:
        fits = frame[frame["fits"].astype(bool)].sort_values("predicted_step_ms")
        lines += ["### Plan", "",
                  f"{len(frame)} layouts predicted, {len(fits)} fit in memory; the "
                  f"{min(PLAN_SHOWN, len(fits))} fastest:", ""]
        lines += markdown_table(
            ["layout", "predicted step (ms)", "compute (ms)", "exposed dp (ms)",
             "bubble (ms)", "memory per rank"],
            [[_layout_text(r), number(r["predicted_step_ms"]), number(r.get("compute_ms")),
              number(r.get("dp_exposed_ms")), number(r.get("bubble_ms")),
              _size(r.get("memory_per_rank_bytes"))]
             for _, r in fits.head(PLAN_SHOWN).iterrows()])
        lines.append("")
    frame = run.table("validation.csv")
    if frame is not None and len(frame):
        lines += ["### Validation", ""]
        lines += validation_table(frame.to_dict("records"))
        errors = frame.dropna(subset=["error_pct"])
        unseen = errors[errors["in_sample"].fillna(0).astype(int) == 0]
        if len(unseen):  # plan.md gives the rank correlation too
            lines += ["", f"Mean absolute error {unseen['error_pct'].abs().mean():.1f}% over "
                      f"{plural(len(unseen), 'layout')} out of sample."]
        lines.append("")
    return lines


def _topo_section(run: Run) -> list[str]:
    """A run of no table (topo's): per node of its topology snapshot, the figures topo
    printed: GPUs, their links, the CPU and the network interfaces up."""
    if run.tables:
        return []
    rows = []
    for node in reader.topo_nodes(run):
        gpus = [g for g in node.get("gpus") or [] if isinstance(g, dict)]
        cpu = node.get("cpu") if isinstance(node.get("cpu"), dict) else {}
        links = list(((node.get("gpu_links") or {}).get("links") or {}).values())
        kinds = {str(k): sum(str(v) == str(k) for v in links) for k in links}
        nics = [str(n.get("name")) + (f" {n['speed_mbps']} Mb/s" if n.get("speed_mbps") else "")
                for n in node.get("network") or [] if isinstance(n, dict)
                and n.get("state") == "up"]
        # no GPU found: why, as topo said it (nvidia-smi not found, NVML missing)
        why = node.get("nvidia_smi_error") or node.get("nvml_error") or "none found"
        rows.append([str(node.get("host")), str(len(gpus)),
                     ", ".join(sorted({str(g.get("name")) for g in gpus})) if gpus else
                     f"- ({why})", ", ".join(f"{n} x {k}" for k, n in sorted(kinds.items()))
                     or "-", str(cpu.get("model") or "-"), str(cpu.get("logical_cores") or "-"),
                     ", ".join(nics) or "-"])
    if not rows:
        return []
    return ["### Topology", ""] + markdown_table(
        ["host", "GPUs", "GPU model", "GPU links", "CPU", "cores", "network up"], rows) + [""]


WATCH_SHOWN = 30  # the changes report.md lists; watch.jsonl keeps every one
RUNS_SHOWN = 12  # stretches of cycles a line lists: a weeks-long watch can hold thousands


def _cycle_runs(cycles) -> str:
    """Cycles as stretches of consecutive ones: "3-7, 9"."""
    s = pd.Series(sorted({int(c) for c in cycles}), dtype="int64")
    runs = s.groupby((s.diff() != 1).cumsum()).agg(["first", "last"])
    shown = [str(a) if a == b else f"{a}-{b}"
             for a, b in runs.head(RUNS_SHOWN).itertuples(index=False)]
    more = len(runs) - RUNS_SHOWN
    return ", ".join(shown) + (f" and {plural(more, 'more stretch', 'more stretches')}"
                               if more > 0 else "")


def _ranks_by_cycle(cycles: pd.DataFrame, column: str) -> dict[int, list[int]]:
    """rank -> the cycles whose `column` (a tuple of ranks) holds it."""
    pairs = cycles[["cycle", column]].explode(column).dropna()
    return {int(r): sorted(int(c) for c in g["cycle"])
            for r, g in pairs.groupby(column, sort=True)}


def _watch_late(history: reader.WatchHistory) -> list[str]:
    """Which ranks came late, in which cycles, and which were named stragglers: from the
    judge's late counts and straggler lists, never from late_rank alone (some rank always
    arrives last, by a hair on a healthy machine)."""
    late = _ranks_by_cycle(history.cycles, "late")
    named = _ranks_by_cycle(history.cycles, "stragglers")
    if not late and not named:
        return ["No rank late: no cycle's late counts say a rank came late, and no straggler "
                "was named.", ""]
    lines = []
    if history.source != reader.WATCH_LINES:
        lines.append(f"{history.source} records no late counts: a rank counts late where it "
                     "was named a straggler.")
    if late:
        over = (f"late_counts over the last {plural(history.window, 'cycle')}"
                if history.window else "a rise in late_counts")
        lines.append(f"Ranks late, as the judge counted them ({over}): " + "; ".join(
            f"rank {r} in {plural(len(c), 'cycle')} ({_cycle_runs(c)})"
            for r, c in late.items()) + ".")
    lines.append("Stragglers named: " + ("; ".join(
        f"rank {r} first in cycle {c[0]} (named in {_cycle_runs(c)})" for r, c in named.items())
        if named else "none") + ".")
    return [" ".join(lines), ""]


def _watch_section(run: Run) -> list[str]:
    history = reader.watch_history(run)
    if history is None:
        return []
    cycles, probes, changes = history.cycles, history.probes, history.changes
    lines = ["### Watch", "", f"{plural(len(cycles), 'cycle')}.", ""]
    if history.unreadable:
        lines += [f"Left out {plural(history.unreadable, 'line')} of {history.source} that "
                  "hold no cycle (cut short by a crash, or not JSON).", ""]
    if not len(cycles):
        return lines
    first, last = cycles.iloc[0], cycles.iloc[-1]
    every = f", every {history.interval_s:g} s" if history.interval_s else ""
    lines += [f"Cycle {first['cycle']} started {first['started'] or '-'}, cycle {last['cycle']} "
              f"{last['started'] or '-'}{every}; the last verdict **{last['verdict']}**.", ""]
    lines += _watch_late(history)
    rows = []
    for (probe, op, size, scope), g in probes.groupby(["probe", "op", "size_bytes", "scope"],
                                                      sort=False, dropna=False):
        ok = g[(g["status"] == "ok") & g["time_us"].notna()]
        rows.append([op or "-", _size(size), scope, str(len(ok)),
                     number(ok["time_us"].median()), number(ok["busbw_gbps"].median()),
                     str(g["state"].iloc[-1]), str(int((changes["what"] == probe).sum()))])
    lines += markdown_table(["op", "size", "scope", "cycles measured", "median time (us)",
                             "median busbw (GB/s)", "last state", "state changes"], rows)
    lines += ["", "#### Changes", ""]
    if not len(changes):
        return lines + ["No probe's state changed and no straggler was named.", ""]
    lines += markdown_table(["cycle", "started", "probe or rank", "change", "why (the judge's "
                             "words)"],
                            [[str(c.cycle), c.started or "-", c.what, c.change, c.why or "-"]
                             for c in changes.head(WATCH_SHOWN).itertuples()])
    if len(changes) > WATCH_SHOWN:
        lines += ["", f"... and {len(changes) - WATCH_SHOWN} more; {history.source} holds "
                  "every one."]
    return lines + [""]


def _skipped(frame: pd.DataFrame) -> list[str]:
    skipped = frame[frame["status"] == "skipped"]
    if not len(skipped):
        return []
    why = sorted({str(n) for n in skipped.get("note", pd.Series(dtype=str)).dropna()})
    return [f"{len(skipped)} rows skipped" + (": " + "; ".join(why[:5]) if why else ""), ""]


def _no_results(run: Run) -> list[str]:
    """What a run without a table report reads holds instead (topo writes none)."""
    if run.tables or (run.path / reader.WATCH_LINES).is_file():  # watch's cycles, without CSV
        return []
    others = sorted(p.name for p in run.path.glob("*.csv")) if run.path.is_dir() else []
    if others:
        return [f"No table report reads: {', '.join(others)} is not one of "
                f"{', '.join(reader.REQUIRED)}.", ""]
    if run.command == "topo" and reader.topo_nodes(run):  # topo.json is what it writes
        return []
    return [f"No result rows: `distbench {run.command}` wrote none.", ""]


def _dropped(run: Run) -> list[str]:
    return [f"{line}." for line in reader.left_out(run)] + [""] * bool(run.dropped or run.cut)


# accept's verdicts in the order of how bad; one it does not know (a newer run's) goes last
VERDICTS = ("FAIL", "INCONCLUSIVE", "WARN", "PASS", "SKIP")


def _counts(frame: pd.DataFrame) -> str:
    counts = frame["verdict"].astype(str).value_counts().to_dict()
    order = [v for v in VERDICTS if v in counts] + sorted(set(counts) - set(VERDICTS))
    return ", ".join(f"{v} {counts[v]}" for v in order) or "none"


FIGURES = ("measured", "expected", "warn_at")  # in the metric's unit


def _measured_cell(row: pd.Series, column: str) -> str:
    """A figure of an accept row in its metric's unit: a time in us, a bandwidth in GB/s."""
    value = row.get(column)
    if value is None or pd.isna(value):
        return "-"
    unit, _ = reader.check_metric(row.get("metric"))
    return f"{number(value)} {unit}"


def _accept_section(run: Run) -> list[str]:
    frame = run.table("accept.csv")
    if frame is None:
        return []
    again = reader.is_retest(frame)
    first, retests = frame[~again], frame[again]
    lines = ["### Acceptance", ""]
    outcome = run.meta.get("accept") if isinstance(run.meta.get("accept"), dict) else {}
    if outcome.get("verdict"):
        lines += [f"Verdict **{outcome['verdict']}**: {outcome.get('summary')}.", ""]
    # the run's verdict and accept.json's summary count the first pass: a retest only confirms
    # a failure, or clears it as noise (the failure then reads WARN)
    lines.append(f"- First pass: {_counts(first)} ({len(first)} measurements, what the "
                 "verdict counts)")
    if len(retests):
        lines.append(f"- Retests: {_counts(retests)} ({len(retests)} measurements taken again "
                     "to confirm or clear a first-pass failure)")
    lines.append("")
    culprits = outcome.get("culprits") or []
    if culprits:
        lines += ["Named:", "", *[f"- {c}" for c in culprits], ""]
    lines += markdown_table(["check", "target", "pass", "metric", "measured", "fail line",
                             "warn line", "ratio", "verdict"],
                            [[str(r["check"]), str(r["target"]), "retest" if again[i] else "first",
                              str(r["metric"]), *(_measured_cell(r, c) for c in FIGURES),
                              number(r["ratio"], 3), str(r["verdict"])]
                             for i, r in frame.iterrows()])
    return lines + ["", "ratio: the measurement against what it was judged by (the profile's "
                    "floor, the healthy peers' value or the baseline's figure), above 1 "
                    "better, whatever the metric's direction.", ""]


@dataclass(frozen=True)
class Kind:
    """A kind of run as report shows it: the commands whose runs it is, its section of
    report.md (from the run and its alpha-beta fits) and the plots.py function that draws it
    (None: nothing to draw). A new command registers its kind here, once."""
    commands: tuple[str, ...]
    section: Callable[[Run, list[dict]], list[str]]
    plots: str | None


KINDS = (
    Kind(("collective", NCCL_TESTS), _collective_section, "collective"),
    Kind(("p2p",), lambda run, _: _p2p_section(run), "p2p"),
    Kind(("tp",), lambda run, _: _tp_section(run), "tp"),
    Kind(("pp",), lambda run, _: _pp_section(run), "pp"),
    Kind(("dp",), lambda run, _: _dp_section(run), "dp"),
    # a plan run's validation measures real steps: it writes step.csv too
    Kind(("step",), lambda run, _: _step_run_section(run), "step"),
    Kind(("plan",), lambda run, _: _plan_section(run), "plan"),
    Kind(("accept",), lambda run, _: _accept_section(run), "accept"),
    Kind(("topo",), lambda run, _: _topo_section(run), None),
    Kind(("watch",), lambda run, _: _watch_section(run), "watch"),
)


def reported_commands() -> set[str]:
    return {c for k in KINDS for c in k.commands}


def markdown(runs: list[Run], fits: list[list[dict]], images: list[Path]) -> list[str]:
    """`fits`: each run's models, in the order of `runs`."""
    lines = ["# distbench report", "", "Runs: " + ", ".join(f"`{r.name}`" for r in runs), ""]
    for run, run_fits in zip(runs, fits, strict=True):
        lines += _run_header(run)
        lines += _dropped(run)
        lines += _no_results(run)
        for kind in KINDS:  # every section reads the tables it knows, whichever made them
            lines += kind.section(run, run_fits)
    if images:
        lines += ["## Plots", ""] + [f"![{p.stem}]({p.name})" for p in images] + [""]
    return lines


def write(runs: list[Run], out: Path) -> tuple[list[str], list[Path]]:
    """report.md, model.json and the plots in `out`; returns report.md's lines and the files."""
    from distbench.results import plots
    from distbench.results.writer import write_json

    out.mkdir(parents=True, exist_ok=True)
    fits = [models(r) for r in runs]
    images = [p for kind in KINDS if kind.plots for p in getattr(plots, kind.plots)(runs, out)]
    lines = markdown(runs, fits, images)
    (out / "report.md").write_text("\n".join(lines) + "\n")
    files = [out / "report.md", *images]
    if any(fits):
        write_json(out / "model.json", {"schema_version": 1, "model": "T(S) = alpha + S / beta",
                                         "fits": [f for v in fits for f in v]})
        files.insert(1, out / "model.json")
    return lines, files


def predict(runs: list[Run], op: str, size: int) -> list[str]:
    """The time and busbw each run's model predicts for `op` at `size`, one line per fit."""
    lines = []
    for run in runs:
        for f in models(run):
            if f["op"] != op or f.get("alpha_us") is None:
                continue
            t_us, busbw = alphabeta.predict_row(f, size)
            place = "in-place" if f["in_place"] else "out-of-place"
            lines.append(f"{run.name}: {op} {f['dtype']} {_redop_root(f)} {place} at "
                         f"{format_size(size)}: "
                         f"{number(t_us)} us, busbw {number(busbw)} GB/s (alpha "
                         f"{number(f['alpha_us'], 3)} us, busbw asymptote "
                         f"{number(f['busbw_gbps'])} GB/s)")
    return lines
