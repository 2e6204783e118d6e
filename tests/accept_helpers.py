"""Shared by accept's tests: the acceptance loop run on ranks as threads in the test's process
(accept_here), the cpu-gloo profile and what a run's accept.json says."""

from __future__ import annotations

import csv
import json
import random
import re
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist
from fake_group import ThreadWorld, on_threads
from fake_session import FakeSession, fake_runtime
from paths import REPO

from distbench.bench import series, timing
from distbench.core import noise
from distbench.core.accounting import buffer_of
from distbench.core.dtypes import element_bytes
from distbench.kinds.accept import acceptance
from distbench.kinds.accept import output as accept_output
from distbench.kinds.accept.profile_files import load
from distbench.results import writer
from distbench.run.console import Console
from distbench.run.runtime import RunFailure

# What a healthy op takes on this loaded 2-core machine: 0.3 ms, and anything up to ten times
# that (cpu-gloo's notes: one clean run's pairs spread over a tenfold range).
HEALTHY_US = 300.0

SPREAD = 9.9


# A bad NIC or cable, as test_accept.py's fault hook makes it: every rank of a slow node waits
# this long before every op it sends or receives in. Healthy gloo on this loaded 2-core machine
# takes 0.3 to 3.4 ms for a 1 MiB all_reduce: a slow node's targets fall to a thirtieth of the
# healthy ones at most, past cpu-gloo's fail line (a twentieth), and a hundredth as a rule.
SLOW_S = 0.1

NAMED = re.compile(r"node (\S+) (?:failed|is in all)")


class _World(ThreadWorld):
    """torch.distributed as acceptance.run calls it, among threads. A measurement's figures are
    synthetic: a healthy op anywhere in [1, SPREAD) x HEALTHY_US on a log scale, SLOW_S more
    where the measured ranks hold a slow one; drawn from the seed, the measurement's name and
    how many times this rank measured it, so every rank of a target draws the same, and a
    retest draws afresh."""

    def __init__(self, world: int, slow: set[int], seed: str):
        super().__init__(world)
        self.slow, self.seed = slow, seed
        # the process groups each rank holds (made and not yet destroyed), and how many it
        # made, destroyed and held at once at most; groups alive, anywhere, that the creation
        # call that just ended did not make
        self.lock = threading.Lock()
        self.held: list[list] = [[] for _ in range(world)]
        self.made, self.freed, self.most = [0] * world, [0] * world, [0] * world
        self.stale: list = []
        self.calls = [0] * world  # creation calls joined, member or not

    def new_subgroups_by_enumeration(self, lists, timeout=None):
        mine, subgroups = super().new_subgroups_by_enumeration(lists, timeout)
        rank = self.local.rank
        with self.lock:
            self.calls[rank] += 1
            if mine is not None:
                self.held[rank].append(mine)
                self.made[rank] += 1
                self.most[rank] = max(self.most[rank], len(self.held[rank]))
            # past the call's barrier every rank has released what it would: what is alive
            # now is this round's, or a group kept from another round
            this_round = {("group", tuple(r)) for r in lists}
            self.stale += [g for held in self.held for g in held if g not in this_round]
        return mine, subgroups

    def destroy_process_group(self, group=None) -> None:
        assert group is not None, "the default group destroyed by accept"
        with self.lock:
            self.held[self.local.rank].remove(group)  # ValueError: not held, or freed twice
            self.freed[self.local.rank] += 1

    def start(self, rank: int) -> None:
        super().start(rank)
        self.local.measured = Counter()

    def _stats(self, what: str, group) -> timing.Stats:
        self.local.measured[what] += 1
        rng = random.Random(f"{self.seed}/{what}/{self.local.measured[what]}")
        ranks = range(self.world) if group is None else group[1]
        op_us = HEALTHY_US * SPREAD ** rng.random() + (
            SLOW_S * 1e6 if self.slow & set(ranks) else 0.0)
        reps = tuple(op_us * (1 + 0.3 * rng.random()) for _ in range(noise.REPS))
        return timing.Stats(iters=5, time_us=op_us, rank_min_us=op_us, rank_max_us=op_us,
                            slowest_rank=0, p50_us=op_us, p99_us=2 * op_us, cv_pct=10.0,
                            wrong=0, reps_us=reps)

    def collective_once(self, m, op, dtype: str, size: int, ctx, what: str):
        lay = buffer_of(op.accounting, size, element_bytes(dtype), ctx.n)
        return lay, self._stats(what, ctx.group)

    def p2p_once(self, m, pattern: str, dtype: str, size: int, rank: int, n: int, what: str,
                 group=None):
        return buffer_of(series.SENDRECV, size, element_bytes(dtype), n), self._stats(what, group)


@dataclass
class Accepted:
    """One acceptance, as rank 0's files and every rank's ending say it went."""

    acc: dict  # accept.json
    rows: list[dict]  # accept.csv
    ends: list[tuple[str, int]]  # each rank's (status, exit code): run() returned or raised
    stdout: str  # rank 0's: the rows, and with a baseline the comparison
    stderr: str  # rank 0's
    world: _World  # what the ranks called

    def named(self) -> set[str]:
        return {m for line in self.acc["culprits"] for m in NAMED.findall(line)}


def _session(rank: int, ranks: list[dict], run_dir: Path, baseline: Path | None
             ) -> FakeSession:
    """Rank `rank`'s session; rank 0 owns the files, as a real one does."""
    chief = rank == 0
    return FakeSession(fake_runtime(rank, len(ranks), ranks=ranks), console=Console(chief),
                       run_dir=run_dir if chief else None,
                       record=writer.RunRecord(run_dir, "accept", {}, ["accept"])
                       if chief else None, command="accept",
                       profile="cpu-gloo", quick=False, timeout=60.0, strict=False,
                       baseline=str(baseline) if baseline else None)


def accept_here(monkeypatch, capsys, run_dir: Path, nodes: int, per_node: int, slow: list[int],
                host: str = "h", baseline: Path | None = None) -> Accepted:
    """The acceptance of cpu-gloo (--baseline `baseline`) on `nodes` nodes of `per_node` ranks,
    all on `host` as the tests run them, every rank of the `slow` nodes slowed both ways."""
    world = _World(nodes * per_node, {i * per_node + r for i in slow for r in range(per_node)},
                   seed=f"{nodes}x{per_node}-{slow}")
    world.patch(monkeypatch)
    monkeypatch.setattr(dist, "destroy_process_group", world.destroy_process_group)
    monkeypatch.setattr(series, "collective_once", world.collective_once)
    monkeypatch.setattr(series, "p2p_once", world.p2p_once)
    ranks = [{"rank": r, "node": r // per_node, "local_rank": r % per_node, "host": host,
              "device": "cpu"} for r in range(nodes * per_node)]
    capsys.readouterr()

    def rank(r: int) -> tuple[str, int]:
        world.start(r)
        s = _session(r, ranks, run_dir, baseline)
        try:
            return "ok", acceptance.run(s, accept_output.OUTPUT)
        except RunFailure as e:
            return e.status, e.exit_code
        finally:
            s.close_sinks()  # as the session closes them, however the run ends

    ends = on_threads(world.world, rank, world.barrier)
    with open(run_dir / "accept.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    said = capsys.readouterr()
    return Accepted(json.loads((run_dir / "accept.json").read_text()), rows, ends, said.out,
                    said.err, world)


PROFILE = load(REPO / "configs" / "profiles" / "cpu-gloo.toml")

CHECKS = [c.name for c in PROFILE.checks]


def _accept_json(run_dir: Path) -> dict | None:
    try:
        return json.loads((run_dir / "accept.json").read_text())
    except (OSError, ValueError):
        return None
