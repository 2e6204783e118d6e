"""One measurement on every rank, under the session's watchdog: warmup and calibration, the timed
loop, the correctness check and the cross-rank statistics. Every command measures through here,
sweeps, training steps and acceptance alike, with the `Settings` a session gives."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from distbench.bench import timing
from distbench.core import noise
from distbench.core.errors import one_line
from distbench.core.exitcodes import EXIT_WRONG
from distbench.ops.case import Case
from distbench.run.faults import Faults
from distbench.run.runtime import RunFailure

if TYPE_CHECKING:
    from distbench.run.peers import Peers
    from distbench.run.session import Session

# The options a measurement reads, by their names in the options classes.
OPTIONS = ("timeout", "warmup", "iters", "min_time", "check", "cuda_graph", "reps")


@dataclass(frozen=True)
class Settings:
    """What a measurement needs of its run, and nothing else; `Settings.of` makes it from a
    session."""

    device: torch.device
    timeout: float  # seconds each stage may take (setup, warmup, check, statistics): --timeout
    warmup: int  # untimed iterations first (one runs whatever this says)
    iters: int | None  # timed iterations; None: calibrated to fill min_time
    # names what runs now and how long it may take: errors and timeouts quote it (Session.phase)
    phase: Callable[[str, float], None]
    faults: Faults = Faults()  # the test suite's, applied to each case before it runs
    peers: Peers | None = None  # the launcher's store, for host barriers; None: no store
    min_time: float = 0.0  # seconds the timed loop should fill when iters is None
    check: bool = True  # check each case's result after its timed loop
    cuda_graph: bool = False  # the loop captured in a CUDA graph and replayed
    reps: int = 1  # separated repetitions the timed iterations are split into

    @classmethod
    def of(cls, s: Session, **given) -> Settings:
        """The session's settings: its command's options where it has them (a training step's
        have no min_time, cuda_graph or reps, and take the defaults), `given` over them
        (acceptance's profile sets its own iterations)."""
        opts = {name: getattr(s.opts, name) for name in OPTIONS if hasattr(s.opts, name)}
        # a test's stand-in runtime may have no store
        return cls(device=s.rt.device, phase=s.phase, faults=s.faults,
                   peers=getattr(s.rt, "peers", None), **{**opts, **given})


class Skipped(Exception):
    """This measurement cannot be made here, on every rank alike: a skipped row, not a failure."""


def timed_samples(m: Settings, fn: Callable[[], object], what: str,
                  before_loop: Callable[[], object] | None = None, group=None) -> timing.Timed:
    """Warmup (and calibration to m.min_time when m.iters is None), then the timed loop, each
    under the watchdog; `before_loop` runs between them (e.g. to reset a compute clock). With
    m.cuda_graph, the loop's ops are captured in one CUDA graph and replayed (raises Skipped
    when some rank cannot capture them). `group`: the ranks taking part (None: every rank). The
    timed iterations run as m.reps separated repetitions (timing.measure)."""
    from distbench.run.peers import agree

    device = m.device
    m.phase(f"{what} (warmup)", m.timeout)
    warm = timing.warm_up(fn, m.warmup, m.iters, m.min_time, device, group)
    iters, per_op = warm.iters, warm.typical
    captured = None
    if m.cuda_graph:
        m.phase(f"{what} (CUDA graph capture)", m.timeout)
        reason = ""
        try:
            captured = timing.capture(fn, iters, device)
        except (RuntimeError, AttributeError) as e:
            root = e.__context__ or e  # the capture's own error, not the one ending it
            reason = f"cannot capture in a CUDA graph: {one_line(root, 200, mark='')}"
        if not agree(not reason, device, group):
            raise Skipped(reason or "another rank could not capture this in a CUDA graph")
    if before_loop is not None:
        before_loop()
    # The loop's time twice over, past --timeout: what a rank that finished its own loop may
    # wait on the host for the others'. The loop itself runs as long as it moves, and ends
    # --timeout after it stops (a peer stopped): the session's watchdog watches timing.LOOP.
    budget = m.timeout + 2 * iters * per_op
    m.phase(what, budget)
    longest = max(noise.rep_lengths(iters, m.reps)) * per_op
    settle = _host_barrier(m.peers, group, budget) \
        if longest > timing.QUEUE_SHARE * m.timeout else None
    return timing.measure(fn, iters, device, timing.sync_every(per_op, m.timeout), captured,
                          group, m.reps, settle)


# Host barriers so far, by runtime and group: every member of a group counts the same.
_host_barriers: dict[tuple, int] = {}


def _host_barrier(peers: Peers | None, group, timeout_s: float):
    """A barrier through the launcher's store, run after each repetition that may outlast what
    a queued collective is allowed (half the timeout, as for sync_every). ProcessGroupNCCL, and
    gloo too, time a collective from when a rank enters it: a rank that sits the pattern out
    (its loop does nothing) would enter the next one at once and be timed out while the others
    measure. Every rank takes part, since not every rank knows which ones sit out; shorter
    repetitions go without, as a store barrier may wake a waiting rank 0.1 s late. None
    without a store (a fake runtime)."""
    if peers is None:
        return None
    ranks = "all" if group is None else ",".join(map(str, dist.get_process_group_ranks(group)))
    key = (id(peers), ranks)
    members = dist.get_world_size(group)

    def settle():
        count = _host_barriers[key] = _host_barriers.get(key, 0) + 1
        # False only when the store is gone or this step's watchdog has fired: either way the
        # collective that follows ends the run as it would have
        peers.wait_on_host(f"{ranks}/{count}", members, timeout_s)
    return settle


def measure_case(m: Settings, case: Case, what: str, size: int, scale: float = 1.0,
                 group=None) -> timing.Stats:
    """`scale` turns a timed call into the quantity reported (0.5: one way of a round trip).
    The faults (tests only) apply here, the one hook point, before anything runs. `group`: the
    ranks the case runs on (a node, a pair of nodes); None: every rank."""
    m.phase(f"{what} (setup)", m.timeout)
    case = m.faults.apply(case, size)
    case.prepare()
    timed = timed_samples(m, case.run, what, group=group)
    wrong = 0
    if m.check:
        m.phase(f"{what} (check)", m.timeout)
        case.prepare()
        case.run()
        timing.sync(m.device)
        wrong = case.check()
    m.phase(f"{what} (statistics)", m.timeout)
    samples = timed.samples if scale == 1.0 else [x * scale for x in timed.samples]
    return timing.summarize(samples, wrong, m.device, active=case.active,
                            host_share=timed.host_share, group=group,
                            rep_lengths=timed.rep_lengths)


def timing_cells(st: timing.Stats, mean: str = "time_us") -> dict:
    """The timing statistics as a row's cells, under the column names every CSV shares; the
    mean's column is `mean` (the training steps call it step_us)."""
    return {"iters": st.iters, mean: st.time_us, "rank_min_us": st.rank_min_us,
            "rank_max_us": st.rank_max_us, "slowest_rank": st.slowest_rank,
            "p50_us": st.p50_us, "p99_us": st.p99_us, "cv_pct": st.cv_pct}


def stats_columns(st: timing.Stats, checked: bool) -> dict:
    """A sweep row's measured cells: the timing, the check (None when not checked), the
    launch-bound flag and the repetitions' spread."""
    return {
        **timing_cells(st), "wrong": st.wrong if checked else None,
        "launch_bound": st.launch_bound, "reps": len(st.reps_us),
        "spread_pct": None if (sp := noise.spread(st.reps_us)) is None else 100 * sp,
    }


def fail_if_wrong(bad: list[str]) -> None:
    """Every rank knows the summed wrong counts, so every rank raises the same failure."""
    if bad:
        more = f" (+{len(bad) - 5} more)" if len(bad) > 5 else ""
        raise RunFailure("wrong results: " + "; ".join(bad[:5]) + more, status="wrong",
                         exit_code=EXIT_WRONG)
