"""The one builder of synthetic run directories: what distbench writes for a run (run.json, a
command's CSV and its samples file) from rows a test states, consistent as a real run's are, so
that report and compare read them as they read a real one and refuse them only where a test
makes them contradict themselves."""

from __future__ import annotations

import csv
import json
import random
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path

from paths import REPO

from distbench.core import noise
from distbench.core.tables import Output
from distbench.kinds.collective.output import OUTPUT as COLLECTIVE
from distbench.kinds.dp.output import OUTPUT as DP
from distbench.kinds.p2p.output import OUTPUT as P2P
from distbench.results import samples

DERIVED = "derived"  # a figure the builder works out from the row's samples
GLOO_CPU = {"status": "ok", "exit_code": 0, "world_size": 2, "nnodes": 1, "backend": "gloo",
            "versions": {"torch": "2.13.0+cpu"}}


def write_meta(path: Path, command: str = "collective", finished: bool = True, **meta) -> Path:
    """run.json: a run of `command` that ended well on two gloo ranks of one node, unless
    `meta` says otherwise; finished=False: the command and `meta` alone."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "run.json").write_text(json.dumps({"command": command,
                                               **(GLOO_CPU if finished else {}), **meta}))
    return path


def write_csv(path: Path, columns: Sequence[str], rows: Iterable[dict]) -> Path:
    """A CSV of `columns` as distbench writes one: a cell a row leaves out, or None, is empty."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, list(columns))
        writer.writeheader()
        writer.writerows({c: "" if r.get(c) is None else r[c] for c in columns} for r in rows)
    return path


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def rewrite_csv(path: Path, change) -> Path:
    """The CSV with change(row) for each row (a copy of a run, doctored)."""
    rows = read_csv(path)
    return write_csv(path, list(rows[0]), [change(r) for r in rows])


def write_table(path: Path, output: Output, rows: Sequence[dict],
                per_row: Sequence[Sequence[float]] = (), reps: int = 5) -> Path:
    """output's CSV, and its samples for each measured row that has some (per_row[i], in us):
    the row's iterations, p50 and mean come from its samples (the mean over ranks a hair under
    the slowest rank's), its repetitions are the medians of the samples split in order, and a
    DERIVED bandwidth is what that mean gives. Cells a row leaves out are empty."""
    path.mkdir(parents=True, exist_ok=True)
    lines = [",".join(output.csv)]
    kept = []
    for i, r in enumerate(rows):
        us = per_row[i] if i < len(per_row) else []
        if us and r.get("status", "ok") == "ok":
            r = {**r, "iters": len(us), "p50_us": statistics.median(us),
                 "time_us": statistics.fmean(us) * 0.999}
            kept.append(samples.encode(i, us, noise.split(us, reps)))
        r = _derive(r)
        lines.append(",".join("" if r.get(c) is None else str(r.get(c)) for c in output.csv))
    (path / output.file).write_text("\n".join(lines) + "\n")
    (path / output.file.replace(".csv", ".samples.jsonl")).write_text("".join(kept))
    return path


def _derive(r: dict) -> dict:
    """A DERIVED bandwidth from the row's size and time; none without a time (a skipped row)."""
    gbps = None
    if r.get("time_us") is not None:
        moved = r["size_bytes"] * (2 if r.get("direction") == "bi" else 1)
        gbps = moved / r["time_us"] / 1e3
    if r.get("algbw_gbps") == DERIVED:
        r = {**r, "algbw_gbps": gbps}
    if r.get("busbw_gbps") == DERIVED:
        r = {**r, "busbw_gbps": gbps}
    if r.get("gbps") == DERIVED:
        r = {**r, "gbps": gbps}
    return r


def write_run(path: Path, rows: Sequence[dict], per_row: Sequence[Sequence[float]] = (),
              reps: int = 5, **meta) -> Path:
    """A collective run (collective.csv, its samples, run.json) of `rows` (collective_row)."""
    write_table(path, COLLECTIVE, rows, per_row, reps)
    return write_meta(path, "collective", **meta)


def collective_row(op: str, size: int, time_us: float, **more) -> dict:
    """A measured row of collective.csv at two ranks: float32, sum, in place; its algbw is size
    over time, and its busbw the same (a factor of 1) unless given."""
    return {"op": op, "dtype": "float32", "redop": "sum", "root": -1, "in_place": 1,
            "world_size": 2, "nnodes": 1, "size_bytes": size, "count": size // 4,
            "iters": 50, "time_us": time_us, "p99_us": time_us * 1.2,
            "algbw_gbps": DERIVED, "busbw_gbps": DERIVED, "status": "ok", **more}


def times(mean: float, n: int = 50, seed: int = 1, spread: float = 0.02) -> list[float]:
    """n iterations within +-spread of `mean`, whose mean is `mean`."""
    rng = random.Random(seed)
    raw = [mean * (1 + rng.uniform(-spread, spread)) for _ in range(n)]
    shift = statistics.fmean(raw) - mean
    return [v - shift for v in raw]


def p2p_row(pattern: str, size: int, time_us: float = 100.0, world: int = 2, **more) -> dict:
    """A measured row of p2p.csv: float32, the ring over every rank or the ping-pong's pairs."""
    return {"pattern": pattern, "dtype": "float32", "world_size": world, "nnodes": 1,
            "pairs": world // 2 if pattern == "pingpong" else world, "size_bytes": size,
            "count": size // 4, "iters": 50, "time_us": time_us, "p99_us": time_us * 1.2,
            "algbw_gbps": DERIVED, "busbw_gbps": DERIVED, "wrong": 0, "backend": "gloo",
            "status": "ok", **more}


def matrix_row(direction: str, src: int, dst: int, size: int, time_us: float = 100.0,
               world: int = 2, host: str = "h", **more) -> dict:
    """A row of p2p_matrix.csv: one ordered pair ("uni") or a pair both ways ("bi") on one
    node of `host`."""
    return {"direction": direction, "src_rank": src, "dst_rank": dst, "src_host": host,
            "dst_host": host, "src_local_rank": src, "dst_local_rank": dst, "link": "intra",
            "dtype": "float32", "world_size": world, "nnodes": 1, "size_bytes": size,
            "count": size // 4, "iters": 50, "time_us": time_us, "p99_us": time_us * 1.2,
            "gbps": DERIVED, "wrong": 0, "backend": "gloo", **more}


def planner_sources_run(root: Path) -> Path:
    """A collective run of a 2-node cluster of 8 GPUs each (all_reduce T = 20 us + S at
    100 GB/s algbw in a node, 50 us + S at 20 GB/s across), a p2p run's ping-pong, dp's
    overlap and a topology of 8 H100s per node, in one directory: what `plan --from` reads."""
    root.mkdir(parents=True)
    rows = []
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        for world, nnodes, alpha, beta in ((8, 1, 20.0, 100.0), (16, 2, 50.0, 20.0)):
            rows += [{"op": op, "dtype": "float32", "redop": "sum", "root": -1, "in_place": 0,
                      "world_size": world, "nnodes": nnodes, "size_bytes": 2**k,
                      "count": 2**k // 4, "time_us": alpha + 2**k / (beta * 1e3),
                      "p99_us": 1, "algbw_gbps": 1, "busbw_gbps": 1, "status": "ok"}
                     for k in range(10, 31, 2)]
    write_csv(root / "collective.csv", COLLECTIVE.csv, rows)
    write_csv(root / "p2p.csv", P2P.csv, [
        {"pattern": "pingpong", "dtype": "float32", "world_size": 2 * n, "nnodes": n,
         "pairs": 1, "size_bytes": 2**k, "count": 2**k // 4, "time_us": a + 2**k / (b * 1e3),
         "p99_us": 1, "busbw_gbps": 1, "status": "ok"}
        for n, a, b in ((1, 10.0, 100.0), (2, 30.0, 25.0)) for k in range(10, 31, 2)])
    common = {"dtype": "float32", "world_size": 8, "step_us": 1, "compute_only_us": 1,
              "comm_alone_us": 1, "exposed_comm_us": 1, "state_bytes_per_rank": 1,
              "status": "ok"}
    write_csv(root / "dp.csv", DP.csv, [{"mode": "ddp", "bucket_cap_mb": 25, "overlap_pct": 60,
                                         **common},
                                        {"mode": "zero3", "overlap_pct": 40, **common}])
    write_meta(root, "collective", finished=False, status="ok")
    gpus = [{"index": i, "name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 85520809984}
            for i in range(8)]
    (root / "topo.json").write_text(json.dumps({"nodes": [{"host": "a", "gpus": gpus}]}))
    return root


def accept_in_progress(path: Path):
    """accept.json as a cpu-gloo acceptance on two ranks keeps it while it runs (AcceptFiles),
    and the run.json beside it: (files, record)."""
    from fake_session import fake_runtime

    from distbench.kinds.accept import files
    from distbench.kinds.accept.profile_files import load
    from distbench.results import writer

    profile = load(REPO / "configs" / "profiles" / "cpu-gloo.toml")
    record = writer.RunRecord(path, "accept", {}, ["accept"])
    return files.AcceptFiles(path, record, profile, "named", ["a", "b"], fake_runtime(0, 2),
                             strict=False), record
