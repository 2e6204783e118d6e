"""Judging acceptance results: each measurement against the profile's expectation (a floor in
the metric's unit, for the algorithm the node can use, where its ranks per node are the GPUs
the floor is for; or a share of what the healthy peers reach) or a baseline run's figure and
the noise both runs show; PASS, WARN, FAIL or SKIP; the node a pair check's failures point at,
and a node short of GPUs; the retests that confirm or clear a failure; and the run's outcome,
which is never a pass on nothing judged. Pure: results in, verdicts out."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from distbench.core import noise
from distbench.core.exitcodes import EXIT_BELOW, EXIT_INCONCLUSIVE, EXIT_OK, EXIT_WRONG
from distbench.core.tables import percent, plural
from distbench.kinds.accept.profile_model import NodeFacts, Profile, ProfileCheck
from distbench.kinds.accept.schedule import pack, retest_rounds
from distbench.results import healthy


@dataclass(frozen=True)
class Result:
    """One measurement of a check on one target."""

    check: ProfileCheck
    target: str  # a node, "a+b" for a pair, "cluster"
    nodes: tuple[int, ...]  # node indices it ran on
    ranks: int
    size_bytes: int | None = None
    iters: int | None = None
    time_us: float | None = None
    p99_us: float | None = None
    algbw_gbps: float | None = None
    busbw_gbps: float | None = None
    wrong: int | None = None
    p50_us: float | None = None
    p50_busbw_gbps: float | None = None
    note: str = ""  # why nothing was measured
    retest: bool = False  # a suspect node measured again against a node that passed
    # how far the measurement's separated repetitions disagree (noise.spread: 0.3, the slowest
    # took 30% longer than the fastest); None where unknown
    spread: float | None = None

    @property
    def value(self) -> float | None:
        return getattr(self, self.check.metric)


@dataclass(frozen=True)
class Baseline:
    """What an earlier run measured, for --baseline (accept_files.read_baseline)."""

    figures: Mapping[tuple[str, str], float]  # (check, target) -> the value measured
    spreads: Mapping[tuple[str, str], float] = field(default_factory=dict)  # where known
    typical: float | None = None  # the noise that run shows: its median spread (noise.typical)


@dataclass
class Verdict:
    result: Result
    verdict: str  # PASS, WARN, FAIL, SKIP
    expected: float | None = None  # the fail line, in the metric's unit
    warn_at: float | None = None
    reference: float | None = None  # what the healthy peers reach, or the baseline's figure
    ratio: float | None = None  # measured / reference, as "how good" (time inverted)
    why: str = ""


GRADES = {"fail": "FAIL", "warn": "WARN", "ok": "PASS"}
JUDGED = ("PASS", "WARN", "FAIL")
TARGETS = {"node": ("node", "nodes"), "pair": ("pair", "pairs"), "cluster": ("target", "targets")}


def _line(check: ProfileCheck, reference: float, share: float | None) -> float | None:
    """The measured value that does `share` as well as `reference` (the fraction's inverse)."""
    if share is None:
        return None
    return reference * share if check.higher_is_better else reference / share


def _peers(check: ProfileCheck, results: list[Result], names: list[str],
           unhealthy: Mapping[int, list[str]]) -> tuple[float | None, str]:
    """What the healthy targets of a check reach, in the metric's unit, and what it rests on;
    or None and why there is nothing to judge by. `unhealthy`: nodes that failed a node check,
    with those checks: no healthy peer for a pair check, whatever their pairs reach."""
    measured = _first_measured(results)
    if len(measured) < 2:  # one target has no peers: nothing to judge it against
        return None, NO_PEERS
    gone = sorted({i for r in measured for i in r.nodes if i in unhealthy})
    left = [r for r in measured if not set(r.nodes) & set(gone)]
    failed = ", ".join(f"{names[i]} ({', '.join(unhealthy[i])})" for i in gone)
    if not left:
        return None, (f"no healthy peers to judge by: every {TARGETS[check.scope][0]} holds a "
                      f"node that failed a node check: {failed}")
    # healthy.reach takes higher as better: a time is judged by its inverse
    flip = (lambda v: v) if check.higher_is_better else (lambda v: 1.0 / v if v else math.inf)
    items = [(flip(r.value), frozenset(r.nodes)) for r in left]
    ends = [(names[i], i) for i in sorted({i for r in left for i in r.nodes})]
    # a node is left out of the peers where its targets fall below the check's own strictest
    # line, so a node the check would fail (or warn about) cannot set what the peers reach
    lines = [x for x in (check.fail, check.warn) if x is not None]
    found = healthy.reach(items, ends, noun=("target", "targets"),
                          clearly=max(lines) if lines else healthy.CLEARLY_SLOW)
    basis = found.basis
    if gone:
        basis += f"; left out, the {TARGETS[check.scope][1]} of {failed}"
    elif not found.compared:
        basis += " (each involves every node: nothing to compare with)"
    return flip(found.value), basis


def _first_measured(results: list[Result]) -> list[Result]:
    return [r for r in results if r.value is not None and not r.wrong and not r.retest]


NO_PEERS = "one target: no peers to judge it against"


def _against_baseline(check: ProfileCheck, r: Result, base: float, tolerance: float,
                      spreads: list[float | None]) -> Verdict:
    """Worse than the baseline by more than the tolerance AND the noise both runs show (this
    measurement's spread, the baseline's for the target, each run's typical one) fails: on a
    shared machine an unchanged rerun swings threefold, and the tolerance alone called that a
    fault. The rule is noise.judge's, which compare and the other commands' --baseline share;
    `expected` is the line it draws."""
    ratio = check.fraction(r.value, base)
    noisy = noise.largest(spreads)
    expected = _line(check, base, 1 / noise.limit(tolerance, noisy))  # where it turns worse
    if math.isinf(ratio):  # nothing to be worse than: a baseline of 0 GB/s, or of 0 us
        return Verdict(r, "PASS", expected, None, base, ratio,
                       f"baseline {base:.4g}, worse than -{percent(tolerance)} fails")
    call = noise.judge(1 / ratio if ratio > 0 else math.inf, tolerance, spreads)
    if call.mark == "worse":
        beyond = f" and the noise both runs show (+-{noisy:.0%})" if noisy > tolerance else ""
        return Verdict(r, "FAIL", expected, None, base, ratio,
                       f"baseline {base:.4g}: worse beyond the {percent(tolerance)} tolerance"
                       f"{beyond}")
    if ratio < 1 / (1 + tolerance):
        return Verdict(r, "PASS", expected, None, base, ratio,
                       f"baseline {base:.4g}: worse than the {percent(tolerance)} tolerance, but "
                       f"within the noise both runs show (+-{noisy:.0%})")
    noted = f" and the noise both runs show (+-{noisy:.0%})" if noisy > tolerance else ""
    return Verdict(r, "PASS", expected, None, base, ratio,
                   f"baseline {base:.4g}, worse than -{percent(tolerance)}{noted} fails")


def _unfit(profile: Profile, r: Result, names: list[str]) -> str:
    """Why an absolute floor does not apply to this result, or "": the floors are figures for
    the profile's GPUs per node, and busbw's factor moves with the ranks (1.5 at 4, 1.75 at 8),
    so a healthy node measured with 4 of its 8 GPUs would fail an 8-GPU floor."""
    want = profile.gpus_per_node
    if not want or not r.nodes or r.ranks == want * len(r.nodes):
        return ""
    what = "the cluster" if r.target == "cluster" else f"the pair {r.target}"
    ranks = plural(r.ranks, "rank")
    where = (f"{names[r.nodes[0]]} has {ranks}" if len(r.nodes) == 1 else
             f"{what} has {ranks} on {len(r.nodes)} nodes")
    return f"not judged: {profile.name}'s floor is for {plural(want, 'GPU')} per node; {where}"


def _absolute(check: ProfileCheck, profile: Profile, r: Result, names: list[str]) -> Verdict:
    """Against the profile's floors: for the target's node count where the check has floors
    by node count (the row's note names the count, and says so where the table has no row
    for it); those for NVLS where every node of the target has it, the ones without where any
    has not or it is unknown (no healthy node fails for want of evidence), and the row says
    which."""
    check, floor_for, caveat = check.for_nodes(len(r.nodes))
    if check.fail_no_nvls is None and check.warn_no_nvls is None:
        graded, why = check, f"the profile's floor{floor_for}{caveat}"
    else:
        facts = [profile.nodes[i] if i < len(profile.nodes) else
                 NodeFacts(names[i], (), nvls_why="unknown: no snapshot") for i in r.nodes]
        off = next((f for f in facts if f.nvls is False), None)
        unknown = next((f for f in facts if f.nvls is None), None)
        graded = check.floors(not off and not unknown)
        if off:
            why = f"the profile's floor{floor_for} without NVLS ({off.name}: {off.nvls_why})"
        elif unknown:
            why = (f"the profile's floor{floor_for} without NVLS: whether NVLS is in use is "
                   f"unknown ({unknown.name}: {unknown.nvls_why})")
        else:
            why = (f"the profile's floor{floor_for} with NVLS ({facts[0].name}: "
                   f"{facts[0].nvls_why})")
        why += caveat
    floor = graded.fail if graded.fail is not None else graded.warn
    return Verdict(r, GRADES[graded.grade(r.value)], graded.fail, graded.warn, None,
                   graded.fraction(r.value, floor), why)


def _judge_check(check: ProfileCheck, results: list[Result], names: list[str], profile: Profile,
                 baseline: Baseline | None, typical: float | None,
                 unhealthy: Mapping[int, list[str]]) -> list[Verdict]:
    """Every result of the check, retests too; what the peers reach comes from the first
    pass alone, and a retest is graded against it. `typical`: the noise this run shows."""
    peers, basis = _peers(check, results, names, unhealthy) if check.vs == "peers" \
        else (None, "")
    out = []
    for r in results:
        if r.value is None:
            out.append(Verdict(r, "SKIP", why=r.note))
            continue
        if r.wrong:
            out.append(Verdict(r, "FAIL", why=f"{plural(r.wrong, 'wrong element')}: the data "
                               "arrived corrupted"))
            continue
        key = (check.name, r.target)
        base = baseline.figures.get(key) if baseline else None
        if base is not None:
            out.append(_against_baseline(check, r, base, profile.baseline_tolerance, [
                r.spread, baseline.spreads.get(key), typical, baseline.typical]))
        elif check.vs == "peers" and peers is None:
            out.append(Verdict(r, "SKIP", why=basis))
        elif peers is not None:
            out.append(Verdict(r, GRADES[check.grade(r.value, peers)],
                               _line(check, peers, check.fail),
                               _line(check, peers, check.warn), peers,
                               check.fraction(r.value, peers),
                               f"healthy peers reach {peers:.4g} ({basis})"))
        elif unfit := _unfit(profile, r, names):
            out.append(Verdict(r, "SKIP", why=unfit))
        else:
            out.append(_absolute(check, profile, r, names))
    return out


@dataclass
class Judged:
    verdicts: list[Verdict]
    names: list[str]
    culprits: list[str] = field(default_factory=list)  # one line each
    notes: list[str] = field(default_factory=list)
    # check name -> targets (tuples of nodes) to measure again: a suspect node paired with a
    # node that passed, or a failing target as it was
    to_retest: dict[str, list[tuple[int, ...]]] = field(default_factory=dict)
    checks: list[ProfileCheck] = field(default_factory=list)  # those judged, in the profile's order
    # checks judged on fewer targets than their scope holds: "node x on 2 of 4 nodes"
    partial: list[str] = field(default_factory=list)
    # nodes with fewer GPUs than the profile is for, NVML counting: the run fails on them,
    # though nothing measured shows it
    short: list[str] = field(default_factory=list)

    def retests(self) -> list[tuple[str, list[list[tuple[int, ...]]]]]:
        """(check name, rounds of targets that share no node)."""
        return [(check, pack(targets)) for check, targets in self.to_retest.items() if targets]

    def applicable(self, scope: str) -> bool:
        """Whether this cluster has a target of the scope: one node has no pair of nodes, so
        its pair checks are not applicable, which is not the same as measuring nothing (one
        rank per node has nodes, whose checks were all skipped: that is inconclusive)."""
        return scope != "pair" or len(self.names) > 1

    def unjudged(self) -> list[str]:
        """The scopes (node, pair, cluster) this cluster has, whose every check judged nothing:
        all skipped."""
        scopes: dict[str, bool] = {}
        for v in self.verdicts:
            if not v.result.retest:
                scope = v.result.check.scope
                scopes[scope] = scopes.get(scope, False) or v.verdict in JUDGED
        for c in self.checks:
            scopes.setdefault(c.scope, False)  # a check with no result at all judged nothing
        return [s for s in ("node", "pair", "cluster")
                if s in scopes and not scopes[s] and self.applicable(s)]

    def outcome(self, strict: bool) -> tuple[str, int, str]:
        """(run.json status, exit code, one line). A failure or wrong data wins over a verdict
        on nothing judged, which is never a pass."""
        first = [v for v in self.verdicts if not v.result.retest]
        wrong = [v for v in self.verdicts if v.result.wrong]  # a retest's wrong data counts
        failed = [v for v in first if v.verdict == "FAIL"]
        warned = [v for v in first if v.verdict == "WARN"]
        skipped = [v for v in first if v.verdict == "SKIP"]
        if wrong:
            return "wrong", EXIT_WRONG, (f"wrong results in {plural(len(wrong), 'measurement')}"
                                         f", first {_name(wrong[0])}")
        if failed or self.short or (strict and warned):
            bad = failed or (warned if strict else [])
            first_bad = f": first {_name(bad[0])}" if bad else ""
            blame = f"; {self.culprits[0]}" if self.culprits else ""
            return "below_expectation", EXIT_BELOW, (
                f"{plural(len(failed), 'measurement')} failed, {len(warned)} warned{first_bad}"
                f"{blame}")
        partial = (f"; judged on fewer targets than the scope holds: {', '.join(self.partial)}"
                   if self.partial else "")
        empty = self.unjudged()
        if empty:
            why = next((v for v in skipped if v.result.check.scope in empty), None)
            first_skip = f": first {_name(why)}" if why else ""
            if len(empty) == len({s for s in {v.result.check.scope for v in first} | {
                    c.scope for c in self.checks} if self.applicable(s)}):
                return "inconclusive", EXIT_INCONCLUSIVE, (
                    f"inconclusive: every check was skipped, nothing was judged{first_skip}")
            judged = len(first) - len(skipped)
            return "inconclusive", EXIT_INCONCLUSIVE, (
                f"inconclusive: every {' and '.join(empty)} check was skipped{first_skip}; "
                f"the {plural(judged, 'other measurement')} passed "
                f"({plural(len(warned), 'warning')}){partial}")
        if skipped:
            return "ok", EXIT_OK, (f"every check judged passed "
                                   f"({plural(len(warned), 'warning')}, {len(skipped)} skipped)"
                                   f"{partial}")
        return "ok", EXIT_OK, f"every check passed ({plural(len(warned), 'warning')}){partial}"

    def rows(self) -> list[dict]:
        return [_row(v) for v in self.verdicts]

    def findings(self) -> list[str]:
        return [*self.culprits, *self.notes]


def _name(v: Verdict) -> str:
    return f"{v.result.check.name} on {v.result.target} ({v.verdict.lower()}: {v.why})"


def _row(v: Verdict) -> dict:
    r, c = v.result, v.result.check
    return {"check": c.name, "scope": c.scope, "target": r.target, "command": c.command,
            "op": c.op, "dtype": c.dtype, "size_bytes": r.size_bytes, "ranks": r.ranks,
            "iters": r.iters, "time_us": r.time_us, "p99_us": r.p99_us,
            "algbw_gbps": r.algbw_gbps, "busbw_gbps": r.busbw_gbps, "wrong": r.wrong,
            "metric": c.metric, "measured": r.value, "expected": v.expected,
            "warn_at": v.warn_at, "reference": v.reference, "ratio": v.ratio,
            "verdict": v.verdict, "retest": r.retest, "note": v.why, "p50_us": r.p50_us,
            "spread": r.spread}


def _suspects(first: list[Verdict]) -> tuple[list[int], list[int]]:
    """A pair check's suspect nodes (every pair they are in fails, while some partner of theirs
    passes with another node: two slow nodes among four are both named) and its healthy ones
    (they pass with every partner but the suspects, with whom nothing can pass). A pair that
    was skipped neither passes nor fails."""
    judged = [v for v in first if v.verdict in JUDGED]
    nodes = sorted({i for v in judged for i in v.result.nodes})
    fails = {i: [v.verdict == "FAIL" for v in judged if i in v.result.nodes] for i in nodes}
    passes = {i: not all(fails[i]) for i in nodes}
    suspects = [i for i in nodes if all(fails[i]) and any(
        passes[j] for v in judged if i in v.result.nodes for j in v.result.nodes if j != i)]
    healthy_nodes = [i for i in nodes if i not in suspects and not any(
        v.verdict == "FAIL" for v in judged if i in v.result.nodes
        and not set(v.result.nodes) & set(suspects))]
    return suspects, healthy_nodes


def _retested(again: list[Verdict]) -> str:
    """What retests say of a failure: "failed" or "warned" (it held: a fault), "passed" (every
    one a clean PASS: noise), "nothing" (none measured) or "" (none yet). A retest that warns
    is as slow as the warn line says, not noise: only a clean pass clears a failure."""
    if not again:
        return ""
    measured = [a.verdict for a in again if a.verdict != "SKIP"]
    if not measured:
        return "nothing"
    if "FAIL" in measured:
        return "failed"
    return "warned" if "WARN" in measured else "passed"


def _settle(check: ProfileCheck, verdicts: list[Verdict], names: list[str], judged: Judged) -> None:
    """What the first pass's failures mean, once retests exist: a failure whose retests all
    passed cleanly was noise (WARN, said so); one whose retest failed or warned stands. Names
    the node at fault and plans the retests when there are none yet."""
    first = [v for v in verdicts if not v.result.retest]
    again = [v for v in verdicts if v.result.retest]
    failing = [v for v in first if v.verdict == "FAIL" and not v.result.wrong]
    if not failing:
        return
    if check.scope == "pair" and len(names) == 2:
        judged.notes.append(f"{check.name}: {names[0]}+{names[1]} failed, and with 2 nodes a "
                            "pair cannot tell which end is slow; run with a third node, or "
                            "the node checks, to tell")
    suspects, healthy_nodes = _suspects(first) if check.scope == "pair" and len(names) > 2 \
        else ([], [])
    if not again:  # suspects against nodes that passed, other failures as they were
        targets = [p for p in retest_rounds(suspects, healthy_nodes) for p in p]
        targets += [v.result.nodes for v in failing if not set(v.result.nodes) & set(suspects)]
        judged.to_retest[check.name] = targets
    for i in suspects:
        said = _retested([v for v in again if i in v.result.nodes])
        how = {"failed": " (confirmed against a node that passed)",
               "warned": " (confirmed against a node that passed: its retest warned)",
               "passed": " (not confirmed: its retest passed)"}.get(said, "")
        pairs = sum(i in v.result.nodes and v.verdict == "FAIL" for v in first)
        partners = {j for v in first if i in v.result.nodes for j in v.result.nodes if j != i}
        fine = [j for j in partners if j in healthy_nodes]
        line = (f"{check.name}: node {names[i]} is in {_every(pairs, 'failing pair')}, "
                f"{_passing(len(fine), len(partners))} with other nodes{how}")
        (judged.notes if said == "passed" else judged.culprits).append(line)
    for v in failing:
        same = [a for a in again if a.result.nodes == v.result.nodes]
        if not same:  # a suspect's pair: its nodes' retests against healthy nodes decide
            same = [a for a in again if set(a.result.nodes) & set(v.result.nodes) & {*suspects}]
        said = _retested(same)
        if said == "passed":
            v.verdict = "WARN"
            v.why += "; it passed its retest cleanly: noise, not a fault"
        elif said == "failed":
            v.why += "; it failed its retest too"
        elif said == "warned":
            low = min(a.ratio for a in same if a.verdict == "WARN")
            v.why += f"; its retest warned ({low:.3g} of what it is judged by): it stands"
        elif said == "nothing":  # skipped: nothing measured, so nothing confirmed either way
            v.why += "; its retest measured nothing: it stands, unconfirmed"
    if check.scope == "node":
        judged.culprits += [f"{check.name}: node {v.result.target} failed ({v.why})"
                            for v in failing if v.verdict == "FAIL"]


def _every(count: int, noun: str) -> str:
    """All 3 failing pairs, but its 1 failing pair: "all 1" reads as a slip."""
    return f"all {plural(count, noun)}" if count > 1 else f"its {plural(count, noun)}"


def _passing(fine: int, partners: int) -> str:
    """Which of a suspect's partners pass, the verb agreeing with them."""
    if fine == partners:
        return "its partner passes" if fine == 1 else "its partners pass"
    return f"{fine} of its {plural(partners, 'partner')} {'passes' if fine == 1 else 'pass'}"


def _coverage(check: ProfileCheck, verdicts: list[Verdict], judged: Judged) -> None:
    """Says so where a check judged nothing, or fewer targets than it measured for."""
    first = [v for v in verdicts if not v.result.retest]
    done = [v for v in first if v.verdict in JUDGED]
    if not first:
        judged.notes.append(f"{check.name}: nothing measured")
    elif not done:
        judged.notes.append(f"{check.name}: skipped ({first[0].why})")
    elif len(done) < len(first):
        missed = next(v for v in first if v.verdict not in JUDGED)
        count = f"{len(done)} of {len(first)} {TARGETS[check.scope][1]}"
        judged.partial.append(f"{check.name} on {count}")
        judged.notes.append(f"{check.name}: judged on {count} only ({missed.result.target}: "
                            f"{missed.why})")


def _short_of_gpus(profile: Profile, judged: Judged) -> None:
    """Names a node with fewer GPUs than the profile is for (a culprit, the run fails), or
    than the other nodes of its model (a note: a cluster may mix node sizes). A lost GPU is
    otherwise invisible: busbw hardly moves from 8 GPUs to 7, and its node's rows are skipped
    by the floors' rule of ranks per node. Where NVML could not count a node's GPUs, its
    ranks did: fewer ranks may be a launch choice, so that is a note too."""
    def models(n: NodeFacts) -> tuple[str, ...]:
        return tuple(model for model, _ in n.gpus)

    # the most GPUs a node of each mix of models has, found once: asked node by node of every
    # node, it took a fifth of a second at 512 nodes, and grows as the square of them
    most_of: dict[tuple[str, ...], int] = {}
    for m in profile.nodes:
        key = models(m)
        most_of[key] = max(most_of.get(key, 0), m.count)
    want = profile.gpus_per_node
    for n in profile.nodes:
        if not n.gpus:
            continue
        if want and n.counted and n.count < want:
            line = (f"node {n.name} has {_listed(n)}, where {profile.name} is for {want} per "
                    "node: a GPU lost, or not passed through to it (a container, a VM)")
            judged.culprits.append(line)
            judged.short.append(line)
            continue
        most = most_of[models(n)]
        if n.count < most:
            judged.notes.append(
                f"node {n.name} has {_listed(n)} where its peers have {most}" + (
                    "" if n.counted else " (counted from its ranks: NVML cannot tell a lost GPU "
                    "from fewer ranks)"))


def _listed(n: NodeFacts) -> str:
    return ", ".join(f"{count} x {model}" for model, count in n.gpus)


def judge(results: list[Result], profile: Profile, names: list[str],
          baseline: Baseline | None = None) -> Judged:
    """The checks in the profile's order. A node that failed a node check is no healthy peer
    for the pair checks after it; this run's noise for a check is that of the checks up to it,
    so a check's verdicts do not change as later checks are measured."""
    judged = Judged([], names)
    _short_of_gpus(profile, judged)
    unhealthy: dict[int, list[str]] = {}
    spreads: list[float | None] = []
    for check in profile.checks:
        mine = [r for r in results if r.check.name == check.name]
        spreads += [r.spread for r in _first_measured(mine)]
        verdicts = _judge_check(check, mine, names, profile, baseline, noise.typical(spreads),
                                unhealthy if check.scope == "pair" else {})
        judged.verdicts += verdicts
        judged.checks.append(check)
        _settle(check, verdicts, names, judged)
        _coverage(check, verdicts, judged)
        if check.scope == "node":
            for v in verdicts:
                if v.verdict == "FAIL" and not v.result.retest:
                    for i in v.result.nodes:
                        unhealthy.setdefault(i, []).append(check.name)
    return judged
