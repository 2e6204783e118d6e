"""watch's cycles, on every rank: each probe's buffers and timing events are made once, then
every --interval each probe runs --iters ops back to back, timed as `collective` times them,
each rank also timing each op inside the call (records.ProbeResult says why); what every rank
measured is gathered to all, so every rank judges alike (judge.Tracker) and each node's first
rank can write its node's textfile. Between cycles every rank sleeps on the host: at each cycle
boundary one small collective (MAX) carries rank 0's decision (another cycle or not) and the
wait until the next, and any rank's stop signal, so all ranks leave at the same collective.
Rank 0 also writes watch.jsonl and watch.csv, a line and rows per cycle, flushed as the cycle
ends."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import time
from pathlib import Path

import torch
import torch.distributed as dist

from distbench.bench import timing
from distbench.bench.series import allocate
from distbench.core.accounting import bandwidth, buffer_of
from distbench.core.dtypes import element_bytes
from distbench.core.exitcodes import (
    EXIT_BELOW,
    EXIT_INCONCLUSIVE,
    EXIT_OK,
    for_signal,
)
from distbench.core.sizes import format_size
from distbench.core.tables import plural
from distbench.kinds.watch import health, options, textfile
from distbench.kinds.watch.judge import Tracker
from distbench.kinds.watch.output import OUTPUT
from distbench.kinds.watch.probe_baseline import read_baseline
from distbench.kinds.watch.records import (
    SCHEMA_VERSION,
    Cycle,
    Judgement,
    Probe,
    ProbeResult,
    RankInfo,
    arrivals,
)
from distbench.ops.collectives import OPS, Ctx
from distbench.ops.torch_dtypes import TORCH_DTYPES
from distbench.results.writer import Appender
from distbench.run.faults import Faults
from distbench.run.held_stops import HeldStops
from distbench.run.runtime import RunFailure
from distbench.run.session import Session

WARMUP = 2  # untimed ops of each probe per cycle: the first after a pause is slow
# Between cycles a rank sleeps in slices this long (a stop signal cuts the wait short) and
# looks this often for a stop another rank was sent (a store read: cheap, but not every slice)
SLICE_S = 0.1
STOP_POLL_S = 0.5


class _Probe:
    """A probe's case on this rank, built once: a watch that runs for weeks allocates nothing
    per cycle (its timing events included)."""

    def __init__(self, s: Session, probe: Probe, iters: int):
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
            # of the suite's planted faults, wrong data alone: the delay is the loop's (from
            # DISTBENCH_TEST_SLOW_FROM), and a watch has no size to die or stall at
            self.case = Faults(corrupt=s.faults.corrupt).apply(
                self.op.build(self.ctx, inp, out, self.lay.per_rank_count), probe.size_bytes)
            self.marks = (timing.events(2 * iters, rt.device) if rt.device.type == "cuda"
                          else None)
            # this rank's (loop time per op, wrong elements, each op's in-call time), and
            # every rank's, gathered in one collective
            self.mine = torch.zeros(2 + iters, dtype=torch.float64, device=rt.device)
            self.every = [torch.zeros_like(self.mine) for _ in range(rt.world)]

    def measure(self, s: Session, iters: int, delay) -> ProbeResult:
        """As `collective` times an op (docs/methodology.md): untimed ops, a sync and a
        barrier, then a back-to-back loop (timing.in_call_loop); its rate gives the time and
        busbw, each op's in-call time names the rank the others waited for."""
        rt = s.rt
        if self.case is None:
            return ProbeResult(self.probe, "skipped", note=f"too small for {rt.world} ranks")
        run, device = self.case.run, rt.device
        self.case.prepare()
        for _ in range(WARMUP):
            run()
        timing.sync(device)
        dist.barrier()
        timed = timing.in_call_loop(run, iters, device, before=delay, made=self.marks)
        wrong = 0
        if s.opts.check:  # as every command checks: fresh inputs, one op, its output
            self.case.prepare()
            run()
            timing.sync(device)
            wrong = self.case.check()
        self.mine.copy_(torch.tensor([timed.loop_s / iters * 1e6, float(wrong),
                                      *(t * 1e6 for t in timed.calls_s)], dtype=torch.float64))
        dist.all_gather(self.every, self.mine)
        every = [t.tolist() for t in self.every]
        return result_of(self.probe, self.op.accounting, self.lay.size_bytes, rt.world, every)


def result_of(probe: Probe, accounting, size_bytes: int, world: int,
              every: list[list[float]]) -> ProbeResult:
    """A probe's result from every rank's (loop time per op, wrong elements, each op's in-call
    time): the time is the slowest rank's, each rank's in-call mean is kept, and the late rank
    is found op by op (records.arrivals), with the median op's time its lateness is a share
    of."""
    time_us = max(r[0] for r in every)
    calls = [r[2:] for r in every]
    wrong_total = int(sum(r[1] for r in every))
    _, busbw = bandwidth(accounting, size_bytes, time_us / 1e6, world)
    late = arrivals(calls) if world >= 2 else (None, None)
    longest = [max(op) for op in zip(*calls, strict=False)]  # each op's longest in-call time
    op_us = statistics.median(longest) if longest else None
    kept = dict(rank_time_us=tuple(statistics.fmean(c) for c in calls), late_rank=late[0],
                lateness_us=late[1], op_us=op_us)
    if wrong_total:
        return ProbeResult(probe, "failed", time_us, busbw, note=f"{wrong_total} wrong elements",
                           **kept)
    return ProbeResult(probe, "ok", time_us, busbw, **kept)


def rank_infos(ranks: list[dict], snapshots: list[dict], world: int) -> list[RankInfo]:
    """Every rank as the DCGM exporter names its GPU: Hostname, the GPU's NVML index (found by
    its UUID in its node's topology snapshot: the device index a rank sees is another under
    CUDA_VISIBLE_DEVICES or a scheduler's binding; "" where NVML did not list it), its UUID."""
    out = []
    for i in range(world):
        r = ranks[i] if i < len(ranks) else {}
        uuid = str(r.get("gpu_uuid") or "")
        out.append(RankInfo(i, str(r.get("host", "")), nvml_index(uuid, snapshots), uuid))
    return out


def nvml_index(uuid: str, snapshots: list[dict]) -> str:
    """The NVML index of the GPU with this UUID, as text, from the nodes' topology snapshots
    (platform/topo_probe lists each node's GPUs by NVML index); "" when not found."""
    if not uuid:
        return ""
    for snap in snapshots:
        for gpu in snap.get("gpus") or ():
            if str(gpu.get("uuid") or "").lower() == uuid.lower() and "index" in gpu:
                return str(gpu["index"])
    return ""


def node_name() -> str:
    """The node as Slurm names it: SLURMD_NODENAME (slurmd sets it for a HealthCheckProgram
    and for srun's tasks), else the short host name. scontrol refuses a name it does not know,
    as a fully qualified host name often is."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def _node_of(s: Session, rank: int):
    return s.rt.ranks[rank]["node"] if s.rt.ranks else 0  # as Runtime.nnodes groups them


def _wait(s: Session, stop: HeldStops, seconds: float) -> None:
    """Sleep on the host until the next cycle (no collective is pending: on a GPU, no kernel
    spins meanwhile), waking for a stop signal sent to this rank or posted by another."""
    deadline = time.monotonic() + seconds
    peers, posted, next_poll = s.rt.peers, False, 0.0
    while not stop.signum:
        now = time.monotonic()
        if now >= deadline:
            return
        if peers is not None and now >= next_poll:
            got = peers.stop_posted()
            if got is None:  # the store is gone (its host died): the lifeline ends this rank
                peers = None
                continue
            stop.signum = got
            posted = bool(stop.signum)  # another rank's: no need to post it again
            next_poll = now + STOP_POLL_S
        time.sleep(min(SLICE_S, max(0.0, deadline - now)))
    if peers is not None and not posted:
        peers.post_stop(stop.signum)


class _End:
    """How this node's textfile reads once the watch stops: a deliberate end (ended) or a lost
    watch, and the last verdict reached."""

    def __init__(self) -> None:
        self.ended = False
        self.why = "lost: the watch failed"
        self.verdict: str | None = None


def run(s: Session) -> int:
    # Held from the start: a stop during the startup ends at the first boundary, a deliberate
    # end. Noted, not raised, so every rank finishes the collective it is in and all leave at
    # the same boundary (MAX); a rank waiting between cycles wakes at once, and the others
    # learn of it there or through the launcher's store while they wait.
    with HeldStops() as stop:
        return _watch(s, stop)


def _watch(s: Session, stop: HeldStops) -> int:
    opts, rt = s.opts, s.rt
    probes = options.probes_of(opts)
    infos = [rank_infos(rt.ranks, rt.snapshots, rt.world) if rt.rank == 0 else None]
    dist.broadcast_object_list(infos, src=0)  # rank 0 alone holds the nodes' snapshots
    ranks = infos[0]
    mine = [x for x in ranks if _node_of(s, x.rank) == _node_of(s, rt.rank)]
    hostname = ranks[rt.rank].hostname
    k, n = (1, 1) if opts.once else (opts.agree, opts.last)
    tracker = Tracker(probes, rt.world, window=opts.window, k=k, n=n, tolerance=opts.tolerance,
                      warm=opts.warm, baseline=read_baseline(opts.baseline, probes, rt.world)
                      if opts.baseline else None, learn=not opts.once)
    prom = Path(opts.textfile) if opts.textfile else None
    writes_prom = prom is not None and rt.local_rank == 0
    end = _End()
    if prom is not None:
        # every rank of the node, whichever ends first: a dead writer's peers still clear it
        s.on_stop.append(lambda: textfile.write_down(
            prom, hostname=hostname, why=end.why if end.ended else f"{end.why} in {s.current}",
            ended=end.ended, last_verdict=end.verdict))
    if writes_prom:
        _textfile(s, textfile.write_down, prom, hostname=hostname, why="starting")
    lines = Appender(s.run_dir / "watch.jsonl") if s.run_dir is not None else None
    sink = s.sink(OUTPUT)
    s.phase("watch: building the probes", opts.timeout)
    built = [_Probe(s, p, opts.iters) for p in probes]
    s.console.log(f"watch: {', '.join(f'{p.op} {format_size(p.size_bytes)}' for p in probes)} "
                  f"every {opts.interval:g} s on {rt.world} ranks, {rt.nnodes} node(s), backend "
                  f"{rt.backend}; results in {s.run_dir}/")
    started = time.monotonic()
    late_total, judgement, index, t0 = 0, None, 0, None
    # the boundary's agreement, MAX over ranks: a stop signal any rank was sent; rank 0's
    # "no more cycles" and the seconds until the next cycle starts (the others give 0)
    said = torch.zeros(3, dtype=torch.float64, device=rt.device)
    while True:
        s.phase(f"watch: the boundary after cycle {index - 1}" if index else
               "watch: the boundary before cycle 0", opts.timeout)
        now = time.monotonic()
        said.zero_()
        said[0] = stop.signum
        if rt.rank == 0:
            wait = 0.0 if t0 is None or opts.once else max(0.0, t0 + opts.interval - now)
            # judged at the next cycle's start: --duration 1 with --interval 5 ends at 1 s,
            # not after the 5 s; the last cycle's file stands for its interval, as every
            # cycle's does (a scrape reads it), but not past --duration
            done = not _more(opts, index, now + wait - started)
            if done and opts.duration is not None:
                wait = min(wait, max(0.0, started + opts.duration - now))
            said[1], said[2] = float(done), wait
        dist.all_reduce(said, op=dist.ReduceOp.MAX)
        signum, done, wait_s = (int(said[0].item()), bool(said[1].item()),
                                float(said[2].item()))
        if signum:
            break
        if wait_s > 0:
            # then back to the boundary, whoever woke first and why: every rank decides
            # there, alike, whether the cycle runs
            s.phase(f"watch: waiting for cycle {index}" if not done else
                   f"watch: the last cycle's file stands (after cycle {index - 1})",
                   wait_s + opts.timeout)
            _wait(s, stop, wait_s)
            continue
        if done:
            break
        t0, wall0 = time.monotonic(), time.time()
        s.phase(f"watch cycle {index}", opts.timeout)
        delay = s.faults.before_collective() if index >= s.faults.slow_from else None
        results = tuple(b.measure(s, opts.iters, delay) for b in built)
        duration = time.monotonic() - t0
        late = duration > opts.interval
        late_total += late
        cycle = Cycle(index, wall0, duration, late, results)
        judgement = tracker.observe(cycle)
        end.verdict = judgement.verdict
        line = cycle_line(cycle, judgement, opts.interval)
        if lines is not None:
            lines.write(json.dumps(line) + "\n")
        for row in csv_rows(line, cycle, rt.world, rt.nnodes):
            sink.append(row)
        if writes_prom:
            _textfile(s, textfile.write, prom, judgement, cycle, mine, hostname=hostname,
                      interval_s=opts.interval, cycles_total=index + 1,
                      late_total=late_total)
        s.console.log(_summary(cycle, judgement, opts.interval))
        index += 1
    end.ended = True
    if signum:
        end.why = f"stopped by {signal.Signals(signum).name} after {plural(index, 'cycle')}"
    else:
        end.why = f"ended as asked after {plural(index, 'cycle')}"
    return _ending(s, judgement, ranks, signum, end.why)


def _textfile(s: Session, write, path: Path, *args, **kwargs) -> None:
    """A textfile write (write(path, ...)) that failed (a full disk, its directory removed) is
    said, and the watch goes on: the next cycle writes it again, and its own files keep every
    cycle."""
    try:
        write(path, *args, **kwargs)
    except OSError as e:
        s.console.log(f"watch: cannot write the textfile {path}: {e.strerror or e}; the watch "
                      "goes on")


def _more(opts, index: int, elapsed_s: float) -> bool:
    cycles = options.cycles_of(opts)
    if cycles is not None and index >= cycles:
        return False
    return opts.duration is None or elapsed_s < opts.duration


def _ending(s: Session, j: Judgement | None, ranks: list[RankInfo], signum: int = 0,
            why: str = "") -> int:
    """The exit: 0 with an ok verdict, EXIT_BELOW with warn or fail, EXIT_INCONCLUSIVE with
    nothing judged; with --npd, node-problem-detector's 0, 1, 2 and its one short line. A stop
    signal, agreed by every rank at a cycle boundary, ends as that signal does (130, 143), with
    the verdict reached said beside it."""
    opts = s.opts
    named = [f"rank {r} ({ranks[r].hostname})" for r in (j.stragglers if j else ())]
    verdict = j.verdict if j is not None else "unknown"
    line = f"watch verdict {verdict}" + (f"; stragglers: {', '.join(named)}" if named else "")
    if signum:  # stopped: no verdict to act on (no drain), and for --npd "unknown"
        if opts.npd and s.rt.rank == 0:
            print(health.npd_stopped(signum), flush=True)
        raise RunFailure(f"{why}; {line}", status="interrupted" if signum == signal.SIGINT
                         else "terminated", exit_code=for_signal(signum), agreed=True)
    if opts.npd:  # run.json keeps distbench's codes; the launcher gives the plugin its own
        code, message = health.npd_result(j, named)
        if s.rt.rank == 0:
            print(message, flush=True)
        if code == 0:
            return EXIT_OK
        raise RunFailure(message, status="below_expectation" if code == 1 else "inconclusive",
                         exit_code=EXIT_BELOW if code == 1 else EXIT_INCONCLUSIVE)
    if opts.drain and j is not None and health.should_drain(j):
        _drain(s, j)
    code = health.exit_code(verdict)
    if code == EXIT_OK:
        s.console.log(line)
        return EXIT_OK
    if code == EXIT_INCONCLUSIVE:
        raise RunFailure(f"{line}: nothing judged (no baseline yet: --baseline, or more "
                         f"cycles than --warm)", status="inconclusive", exit_code=code)
    raise RunFailure(line, status="below_expectation", exit_code=code)


def _drain(s: Session, j: Judgement) -> None:
    """Drain the nodes named (the stragglers' nodes, else every node of the watch) with a
    reason that says what failed; the line is printed everywhere, run where scontrol exists.
    Each rank gives its own node's Slurm name (node_name), gathered in one collective. A name
    scontrol would misread is refused in one line; the verdict stands."""
    nodes = [None] * s.rt.world
    dist.all_gather_object(nodes, node_name())
    if s.rt.rank != 0:
        return
    reason = health.drain_reason(j, {r: f"rank {r} ({nodes[r]})" for r in j.stragglers})
    for node in sorted({nodes[r] for r in j.stragglers} or set(nodes)):
        try:
            drain = health.drain_command(node, reason)
        except ValueError as e:
            s.console.log(f"watch: cannot drain: {e} (SLURMD_NODENAME, else the host name)")
            continue
        print(drain.line, flush=True)
        if shutil.which(drain.argv[0]):
            subprocess.run(drain.argv, check=False, timeout=30)


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

