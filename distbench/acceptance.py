"""`distbench accept` on every rank: agree on the profile, then for each of its checks measure
every target (each node, each pair of nodes, the cluster), the targets of a round at the same
time in process groups of their own, and hand the results to rank 0, which judges them
(verdicts.py), has the failures retested, and writes the check's rows before the next check
starts; once every check is judged, the verdict (accept_files.py)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

from distbench import accept_files, noise, schedule, verdicts
from distbench.accounting import bandwidth, layout
from distbench.exitcodes import EXIT_BELOW, EXIT_INCONCLUSIVE, EXIT_OK, EXIT_WRONG
from distbench.measure import Skipped, measure_case
from distbench.memory import allocate_fitting, release
from distbench.ops import p2p
from distbench.ops.collectives import OPS, Ctx
from distbench.ops.dtypes import TORCH_DTYPES, element_size
from distbench.profiles import Check, Profile, pick, resolve
from distbench.runtime import RunFailure, node_names
from distbench.series import SENDRECV, allocate
from distbench.tables import format_row, format_table


@dataclass(frozen=True)
class Target:
    """What one measurement of a check runs on."""

    name: str  # a node's name, "a+b" for a pair, "cluster"
    nodes: tuple[int, ...]  # node indices
    # global ranks, ascending: the order torch gives a new group's ranks (new_group sorts
    # them), so ranks.index(rank) is a rank's group rank under any placement (srun -m cyclic,
    # mpirun --map-by node put a node's ranks apart)
    ranks: tuple[int, ...]


def _node_ranks(ranks: list[dict]) -> list[tuple[int, ...]]:
    by_node: dict[int, list[int]] = {}
    for r in ranks:
        by_node.setdefault(r["node"], []).append(r["rank"])
    return [tuple(sorted(by_node[i])) for i in sorted(by_node)]


def rounds_of(check: Check, names: list[str], node_ranks: list[tuple[int, ...]], quick: bool
              ) -> list[list[Target]]:
    """The check's targets, in rounds of targets that share no node."""
    if check.scope == "cluster":
        every = tuple(r for ranks in node_ranks for r in ranks)
        return [[Target("cluster", tuple(range(len(names))), tuple(sorted(every)))]]
    if check.scope == "node":
        return [[Target(names[i], (i,), ranks) for i, ranks in enumerate(node_ranks)]]
    pairs = schedule.quick_round(len(names)) if quick else schedule.circle_rounds(len(names))
    return [[pair_target(a, b, names, node_ranks) for a, b in r] for r in pairs]


def pair_target(a: int, b: int, names: list[str], node_ranks: list[tuple[int, ...]]) -> Target:
    return Target(f"{names[a]}+{names[b]}", (a, b), tuple(sorted(node_ranks[a] + node_ranks[b])))


def target_of(scope: str, nodes: tuple[int, ...], names: list[str],
              node_ranks: list[tuple[int, ...]]) -> Target:
    """The target of a check of `scope` on these nodes (a retest names them so)."""
    if scope == "node":
        return Target(names[nodes[0]], nodes, node_ranks[nodes[0]])
    if scope == "pair":
        return pair_target(*nodes, names, node_ranks)
    return Target("cluster", nodes, tuple(sorted(r for i in nodes for r in node_ranks[i])))


def by_machine(targets: list[Target], hosts: list[str]) -> list[list[Target]]:
    """A round's targets in batches that share no host: targets measured at the same time on one
    machine contend for its cores and NICs and measure each other (several launcher agents on
    one host, as the tests run them). On a cluster every node is a machine: one batch."""
    batches: list[tuple[set[str], list[Target]]] = []
    for target in targets:
        mine = {hosts[i] for i in target.nodes}
        for used, batch in batches:
            if not used & mine:
                used |= mine
                batch.append(target)
                break
        else:
            batches.append((set(mine), [target]))
    return [batch for _, batch in batches]


def _hosts(ranks: list[dict]) -> list[str]:
    hosts: dict[int, str] = {}
    for r in ranks:
        hosts.setdefault(r["node"], r["host"])
    return [hosts[i] for i in sorted(hosts)]


def run(s, output) -> int:
    rt, opts = s.rt, s.opts
    profile, why = _agree_profile(s)
    s.console.log(f"profile {profile.name}: {why}")
    names, node_ranks, hosts = node_names(rt.ranks), _node_ranks(rt.ranks), _hosts(rt.ranks)
    s.console.log(f"{len(profile.checks)} checks on {len(names)} node(s), {rt.world} ranks, "
                  f"backend {rt.backend}; results in {s.run_dir}/")
    view = SimpleNamespace(rt=rt, faults=s.faults, step=s.step, opts=SimpleNamespace(
        timeout=opts.timeout, warmup=profile.warmup, iters=profile.iters, min_time=0.0,
        check=True, cuda_graph=False, reps=noise.REPS))
    chief = rt.rank == 0
    baseline = (accept_files.read_baseline(Path(opts.baseline), profile)
                if opts.baseline and chief else None)
    progress = accept_files.Progress(s.run_dir, s.record, profile, why, names, rt,
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
    for k, check in enumerate(profile.checks):
        if chief:
            progress.begin(check.name)
        so_far = replace(profile, checks=profile.checks[:k + 1])
        rounds = rounds_of(check, names, node_ranks, opts.quick)
        if not rounds:  # a pair check on one node
            results.append(verdicts.Result(check, "pairs", (), 0, note="one node: no pair of "
                                           "nodes to measure"))
        for targets in rounds:
            for batch in by_machine(targets, hosts):
                results += _round(s, view, check, batch)
        # Retests: a suspect node against a node that passed, any other failure as it was; a
        # fault fails again, a burst of noise rarely does.
        plan: list = [None]
        if chief:
            judged = verdicts.judge(results, so_far, names, baseline)
            plan = [[planned for name, planned in judged.retests() if name == check.name]]
        dist.broadcast_object_list(plan, src=0)
        for retest_rounds in plan[0]:
            for r in retest_rounds:
                targets = [target_of(check.scope, nodes, names, node_ranks) for nodes in r]
                for batch in by_machine(targets, hosts):
                    results += [replace(x, retest=True) for x in _round(s, view, check, batch)]
        if chief:
            if plan[0]:
                judged = verdicts.judge(results, so_far, names, baseline)
            for row in judged.rows():
                if row["check"] == check.name:
                    sink.append(row)
                    s.console.lines([format_row(output.console, _shown(row))])
            progress.finished(check.name, judged)
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


def _agree_profile(s) -> tuple[Profile, str]:
    """The profile every rank runs: the one named, or the one rank 0 picks from the topology."""
    spec = s.opts.profile
    chosen = [None]
    if s.rt.rank == 0:
        if spec == "auto":
            profile, why = pick(s.rt.snapshots)
            chosen = [(str(profile.path), why)]
        else:
            chosen = [(spec, "named on the command line")]
    dist.broadcast_object_list(chosen, src=0)
    path, why = chosen[0]
    return resolve(path), why


def _round(s, view, check: Check, targets: list[Target]) -> list[verdicts.Result]:
    """One round: every rank makes every target's group (in one order, as torch requires), the
    ranks of each target measure it, the others wait; rank 0 gets every target's result."""
    rt = s.rt
    groups = [dist.new_group(list(t.ranks)) if len(t.ranks) < rt.world else None
              for t in targets]
    mine = None
    for target, group in zip(targets, groups, strict=True):
        if rt.rank in target.ranks:
            mine = _measure(s, view, check, target, group)
    s.step(f"{check.name}: waiting for the round's other targets", 3 * s.opts.timeout)
    everyone: list = [None] * rt.world
    dist.all_gather_object(everyone, mine)
    for group in groups:
        if group is not None and group != dist.GroupMember.NON_GROUP_MEMBER:
            dist.destroy_process_group(group)
    release(rt.device)
    return [r for r in everyone if r is not None]


def _measure(s, view, check: Check, target: Target, group) -> verdicts.Result | None:
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
    dtype, elt = TORCH_DTYPES[check.dtype], element_size(check.dtype)
    try:
        if check.command == "collective":
            op = OPS[check.op]
            lay = layout(op.accounting, check.size, elt, n)
            if lay is None:
                raise Skipped(f"too small for {n} ranks")
            ctx = Ctx(me, n, root=0, redop="sum", in_place=op.placements[0], group=group)
            alloc = functools.partial(allocate, op, ctx, dtype=dtype, device=rt.device)
            bufs, fitted = allocate_fitting(alloc, [lay.per_rank_count], rt.device, group=group)
            if bufs is None:
                raise Skipped("does not fit in device memory")
            case, acc, scale = op.build(ctx, bufs[0], bufs[1], lay.per_rank_count), \
                op.accounting, 1.0
        else:
            lay = layout(SENDRECV, check.size, elt, n)
            if lay is None:
                raise Skipped(f"too small for one {check.dtype} element")
            send, recv = (torch.empty(lay.count, dtype=dtype, device=rt.device)
                          for _ in range(2))
            case = p2p.ring(me, n, send, recv, group) if check.op == "ring" else \
                p2p.pingpong(me, n, send, group)
            acc, scale = SENDRECV, 1.0 if check.op == "ring" else 0.5
        st = measure_case(view, case, what, lay.size_bytes, scale, group=group)
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


def _conclude(s, profile: Profile, judged, progress) -> None:
    """Rank 0, every check judged: the nodes named and the notes on stderr, the verdict in
    accept.json, accept.md and run.json, and with --baseline the comparison."""
    for line in judged.findings():
        s.console.log(line)
    progress.conclude(judged)
    if s.opts.baseline and s.run_dir is not None:
        # the verdicts above have already judged each check, by the profile's tolerance
        from distbench.baseline import print_comparison

        print_comparison(s, profile.baseline_tolerance)
