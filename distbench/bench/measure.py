"""One measurement on every rank, under the session's watchdog: warmup and calibration, the timed
loop, the correctness check and the cross-rank statistics."""

from __future__ import annotations

import torch.distributed as dist

from distbench.bench import timing
from distbench.core import noise
from distbench.core.exitcodes import EXIT_WRONG
from distbench.ops.case import Case
from distbench.run.runtime import RunFailure


class Skipped(Exception):
    """This measurement cannot be made here, on every rank alike: a skipped row, not a failure."""


def timed_samples(s, fn, what: str, min_time: float = 0.0, before_loop=None,
                  graph: bool = False, group=None, reps: int = 1) -> timing.Timed:
    """Warmup (and calibration to min_time when opts.iters is None), then the timed loop, each
    under the watchdog; `before_loop` runs between them (e.g. to reset a compute clock). With
    `graph`, the loop's ops are captured in one CUDA graph and replayed (raises Skipped when
    some rank cannot capture them). `group`: the ranks taking part (None: every rank). `reps`:
    the timed iterations split into that many separated repetitions (timing.measure)."""
    from distbench.run.peers import agree

    opts, device = s.opts, s.rt.device
    s.step(f"{what} (warmup)", opts.timeout)
    warm = timing.warm_up(fn, opts.warmup, opts.iters, min_time, device, group)
    iters, per_op = warm.iters, warm.typical
    captured = None
    if graph:
        s.step(f"{what} (CUDA graph capture)", opts.timeout)
        reason = ""
        try:
            captured = timing.capture(fn, iters, device)
        except (RuntimeError, AttributeError) as e:
            root = e.__context__ or e  # the capture's own error, not the one ending it
            reason = "cannot capture in a CUDA graph: " + (
                str(root).strip().splitlines() or [type(root).__name__])[0][:200]
        if not agree(not reason, device, group):
            raise Skipped(reason or "another rank could not capture this in a CUDA graph")
    if before_loop is not None:
        before_loop()
    # The loop's time twice over, past --timeout: what a rank that finished its own loop may
    # wait on the host for the others'. The loop itself runs as long as it moves, and ends
    # --timeout after it stops (a peer stopped): the session's watchdog watches timing.LOOP.
    budget = opts.timeout + 2 * iters * per_op
    s.step(what, budget)
    longest = max(noise.rep_lengths(iters, reps)) * per_op
    settle = _host_barrier(s, group, budget) if longest > timing.QUEUE_SHARE * opts.timeout \
        else None
    return timing.measure(fn, iters, device, timing.sync_every(per_op, opts.timeout), captured,
                          group, reps, settle)


# Host barriers so far, by runtime and group: every member of a group counts the same.
_host_barriers: dict[tuple, int] = {}


def _host_barrier(s, group, timeout_s: float):
    """A barrier through the launcher's store, run after each repetition that may outlast what
    a queued collective is allowed (half the timeout, as for sync_every). ProcessGroupNCCL, and
    gloo too, time a collective from when a rank enters it: a rank that sits the pattern out
    (its loop does nothing) would enter the next one at once and be timed out while the others
    measure. Every rank takes part, since not every rank knows which ones sit out; shorter
    repetitions go without, as a store barrier may wake a waiting rank 0.1 s late. None
    without a store (a fake runtime)."""
    peers = getattr(s.rt, "peers", None)
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


def measure_case(s, case: Case, what: str, size: int, scale: float = 1.0,
                 group=None) -> timing.Stats:
    """`scale` turns a timed call into the quantity reported (0.5: one way of a round trip).
    The session's faults (tests only) apply here, the one hook point, before anything runs.
    `group`: the ranks the case runs on (a node, a pair of nodes); None: every rank."""
    opts, device = s.opts, s.rt.device
    s.step(f"{what} (setup)", opts.timeout)
    case = s.faults.apply(case, size)
    case.prepare()
    timed = timed_samples(s, case.run, what, opts.min_time, graph=opts.cuda_graph,
                          group=group, reps=opts.reps)
    wrong = 0
    if opts.check:
        s.step(f"{what} (check)", opts.timeout)
        case.prepare()
        case.run()
        timing.sync(device)
        wrong = case.check()
    s.step(f"{what} (statistics)", opts.timeout)
    samples = timed.samples if scale == 1.0 else [x * scale for x in timed.samples]
    return timing.summarize(samples, wrong, device, active=case.active,
                            host_share=timed.host_share, group=group,
                            rep_lengths=timed.rep_lengths)


def stats_columns(st: timing.Stats, checked: bool) -> dict:
    return {
        "iters": st.iters, "time_us": st.time_us, "rank_min_us": st.rank_min_us,
        "rank_max_us": st.rank_max_us, "slowest_rank": st.slowest_rank, "p50_us": st.p50_us,
        "p99_us": st.p99_us, "cv_pct": st.cv_pct, "wrong": st.wrong if checked else None,
        "launch_bound": st.launch_bound, "reps": len(st.reps_us),
        "spread_pct": None if (sp := noise.spread(st.reps_us)) is None else 100 * sp,
    }


def fail_if_wrong(bad: list[str]) -> None:
    """Every rank knows the summed wrong counts, so every rank raises the same failure."""
    if bad:
        more = f" (+{len(bad) - 5} more)" if len(bad) > 5 else ""
        raise RunFailure("wrong results: " + "; ".join(bad[:5]) + more, status="wrong",
                         exit_code=EXIT_WRONG)
