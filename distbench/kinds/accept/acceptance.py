"""`distbench accept` on every rank: agree on the profile (profile_choice.py), then run its
itinerary (itinerary.py): for each check measure every target (each node, each pair of nodes, the
cluster), the targets of a round at the same time in process groups of their own, made for the
round and released before the next round's (a rank holds one round's groups at most), and hand
the results to rank 0, which judges
them (verdicts.py), has the failures retested, and writes the check's rows before the next
check starts; once every check is judged, the verdict (files.py)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch.distributed as dist

from distbench.bench import series
from distbench.bench.measure import Settings, Skipped
from distbench.core import noise
from distbench.core.accounting import bandwidth
from distbench.core.exitcodes import EXIT_BELOW, EXIT_INCONCLUSIVE, EXIT_OK, EXIT_WRONG
from distbench.core.tables import Output, format_row, format_table, plural
from distbench.kinds.accept import files, itinerary, profile_choice, verdicts
from distbench.kinds.accept.itinerary import Cluster, Groups, Target, by_machine, target_of
from distbench.kinds.accept.profile_model import Profile, ProfileCheck
from distbench.ops.collectives import OPS, Ctx
from distbench.run import split
from distbench.run.buffers import release
from distbench.run.runtime import RunFailure, node_names

if TYPE_CHECKING:
    from distbench.run.session import Session


def run(s: Session, output: Output) -> int:
    rt, opts = s.rt, s.opts
    profile, why = profile_choice.agree(rt, opts.profile)
    s.console.log(f"profile {profile.name}: {why}")
    names = node_names(rt.ranks)
    lay = Cluster.of_ranks(rt.ranks, names)
    route = itinerary.make(profile, lay, opts.quick)
    groups = Groups(rt.world, _group_maker(rt, opts.timeout), dist.destroy_process_group)
    met = itertools.count(1)
    s.console.log(f"{plural(len(profile.checks), 'check')} on {plural(len(names), 'node')}, "
                  f"{plural(rt.world, 'rank')}, "
                  f"backend {rt.backend}; results in {s.run_dir}/")
    m = Settings.of(s, warmup=profile.warmup, iters=profile.iters, min_time=0.0, check=True,
                    cuda_graph=False, reps=noise.REPS)
    chief = rt.rank == 0
    baseline = (files.read_baseline(Path(opts.baseline), profile)
                if opts.baseline and chief else None)
    progress = files.AcceptFiles(s.run_dir, s.record, profile, why, names, rt,
                                     opts.strict) if chief else None
    if progress is not None:
        s.on_end.append(progress.ended)
    sink = s.sink(output)
    s.console.lines(format_table(output.console, [], title=(
        f"accept  profile {profile.name}  nodes {len(names)}  ranks {rt.world}  "
        f"backend {rt.backend}")))
    results: list[verdicts.Result] = []
    judged = None
    # Each check is measured, judged, retested and written before the next starts: a run
    # stopped halfway keeps every row measured, and accept.json says how far it got.
    for k, leg in enumerate(route.legs):
        check = leg.check
        if chief:
            progress.begin(check.name)
        so_far = replace(profile, checks=profile.checks[:k + 1])
        results += measure_check(s, m, leg, groups, lay, met)
        # Retests: a suspect node against a node that passed, any other failure as it was; a
        # fault fails again, a burst of noise rarely does.
        retests: list = [None]
        if chief:
            judged = verdicts.judge(results, so_far, names, baseline)
            retests = [[planned for name, planned in judged.retests() if name == check.name]]
        dist.broadcast_object_list(retests, src=0)
        for retest_rounds in retests[0]:
            for r in retest_rounds:
                targets = [target_of(check.scope, nodes, lay) for nodes in r]
                results += [replace(x, retest=True)
                            for x in _round(s, m, check, targets, groups, lay, met)]
        if chief:
            if retests[0]:
                judged = verdicts.judge(results, so_far, names, baseline)
            for row in judged.rows():
                if row["check"] == check.name:
                    sink.append(row)
                    s.console.lines([format_row(output.console, _shown(row))])
            progress.finished(check.name, judged)
    groups.release()
    outcome = [None]
    if chief:
        _conclude(s, profile, judged, progress)
        outcome = [judged.outcome(opts.strict)]
    dist.broadcast_object_list(outcome, src=0)
    status, code, line = outcome[0]
    if code == EXIT_WRONG:
        raise RunFailure(line, status="wrong", exit_code=EXIT_WRONG)
    if code == EXIT_BELOW:
        raise RunFailure(line, status="below_expectation", exit_code=EXIT_BELOW)
    if code == EXIT_INCONCLUSIVE:
        raise RunFailure(line, status="inconclusive", exit_code=EXIT_INCONCLUSIVE)
    s.console.log(line)  # the other outcomes say theirs as the run's error line
    return EXIT_OK


def _shown(row: dict) -> dict:
    """The row as the console shows it: a retest's target says so, or it would read as a
    duplicate of the first measurement (the CSV has its `retest` column)."""
    return {**row, "target": f"{row['target']} (retest)"} if row["retest"] else row


def measure_check(s: Session, m: Settings, leg: itinerary.Leg, groups: Groups,
                  lay: Cluster, met: Iterator[int]) -> list[verdicts.Result]:
    """One check of the itinerary, every round of it, on every rank; rank 0 gets the results."""
    if not leg.rounds:  # a pair check on one node
        return [verdicts.Result(leg.check, "pairs", (), 0,
                                note="one node: no pair of nodes to measure")]
    return [r for i, targets in enumerate(leg.rounds)
            for r in _round(s, m, leg.check, targets, groups, lay, met, leg.rounds.key(i))]


def _group_maker(rt, timeout_s: float):
    """Groups.make for this run: a round's disjoint groups in one call on every rank
    (run.split.make)."""
    def make(lists: list[tuple[int, ...]]) -> dict:
        mine = split.make(rt.backend, [list(r) for r in lists], timeout_s)
        return {r: mine for r in lists if rt.rank in r}
    return make


def _round(s: Session, m: Settings, check: ProfileCheck, targets: list[Target], groups: Groups,
           lay: Cluster, met: Iterator[int], key: object = None) -> list[verdicts.Result]:
    """One round: the ranks of each target measure it (in batches that share no machine), the
    others wait on the host; rank 0 gets every target's result. `met` numbers the host
    barriers, alike on every rank; `key` names the round's groups (Rounds.key; a retest's
    round has none)."""
    rt = s.rt
    of = dict(zip(targets, groups.for_round(targets, key), strict=True))
    found: list[verdicts.Result] = []
    for batch in by_machine(targets, lay.hosts):
        mine = None
        for target in batch:
            if rt.rank in target.ranks:
                mine = _measure(s, m, check, target, of[target])
        what = f"{check.name}: waiting for the round's other targets"
        s.phase(what, 3 * s.opts.timeout)
        if rt.peers is not None:
            # on the host first: a collective queued now would be timed by NCCL's watchdog
            # from now, and abort an idle rank whose peers measure for longer than the timeout
            rt.peers.wait_on_host(f"round/{next(met)}", rt.world, 3 * s.opts.timeout)
        everyone: list = [None] * rt.world
        dist.all_gather_object(everyone, mine)
        found += [r for r in everyone if r is not None]
    release(rt.device)
    return found


def _measure(s: Session, m: Settings, check: ProfileCheck, target: Target, group
             ) -> verdicts.Result | None:
    """The check on one target's ranks; the result on the target's first rank, None on the
    others."""
    rt = s.rt
    n = len(target.ranks)
    me = rt.rank if group is None else dist.get_rank(group)
    if target.ranks[me] != rt.rank:  # peers would mismatch: a hang on NCCL
        raise RuntimeError(f"group rank {me} of {target.name} is rank {target.ranks[me]}, "
                           f"not {rt.rank}")
    base = dict(check=check, target=target.name, nodes=target.nodes, ranks=n)
    if n < 2:
        return verdicts.Result(**base, note="one rank: nothing travels") if me == 0 else None
    what = f"{check.name} on {target.name}"
    try:
        if check.command == "collective":
            op = OPS[check.op]
            ctx = Ctx(me, n, root=0, redop="sum", in_place=op.placements[0], group=group)
            acc = op.accounting
            lay, st = series.collective_once(m, op, check.dtype, check.size, ctx, what)
        else:
            acc = series.SENDRECV
            lay, st = series.p2p_once(m, check.op, check.dtype, check.size, me, n, what, group)
    except Skipped as e:
        return verdicts.Result(**base, note=str(e)) if me == 0 else None
    if me != 0:
        return None
    algbw, busbw = bandwidth(acc, lay.size_bytes, st.time_us / 1e6, n)
    _, typical = bandwidth(acc, lay.size_bytes, st.p50_us / 1e6, n)
    return verdicts.Result(**base, size_bytes=lay.size_bytes, iters=st.iters,
                           time_us=st.time_us, p99_us=st.p99_us, algbw_gbps=algbw,
                           busbw_gbps=busbw, wrong=st.wrong, p50_us=st.p50_us,
                           p50_busbw_gbps=typical, spread=noise.spread(st.reps_us))


def _conclude(s: Session, profile: Profile, judged, progress) -> None:
    """Rank 0, every check judged: the nodes named and the notes on stderr, the verdict in
    accept.json, accept.md and run.json, and with --baseline the comparison."""
    for line in judged.findings():
        s.console.log(line)
    progress.conclude(judged)
    if s.opts.baseline and s.run_dir is not None:
        # the verdicts above have already judged each check, by the profile's tolerance
        from distbench.results.baseline import print_comparison

        print_comparison(s, profile.baseline_tolerance)
