"""watch's cycles, on every rank: each probe's buffers are made once, then every --interval each
probe runs --iters ops, every rank timing only its time inside the call (records.ProbeResult says
why), the ranks' means gathered to all, so every rank judges alike (judge.Tracker) and each
node's first rank can write its node's textfile. Rank 0 decides whether another cycle runs and
tells the others, so no rank leaves while its peers wait in a collective; it also writes
watch.jsonl and watch.csv, a line and rows per cycle, flushed as the cycle ends."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import torch
import torch.distributed as dist

from distbench.bench import timing
from distbench.bench.series import allocate
from distbench.core import contracts
from distbench.core.accounting import bandwidth, buffer_of
from distbench.core.dtypes import element_bytes
from distbench.core.exitcodes import EXIT_BELOW, EXIT_INCONCLUSIVE, EXIT_OK
from distbench.core.sizes import format_size
from distbench.ops.collectives import OPS, Ctx
from distbench.ops.torch_dtypes import TORCH_DTYPES
from distbench.results.writer import Appender
from distbench.run.runtime import RunFailure
from distbench.run.session import Session
from distbench.watch import health, textfile
from distbench.watch.judge import Tracker
from distbench.watch.probe_baseline import read_baseline
from distbench.watch.records import (
    SCHEMA_VERSION,
    Cycle,
    Judgement,
    Probe,
    ProbeResult,
    RankInfo,
)

WARMUP = 2  # untimed ops of each probe per cycle: the first after a pause is slow


class _Probe:
    """A probe's case on this rank, built once: a watch that runs for weeks allocates nothing
    per cycle."""

    def __init__(self, s: Session, probe: Probe):
        rt = s.rt
        self.probe = probe
        self.op = OPS[probe.op]
        self.ctx = Ctx(rt.rank, rt.world, 0, "sum", False)
        self.lay = buffer_of(self.op.accounting, probe.size_bytes, element_bytes(probe.dtype),
                          rt.world)
        self.case = None
        if self.lay is not None:
            inp, out = allocate(self.op, self.ctx, self.lay.per_rank_count,
                                TORCH_DTYPES[probe.dtype], rt.device)
            self.case = self.op.build(self.ctx, inp, out, self.lay.per_rank_count)
            # this rank's (mean in-call time, wrong elements), and every rank's, gathered
            self.mine = torch.zeros(2, dtype=torch.float64, device=rt.device)
            self.every = [torch.zeros_like(self.mine) for _ in range(rt.world)]

    def measure(self, s: Session, iters: int, delay) -> ProbeResult:
        rt = s.rt
        if self.case is None:
            return ProbeResult(self.probe, "skipped", note=f"too small for {rt.world} ranks")
        run, device = self.case.run, rt.device
        self.case.prepare()
        for _ in range(WARMUP):
            run()
        timing.sync(device)
        total = 0.0
        for _ in range(iters):
            if delay is not None:
                delay()
            t0 = time.perf_counter()
            run()
            timing.sync(device)
            total += time.perf_counter() - t0
        wrong = 0
        if s.opts.check:  # as every command checks: fresh inputs, one op, its output
            self.case.prepare()
            run()
            timing.sync(device)
            wrong = self.case.check()
        self.mine[0], self.mine[1] = total / iters * 1e6, float(wrong)
        dist.all_gather(self.every, self.mine)
        rank_us = tuple(float(t[0]) for t in self.every)
        wrong_total = int(sum(float(t[1]) for t in self.every))
        time_us = max(rank_us)
        _, busbw = bandwidth(self.op.accounting, self.lay.size_bytes, time_us / 1e6, rt.world)
        if wrong_total:
            return ProbeResult(self.probe, "failed", time_us, busbw, rank_us,
                               note=f"{wrong_total} wrong elements")
        return ProbeResult(self.probe, "ok", time_us, busbw, rank_us)


def rank_infos(s: Session) -> list[RankInfo]:
    """Every rank as the DCGM exporter names its GPU: Hostname, the GPU's index, its UUID."""
    out = []
    for i in range(s.rt.world):
        r = s.rt.ranks[i] if i < len(s.rt.ranks) else {}
        on_gpu = r.get("device", "cpu") != "cpu"
        out.append(RankInfo(i, str(r.get("host", "")), str(r.get("local_rank", "")) if on_gpu
                            else "", str(r.get("gpu_uuid") or "")))
    return out


def _node_of(s: Session, rank: int):
    return s.rt.ranks[rank]["node"] if s.rt.ranks else 0  # as Runtime.nnodes groups them


def run(s: Session) -> int:
    opts, rt = s.opts, s.rt
    probes = [Probe(op, size, "cluster", opts.dtype) for op in opts.ops for size in opts.sizes]
    ranks = rank_infos(s)
    mine = [x for x in ranks if _node_of(s, x.rank) == _node_of(s, rt.rank)]
    hostname = ranks[rt.rank].hostname
    k, n = (1, 1) if opts.once else (opts.agree, opts.last)
    tracker = Tracker(probes, rt.world, window=opts.window, k=k, n=n, tolerance=opts.tolerance,
                      warm=opts.warm, baseline=read_baseline(opts.baseline)
                      if opts.baseline else None)
    prom = Path(opts.textfile) if opts.textfile else None
    writes_prom = prom is not None and rt.local_rank == 0
    if prom is not None:
        # every rank of the node, whichever ends first: a dead writer's peers still clear it
        s.on_stop.append(lambda: textfile.write_down(prom, hostname=hostname, why="ended"))
    if writes_prom:
        textfile.write_down(prom, hostname=hostname, why="starting")
    lines = Appender(s.run_dir / "watch.jsonl") if s.run_dir is not None else None
    sink = s.sink(contracts.WATCH)
    s.step("watch: building the probes", opts.timeout)
    built = [_Probe(s, p) for p in probes]
    s.console.log(f"watch: {', '.join(f'{p.op} {format_size(p.size_bytes)}' for p in probes)} "
                  f"every {opts.interval:g} s on {rt.world} ranks, {rt.nnodes} node(s), backend "
                  f"{rt.backend}; results in {s.run_dir}/")
    started = time.monotonic()
    late_total, judgement, index = 0, None, 0
    go = torch.zeros(1, dtype=torch.int64, device=rt.device)
    while True:
        s.step("watch: waiting for the next cycle", opts.timeout + opts.interval)
        if rt.rank == 0:
            go.fill_(int(_more(opts, index, time.monotonic() - started)))
        dist.broadcast(go, 0)
        if not int(go.item()):
            break
        t0 = time.time()
        s.step(f"watch cycle {index}", opts.timeout)
        delay = s.faults.before_collective() if index >= s.faults.slow_from else None
        results = tuple(b.measure(s, opts.iters, delay) for b in built)
        duration = time.time() - t0
        late = duration > opts.interval
        late_total += late
        cycle = Cycle(index, t0, duration, late, results)
        judgement = tracker.observe(cycle)
        line = cycle_line(cycle, judgement, opts.interval)
        if lines is not None:
            lines.write(json.dumps(line) + "\n")
        for row in csv_rows(line, cycle, rt.world, rt.nnodes):
            sink.append(row)
        if writes_prom:
            textfile.write(prom, judgement, cycle, mine, hostname=hostname,
                           interval_s=opts.interval, cycles_total=index + 1,
                           late_total=late_total)
        s.console.log(_summary(cycle, judgement, opts.interval))
        index += 1
        if rt.rank == 0 and not opts.once:
            # the last cycle too: its file stands for an interval, as every cycle's does,
            # before the run's end takes it down
            time.sleep(max(0.0, t0 + opts.interval - time.time()))
    return _ending(s, judgement, ranks)


def _more(opts, index: int, elapsed_s: float) -> bool:
    cycles = opts.cycles()
    if cycles is not None and index >= cycles:
        return False
    return opts.duration is None or elapsed_s < opts.duration


def _ending(s: Session, j: Judgement | None, ranks: list[RankInfo]) -> int:
    """The exit: 0 with an ok verdict, EXIT_BELOW with warn or fail, EXIT_INCONCLUSIVE with
    nothing judged; with --npd, node-problem-detector's 0, 1, 2 and its one short line."""
    opts = s.opts
    named = [f"rank {r} ({ranks[r].hostname})" for r in (j.stragglers if j else ())]
    verdict = j.verdict if j is not None else "unknown"
    if opts.npd:  # run.json keeps distbench's codes; the launcher gives the plugin its own
        code, message = health.npd_result(j, named)
        if s.rt.rank == 0:
            print(message, flush=True)
        if code == 0:
            return EXIT_OK
        raise RunFailure(message, status="below_expectation" if code == 1 else "inconclusive",
                         exit_code=EXIT_BELOW if code == 1 else EXIT_INCONCLUSIVE)
    if opts.drain and verdict == "fail":
        _drain(s, j, ranks)
    line = f"watch verdict {verdict}" + (f"; stragglers: {', '.join(named)}" if named else "")
    if verdict == "ok":
        s.console.log(line)
        return EXIT_OK
    if verdict == "unknown":
        raise RunFailure(f"{line}: nothing judged (no baseline yet: --baseline, or more "
                         f"cycles than --warm)", status="inconclusive",
                         exit_code=EXIT_INCONCLUSIVE)
    raise RunFailure(line, status="below_expectation", exit_code=EXIT_BELOW)


def _drain(s: Session, j: Judgement, ranks: list[RankInfo]) -> None:
    """The scontrol line for each node named (its stragglers' nodes, else every node); run
    where scontrol exists, printed everywhere."""
    if s.rt.rank != 0:
        return
    bad = [x for x in j.probes.values() if x.state == "fail"]
    reason = bad[0].why if bad else "fabric check failed"
    nodes = sorted({ranks[r].hostname for r in j.stragglers} or {r.hostname for r in ranks})
    for node in nodes:
        argv = health.drain_command(node, reason)
        print(" ".join(argv), flush=True)
        if shutil.which(argv[0]):
            subprocess.run(argv, check=False, timeout=30)


def cycle_line(c: Cycle, j: Judgement, interval: float) -> dict:
    probes = []
    for r in c.results:
        st = j.probes.get(r.probe.key)
        probes.append({
            "op": r.probe.op, "size_bytes": r.probe.size_bytes, "scope": r.probe.scope,
            "dtype": r.probe.dtype, "status": r.status, "time_us": r.time_us,
            "busbw_gbps": r.busbw_gbps, "rank_time_us": list(r.rank_time_us),
            "late_rank": r.late_rank, "lateness_us": r.lateness_us,
            "state": st.state if st else "unknown",
            "median_us": st.median_us if st else None, "p95_us": st.p95_us if st else None,
            "cv": st.cv if st else None, "baseline_us": st.baseline_us if st else None,
            "note": r.note})
    return {"schema_version": SCHEMA_VERSION, "cycle": c.index,
            "started": utc_iso(c.started), "duration_s": c.duration_s, "late": c.late,
            "interval_s": interval, "verdict": j.verdict, "stragglers": list(j.stragglers),
            "late_counts": {str(k): v for k, v in j.late_counts.items()},
            "probes": probes, "changes": list(j.changes)}


def csv_rows(line: dict, c: Cycle, world: int, nnodes: int) -> list[dict]:
    """watch.csv's rows of a cycle: its watch.jsonl line (cycle_line), a row per probe."""
    out = []
    for p, r in zip(line["probes"], c.results, strict=True):
        spread = r.spread
        out.append({**{k: p[k] for k in ("op", "size_bytes", "scope", "dtype", "status",
                                         "time_us", "busbw_gbps", "late_rank", "lateness_us",
                                         "state", "median_us", "p95_us", "cv", "baseline_us",
                                         "note")},
                    "cycle": c.index, "started": line["started"], "duration_s": c.duration_s,
                    "late": int(c.late), "world_size": world, "nnodes": nnodes,
                    "spread_pct": None if spread is None else spread * 100,
                    "verdict": line["verdict"],
                    "stragglers": " ".join(str(x) for x in line["stragglers"])})
    return out


def utc_iso(unix_s: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix_s))


def _summary(c: Cycle, j: Judgement, interval: float) -> str:
    parts = [f"{r.probe.op} {format_size(r.probe.size_bytes)} "
             + (f"{r.busbw_gbps:.3g} GB/s" if r.busbw_gbps else r.status) for r in c.results]
    line = f"cycle {c.index}: {', '.join(parts)}; verdict {j.verdict}"
    if j.stragglers:
        line += f"; stragglers: ranks {', '.join(map(str, j.stragglers))}"
    if c.late:
        line += f"; LATE: took {c.duration_s:.2f} s of a {interval:g} s interval"
    for change in j.changes:
        line += f"\n  {change}"
    return line

