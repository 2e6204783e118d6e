"""NCCL's rules, held against what a run's ranks posted (distbench.run.comm_trace): gloo buffers
sends and forgives what NCCL does not, so a CPU run that passes proves little about a GPU run
unless what it posted is checked against NCCL's semantics:

- every rank of a group posts the same collectives in the same order, with the same sizes,
  dtypes and roots (a mismatch hangs NCCL or corrupts data; gloo may well finish);
- a send completes only once its peer has posted the matching receive, of the same size and
  dtype ("This operation is blocking for the GPU", NCCL's ncclSend);
- ops posted apart run in the order they were posted, one after the other; only the ops of one
  batch (batch_isend_irecv: ncclGroupStart/End) progress together ("If multiple ncclSend and
  ncclRecv operations need to progress concurrently to complete, they must be fused within a
  ncclGroupStart/ncclGroupEnd section").

`check` replays every rank's posts under those rules: a collective completes when every member
has reached it, a batch when each of its ops' partners has been posted; when no rank can move
and some have posts left, the run would hang on NCCL. The order is NCCL's documented contract,
stricter than what separate streams per pair of ranks may happen to allow.

A run that did not end as every rank agreed (a killed rank, a timeout) recorded only part of what
it would have posted: its ranks are held to the first rule on what they share, nothing more."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

P2P = ("send", "recv")


@dataclass
class RankTrace:
    rank: int
    events: list[dict]
    complete: bool = False
    world: int = 0
    groups: dict[str, list[int]] = field(default_factory=dict)
    alive: dict[str, list[int]] = field(default_factory=dict)


def read(where: Path) -> dict[int, RankTrace]:
    """Every rank's trace in `where` (rank<R>.jsonl); a rank that ended before writing one is
    missing."""
    out = {}
    for path in sorted(where.glob("rank*.jsonl")):
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        end = lines[-1] if lines and lines[-1].get("end") else {}
        rank = int(path.stem.removeprefix("rank"))
        out[rank] = RankTrace(rank, [e for e in lines if not e.get("end")],
                              bool(end.get("complete")), end.get("world", 0),
                              end.get("groups", {}), end.get("alive", {}))
    return out


def _collective(e: dict) -> tuple:
    return e["op"], e["bytes"], e["dtype"], e.get("root")


def _describe(e: dict) -> str:
    what = f"{e['op']} of {e['bytes']} B {e['dtype']}"
    if e["op"] in P2P:
        return f"{what} {'to' if e['op'] == 'send' else 'from'} rank {e['peer']}"
    return what + (f" from root {e['root']}" if e.get("root") is not None else "") + \
        f" on group {e['group']}"


def collective_order(traces: dict[int, RankTrace], world: int) -> list[str]:
    """Every group's members post the same collectives in the same order; for ranks whose run
    was cut short, on what they share."""
    members: dict[str, list[int]] = {}
    for t in traces.values():
        members.update(t.groups)
    seqs: dict[str, dict[int, list[dict]]] = {}
    for t in traces.values():
        for e in t.events:
            if e["op"] not in P2P:
                seqs.setdefault(e["group"], {}).setdefault(t.rank, []).append(e)
    problems = []
    for group, by_rank in seqs.items():
        ranks = members.get(group) or list(range(world))
        present = [r for r in ranks if r in traces]
        complete = all(traces[r].complete for r in present) and len(present) == len(ranks)
        base = min(present)
        for r in present:
            mine, theirs = by_rank.get(r, []), by_rank.get(base, [])
            n = max(len(mine), len(theirs)) if complete else min(len(mine), len(theirs))
            for i in range(n):
                a = theirs[i] if i < len(theirs) else None
                b = mine[i] if i < len(mine) else None
                if a is None or b is None or _collective(a) != _collective(b):
                    problems.append(
                        f"group {group} {ranks}: collective #{i + 1} is "
                        f"{_describe(a) if a else 'nothing'} on rank {base} but "
                        f"{_describe(b) if b else 'nothing'} on rank {r}")
                    break
    return problems


@dataclass
class _Item:
    rank: int
    index: int
    events: list[dict]  # one collective, or the sends and receives of one batch
    keys: list[tuple] = field(default_factory=list)  # each event's match key


def _items(t: RankTrace) -> list[_Item]:
    items: list[_Item] = []
    for e in t.events:
        batch = e.get("batch") if e["op"] in P2P else None
        last = items[-1] if items else None
        if batch is not None and last is not None and last.events[-1]["op"] in P2P \
                and last.events[-1].get("batch") == batch:
            last.events.append(e)
        else:
            items.append(_Item(t.rank, len(items), [e]))
    seen: Counter = Counter()
    for item in items:
        for e in item.events:
            if e["op"] == "send":
                k = ("p2p", e["group"], t.rank, e["peer"])
            elif e["op"] == "recv":
                k = ("p2p", e["group"], e["peer"], t.rank)
            else:
                k = ("coll", e["group"])
            seen[k] += 1
            item.keys.append((*k, seen[k]))
    return items


def deadlocks(traces: dict[int, RankTrace], world: int) -> list[str]:
    """The posts of every rank replayed under NCCL's rules (the module's text): what would hang,
    and sends and receives that pair up with different sizes or dtypes."""
    items = {r: _items(t) for r, t in traces.items()}
    members: dict[str, list[int]] = {}
    for t in traces.values():
        members.update(t.groups)
    sides: dict[tuple, dict[int, dict]] = {}  # a p2p key -> {rank: its event}
    for r, its in items.items():
        for item in its:
            for key, e in zip(item.keys, item.events, strict=True):
                if key[0] == "p2p":
                    sides.setdefault(key, {})[r] = e
    problems = []
    for key, by_rank in sides.items():
        _, group, src, dst, k = key
        send, recv = by_rank.get(src), by_rank.get(dst)
        if send is not None and recv is not None and \
                (send["bytes"], send["dtype"]) != (recv["bytes"], recv["dtype"]):
            problems.append(f"rank {src} sends {send['bytes']} B {send['dtype']} to rank {dst} "
                            f"(#{k} on group {group}), which receives {recv['bytes']} B "
                            f"{recv['dtype']}")
    at = {r: 0 for r in items}
    matched: set[tuple] = set()

    def current(r: int) -> _Item | None:
        return items[r][at[r]] if r in items and at[r] < len(items[r]) else None

    moved = True
    while moved:
        moved = False
        for r in items:
            item = current(r)
            if item is None:
                continue
            if item.keys[0][0] == "coll":  # every member at it: they all go past it together
                key = item.keys[0]
                group = members.get(key[1]) or list(range(world))
                if all((c := current(m)) is not None and key in c.keys for m in group):
                    for m in group:
                        at[m] += 1
                    moved = True
                continue
            for key in item.keys:  # a send and its receive pair once both are posted
                other = key[3] if key[2] == r else key[2]
                peer = current(other)
                if peer is not None and key in peer.keys:
                    matched.add(key)
            if all(key in matched for key in item.keys):
                at[r] += 1
                moved = True
    stuck = [(r, current(r)) for r in sorted(items) if current(r) is not None]
    if stuck:
        problems.append("would hang on NCCL: " + " | ".join(
            f"rank {r} waits at post #{item.index + 1} of {len(items[r])} "
            f"({'; '.join(map(_describe, item.events))})" for r, item in stuck))
    return problems


def check(where: Path) -> list[str]:
    """What in the traces under `where` breaks NCCL's rules (empty: nothing)."""
    traces = read(where)
    if not traces:
        return []
    world = max(max(t.world for t in traces.values()), max(traces) + 1)
    problems = collective_order(traces, world)
    if len(traces) == world and all(t.complete for t in traces.values()):
        problems += deadlocks(traces, world)
    return problems


def leaked_groups(where: Path) -> dict[int, dict[str, list[int]]]:
    """The process groups each rank still held when its run ended as every rank agreed, beside
    the default one: NCCL's communicators hold device memory until they are destroyed."""
    return {r: t.alive for r, t in read(where).items() if t.alive and t.complete}
