"""`plan --from RUN,...`: earlier run directories read into the Inputs a plan is predicted from.
Torch-free.

- collective: an alpha-beta fit (results.alphabeta.fit) per op, group size and placement over
  its rows with status ok: inside a node, or across nodes with so many ranks on each (a row of
  `collective --group-size` says its group's size and ranks per node; an older row ran on the
  whole world, "node" when that was one node);
- p2p: "sendrecv", the pipeline's hop, from the ping-pong rows (their time is the one-way
  time, half the round trip); a run with only ring rows gives it from those (each rank sends
  and receives at once: the steady state of 1F1B), noted;
- dp: the measured overlap of each mode ("ddp", "zero1", "zero2", "zero3", the ZeRO stages'
  names in a plan), overlap_pct / 100, the median over the mode's rows;
- plan: its inputs.json, as measured there;
- accept: its accept.csv's collective and ping-pong checks, fitted where one op on one group
  was measured at two sizes or more (a profile's latency and bandwidth checks); an accept run
  with no such pair is refused;
- any run's topo.json: GPUs per node and memory per GPU (the smallest), when it lists GPUs;
- nccl-tests logs (or -J files; results.nccltests reads them, as `report` does), one or a
  folder of them: a fit per op, group size and ranks per node (the header's ranks, the hosts
  its nodes), over both placements' rows; sendrecv_perf (each rank sending to the next and
  receiving from the one before, at once) as the pipeline's hop; GPUs per node the most ranks
  on one host, the device the GPUs' names.

A directory or file that holds none of these is refused in one line (OptionError, exit 2)."""

from __future__ import annotations

import copy
import json
import statistics
from pathlib import Path

import pandas as pd

from distbench.core.errors import ReadError
from distbench.core.options import OptionError
from distbench.core.tables import plural
from distbench.planner import gpus, inputs_check
from distbench.planner.gpus import GPU
from distbench.planner.inputs import INPUTS_JSON, OPS, CommFit, Inputs
from distbench.planner.predict import DP_KINDS
from distbench.results import alphabeta, nccltests, reader

FLAG = "--from"
EXAMPLE = "--from results/20250101T000000Z-collective"
RUN_FILES = ("run.json", INPUTS_JSON)
COLLECTIVE_OPS = tuple(op for op in OPS if op != "sendrecv")


def read(paths: list[Path]) -> Inputs:
    """Every run of `paths` merged into one Inputs, in order: the first source of a figure
    wins, and each one after it is noted."""
    return read_for(paths)[1]


def read_for(paths: list[Path], target: GPU | None = None, fabric: bool = False
             ) -> tuple[Inputs, Inputs]:
    """(the runs as measured, what a plan for `target` GPUs may use of them): each run's
    figures measured on another device (the CPU, another GPU) dropped where the target's
    datasheet or the declared `fabric` stands for them, said where they are kept
    (`for_target`)."""
    measured, used = Inputs(), Inputs()
    for path in paths:
        got = read_one(Path(path))
        merge(measured, copy.deepcopy(got))
        if target is not None:
            for_target(got, target, str(path), fabric)
        merge(used, got)
    return measured, used


def measured_on(inputs: Inputs) -> GPU | str | None:
    """The device a run's figures were measured on: "cpu", a GPU of planner.gpus, or None
    (not known, or a GPU the table lacks)."""
    if inputs.device.strip().lower() == "cpu":
        return "cpu"
    return gpus.by_device_name(inputs.device) if inputs.device else None


def for_target(got: Inputs, target: GPU, where: str, fabric: bool) -> None:
    """A run's figures for a plan of `target` GPUs: none measured on another device is used
    without saying so. Its layer times, optimizer, data-parallel and pipeline figures are
    dropped (compute then comes from the target's datasheet x --mfu, the rest as the notes
    say); its collectives are dropped where a fabric is declared, else kept and said."""
    on = measured_on(got)
    if on is target:
        return
    if on is None:
        if got.compute or got.fits:
            got.warn(f"{where}: measured on {got.device or 'a device not named'}, taken as "
                     f"{target.name} GPUs")
        return
    what = "the CPU" if on == "cpu" else f"{on.name} GPUs"
    dropped = []
    if got.compute:
        dropped.append("layer times")
        got.compute, got.compute_model, got.alone_ratio = [], None, 1.0
    if got.optimizer_us_per_param is not None:
        dropped.append("optimizer step")
        got.optimizer_us_per_param, got.optimizer_us_per_layer = None, 0.0
    if got.overlap or got.wrapper_us_per_layer:
        dropped.append("data-parallel overlap and wrapper cost")
        got.overlap, got.wrapper_us_per_layer = {}, {}
    if got.pipeline_us_per_microbatch or any(k.startswith("pipeline")
                                             for k in got.overlap_layouts):
        dropped.append("pipeline schedule")
        got.pipeline_us_per_microbatch, got.bubble_weight = 0.0, 1.0
    got.overlap_layouts = {}
    if dropped:
        got.warn(f"{where}: measured on {what}, not {target.name}: its {', '.join(dropped)} "
                 f"not used; compute is {target.name}'s datasheet peak x --mfu")
    if got.fits and fabric:
        got.fits = []
        got.warn(f"{where}: its collectives, measured on {what}, not used for {target.name}: "
                 "the declared --fabric prices them")
    elif got.fits:
        got.warn(f"{where}: collectives measured on {what} used for {target.name} GPUs "
                 "(declare --fabric to price them as the target's fabric)")


def read_one(path: Path) -> Inputs:
    if path.is_file():
        return nccl_tests([path], str(path))
    if not path.is_dir():
        raise OptionError(FLAG, f"{str(path)!r}: no such run directory or nccl-tests log",
                          EXAMPLE)
    if not any((path / name).is_file() for name in RUN_FILES):
        logs = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
        return nccl_tests(logs, str(path))
    try:
        run = reader.load(path)
    except ReadError as e:
        if not (path / INPUTS_JSON).is_file():  # a saved inputs.json alone is enough
            raise OptionError(FLAG, str(e), EXAMPLE) from None
        run = reader.Run(path, path.name, "plan")
    got = Inputs()
    if (path / INPUTS_JSON).is_file():
        got = _inputs_json(path / INPUTS_JSON)
    if "collective.csv" in run.tables:
        _collective(got, run.tables["collective.csv"], f"{path}/collective.csv")
    if "p2p.csv" in run.tables:
        _p2p(got, run.tables["p2p.csv"], f"{path}/p2p.csv")
    if "dp.csv" in run.tables:
        _dp(got, run.tables["dp.csv"], f"{path}/dp.csv")
    if "accept.csv" in run.tables:
        _accept(got, run, f"{path}/accept.csv")
    measured = (got.fits or got.compute or got.overlap or got.wrapper_us_per_layer
                or got.optimizer_us_per_param is not None)
    _topology(got, run, f"{path}/topo.json")
    if not got.device and run.meta.get("backend") == "gloo":
        got.device = "cpu"
    on = measured_on(got)
    got.sources.append(f"{path}: measured on " + (
        "the CPU" if on == "cpu" else got.device or "a device not named"))
    if not measured:
        raise OptionError(FLAG, f"{path} holds nothing a plan reads (collective.csv, p2p.csv, "
                          f"dp.csv, accept.csv or {INPUTS_JSON} with results; it is a "
                          f"{run.command} run)", EXAMPLE)
    return got


def nccl_tests(paths: list[Path], source: str) -> Inputs:
    """The fits of the nccl-tests logs among `paths` (a file given alone must be one; in a
    folder the files that are not are passed over, counted in a note)."""
    got = Inputs()
    rows: list[dict] = []
    hosts: dict[str, int] = {}
    names: set[str] = set()
    passed: list[str] = []
    for path in paths:
        try:
            found, ranks = nccltests.read_log(path)
        except ReadError as e:
            if len(paths) == 1 and path.is_file() and str(path) == source:
                raise OptionError(FLAG, f"{e} (nor a distbench run directory)", EXAMPLE
                                  ) from None
            passed.append(path.name)
            continue
        placed = [r for r in found if r.get("world_size")]
        if len(placed) < len(found):
            got.note(f"{path}: {len(found) - len(placed)} rows of runs without their 'Using "
                     "devices' list passed over: their ranks and nodes are not known")
        rows += placed
        for rank in ranks:
            hosts[f"{path}:{rank.host}"] = hosts.get(f"{path}:{rank.host}", 0) + 1
            if rank.device:
                names.add(rank.device)
    if not rows:
        raise OptionError(FLAG, f"{source}: no distbench run (run.json, {INPUTS_JSON}) nor an "
                          "nccl-tests log with its 'Using devices' list"
                          + (f" among {len(paths)} files" if len(paths) > 1 else ""), EXAMPLE)
    if passed:
        got.note(f"{source}: {len(passed)} files that are no nccl-tests log passed over "
                 f"({', '.join(passed[:3])}{', ...' if len(passed) > 3 else ''})")
    frame = pd.DataFrame(rows)
    _collective(got, frame, f"{source} (nccl-tests)")
    hops = frame[(frame["op"] == "sendrecv") & (frame["status"] == "ok")]
    fitted = 0
    for span, group in hops.groupby(hops["nnodes"].map(span_of), sort=True):
        fitted += _fit(got, "sendrecv", 2, str(span), group, f"{source} (nccl-tests "
                       "sendrecv_perf)", 1)
    if fitted:
        got.sources.append(f"{source}: {plural(fitted, 'pipeline hop fit')} from "
                           "sendrecv_perf (every rank sending and receiving at once)")
    if hosts:
        got.gpus_per_node = max(hosts.values())
    got.device = ", ".join(sorted(names))
    got.sources.append(f"{source}: nccl-tests on {got.device or 'unnamed GPUs'}, up to "
                       f"{got.gpus_per_node or '?'} ranks per node")
    return got


def _inputs_json(path: Path) -> Inputs:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise OptionError(FLAG, f"{path}: not a distbench {INPUTS_JSON} ({e})", EXAMPLE) from None
    inputs_check.check(data, path)
    try:
        got = Inputs.from_json(data)
    except (ValueError, TypeError) as e:
        raise OptionError(FLAG, f"{path}: not a distbench {INPUTS_JSON} ({e})", EXAMPLE) from None
    got.sources = [f"{path}: {s}" for s in got.sources] or [str(path)]
    return got


def _ok(frame: pd.DataFrame) -> pd.DataFrame:
    if "status" in frame.columns:
        frame = frame[frame["status"].astype(str).isin(["ok", ""])]
    return frame[pd.to_numeric(frame["time_us"], errors="coerce") > 0]


def span_of(nnodes) -> str:
    return "node" if pd.isna(nnodes) or int(nnodes) <= 1 else "nodes"


def _fit(inputs: Inputs, op: str, ranks: int, span: str, rows: pd.DataFrame, source: str,
         per_node: int | None = None) -> bool:
    """`per_node`: the group's ranks on each node, where it crosses nodes."""
    sizes, times = rows["size_bytes"].astype(float), rows["time_us"].astype(float)
    try:
        f = alphabeta.fit(sizes, times)
    except ValueError as e:
        inputs.note(f"{source}: {op} on {ranks} ranks ({span}) not fitted: {e}")
        return False
    where = span if span == "node" else f"nodes, {per_node or '?'} per node"
    inputs.fits.append(CommFit(op=op, ranks=ranks, span=span, alpha_us=f.alpha_us,
                               beta_gbps=f.beta_gbps, source=f"{source} ({where}; "
                               f"{sizes.nunique()} sizes, median error {f.err_pct:.1f}%)",
                               per_node=per_node if span == "nodes" else None))
    if f.note:
        inputs.note(f"{source}: {op} on {ranks} ranks: {f.note}")
    return True


def _collective(inputs: Inputs, frame: pd.DataFrame, source: str) -> None:
    """A fit per op, group size and placement. A row of `collective --group-size` says its
    group's size and ranks per node (the group crosses nodes when it has fewer on one than in
    all); an older row, or an nccl-tests log's, ran on the whole world: its nodes say."""
    rows = _ok(frame)
    rows = rows[rows["op"].isin(COLLECTIVE_OPS)]
    nnodes = rows["nnodes"] if "nnodes" in rows.columns else pd.Series(1, index=rows.index)
    nnodes = pd.to_numeric(nnodes, errors="coerce").fillna(1).clip(lower=1).astype(int)
    world = pd.to_numeric(rows["world_size"]).astype(int)
    ranks = _column(rows, "group_size").fillna(world).astype(int)
    per_node = _column(rows, "per_node").fillna(world // nnodes).astype(int)
    grouped = _column(rows, "per_node").notna()
    span = nnodes.map(span_of).where(~grouped, (per_node < ranks).map(
        lambda crosses: "nodes" if crosses else "node"))
    rows = rows.assign(_ranks=ranks, _span=span, _per_node=per_node)
    fitted = 0
    for (op, size, span, per_node), group in rows.groupby(
            ["op", "_ranks", "_span", "_per_node"], sort=True):
        fitted += _fit(inputs, str(op), int(size), str(span), group, source, int(per_node))
    if fitted:
        inputs.sources.append(f"{source}: {fitted} alpha-beta fits")


def _column(rows: pd.DataFrame, name: str) -> pd.Series:
    """A numeric column, all missing where the rows lack it (an older run's)."""
    if name not in rows.columns:
        return pd.Series(float("nan"), index=rows.index)
    return pd.to_numeric(rows[name], errors="coerce")


def _p2p(inputs: Inputs, frame: pd.DataFrame, source: str) -> None:
    rows = _ok(frame)
    hops = rows[rows["pattern"] == "pingpong"]
    if not len(hops):
        hops = rows[rows["pattern"] == "ring"]
        if len(hops):
            inputs.note(f"{source}: no ping-pong rows; the pipeline hop is the ring's time "
                        "(each rank sending and receiving at once)")
    fitted = 0
    for span, group in hops.groupby(hops["nnodes"].map(span_of), sort=True):
        # a ping-pong pair across nodes has one rank on each
        fitted += _fit(inputs, "sendrecv", 2, str(span), group, source, 1)
    if fitted:
        inputs.sources.append(f"{source}: {fitted} point-to-point fits")


def _dp(inputs: Inputs, frame: pd.DataFrame, source: str) -> None:
    rows = frame
    if "status" in rows.columns:
        rows = rows[rows["status"].astype(str) == "ok"]
    rows = rows[pd.to_numeric(rows["overlap_pct"], errors="coerce").notna()]
    for kind in DP_KINDS:
        pct = rows[rows["mode"] == kind]["overlap_pct"].astype(float)
        if len(pct):
            inputs.overlap[kind] = min(1.0, max(0.0, statistics.median(pct) / 100))
            inputs.sources.append(f"{source}: {kind} overlap {inputs.overlap[kind]:.0%} "
                                  f"(median of {len(pct)} rows)")


def _accept(inputs: Inputs, run: reader.Run, source: str) -> None:
    frame = run.tables["accept.csv"]
    rows = frame[(~reader.is_retest(frame)) & (frame["verdict"].astype(str) != "SKIP")]
    rows = rows[pd.to_numeric(rows["time_us"], errors="coerce") > 0]
    rows = rows.assign(_op=rows["op"].where(rows["command"] == "collective", "sendrecv"))
    rows = rows[rows["_op"].isin(COLLECTIVE_OPS) | (rows["op"] == "pingpong")]
    nodes = int(run.meta.get("nnodes") or 1)
    rows = rows.assign(_span=rows["scope"].map(
        lambda s: "node" if s == "node" or (s == "cluster" and nodes == 1) else "nodes"))
    fitted = 0
    for (op, ranks, span), group in rows.groupby(["_op", "ranks", "_span"], sort=True):
        if group["size_bytes"].nunique() >= 2:
            # a cluster check spans every node; a ping-pong pair across them has one on each
            per_node = 1 if op == "sendrecv" else max(1, int(ranks) // nodes)
            fitted += _fit(inputs, str(op), 2 if op == "sendrecv" else int(ranks), str(span),
                           group, source, per_node)
    if not fitted:
        raise OptionError(FLAG, f"{source} measures each op at one size per group: no sweep "
                          "to fit alpha and beta (give a `distbench collective` run)", EXAMPLE)
    inputs.sources.append(f"{source}: {fitted} alpha-beta fits from the checks' sizes")


def _topology(inputs: Inputs, run: reader.Run, source: str) -> None:
    nodes = [n for n in run.topo.get("nodes") or [] if isinstance(n, dict)]
    gpus = [[g for g in n.get("gpus") or [] if isinstance(g, dict)] for n in nodes]
    listed = [g for node in gpus for g in node]
    if not listed:
        return
    inputs.gpus_per_node = inputs.gpus_per_node or max(len(node) for node in gpus)
    memories = [int(g["memory_total_bytes"]) for g in listed
                if isinstance(g.get("memory_total_bytes"), int | float)]
    if memories and inputs.memory_per_gpu is None:
        inputs.memory_per_gpu = min(memories)
    names = sorted({str(g["name"]) for g in listed if g.get("name")})
    inputs.device = inputs.device or ", ".join(names)
    inputs.sources.append(f"{source}: {len(listed)} GPUs ({inputs.device or 'unnamed'}) on "
                          f"{len(nodes)} nodes")


def merge(into: Inputs, other: Inputs) -> None:
    """`other`'s figures added to `into`'s; where both have one, `into`'s stays (noted)."""
    have = {(f.op, f.ranks, f.span, f.per_node) for f in into.fits}
    for f in other.fits:
        if (f.op, f.ranks, f.span, f.per_node) in have:
            where = f"nodes, {f.per_node} per node" if f.crosses and f.per_node else f.span
            into.note(f"{f.op} on {f.ranks} ranks ({where}) measured twice: the first kept, "
                      f"not {f.source}")
        else:
            into.fits.append(f)
    if other.compute and not into.compute:
        into.compute, into.compute_model = list(other.compute), other.compute_model
        into.alone_ratio = other.alone_ratio
    if into.optimizer_us_per_param is None:
        into.optimizer_us_per_param = other.optimizer_us_per_param
        into.optimizer_us_per_layer = other.optimizer_us_per_layer
    # a pipeline figure of 0 is a measurement too (the schedule cost nothing beyond the model)
    if "pipeline" not in into.overlap_layouts and not into.pipeline_us_per_microbatch:
        into.pipeline_us_per_microbatch = other.pipeline_us_per_microbatch
        into.bubble_weight = other.bubble_weight
        into.overlap_layouts.update({k: v for k, v in other.overlap_layouts.items()
                                     if k.startswith("pipeline")})
    for kind in {*other.overlap, *other.wrapper_us_per_layer}:
        if kind in into.overlap or kind in into.wrapper_us_per_layer:
            continue
        for mine, theirs in ((into.overlap, other.overlap),
                             (into.wrapper_us_per_layer, other.wrapper_us_per_layer),
                             (into.overlap_layouts, other.overlap_layouts)):
            if kind in theirs:
                mine[kind] = theirs[kind]
    into.gpus_per_node = into.gpus_per_node or other.gpus_per_node
    into.memory_per_gpu = into.memory_per_gpu or other.memory_per_gpu
    into.device = into.device or other.device
    into.sources += [s for s in other.sources if s not in into.sources]
    for n in other.notes:
        into.note(n)
    for w in other.warnings:
        into.warn(w)
