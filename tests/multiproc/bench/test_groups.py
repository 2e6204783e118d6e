"""Measurements on a group of ranks (a node, a pair of nodes), several groups at once: every
registered collective, a root that is a group rank, and a p2p link, each checked and timed in
two groups of two out of four gloo processes, concurrently. What each rank saw is written to a
file and checked here."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from helpers import free_port

from distbench.bench.measure import Settings, measure_case
from distbench.ops import p2p
from distbench.ops.collectives import OPS, Ctx

pytestmark = pytest.mark.multiproc

CPU = torch.device("cpu")
COUNT = 64  # elements per rank


def _settings():
    return Settings(device=CPU, phase=lambda what, seconds: None, timeout=60, warmup=1, iters=3,
                    min_time=0.0, check=True, cuda_graph=False, reps=3)


def _on(rank: int, world: int, port: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        halves = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank makes both
        group = halves[rank // 2]
        me, n = dist.get_rank(group), dist.get_world_size(group)
        seen = {}
        for name, op in OPS.items():
            ctx = Ctx(me, n, root=1, redop="sum", in_place=op.placements[0], group=group)
            inp = torch.empty(op.elements(op.in_mult, COUNT, n) or 1)
            outb = torch.empty(op.elements(op.out_mult, COUNT, n) or 1)
            st = measure_case(_settings(), op.build(ctx, inp, outb, COUNT), name, COUNT * 4,
                              group=group)
            seen[name] = {"wrong": st.wrong, "iters": st.iters, "slowest": st.slowest_rank}
        send, recv = torch.empty(COUNT), torch.empty(COUNT)
        link = p2p.one_link(me, 0, 1, True, send, recv, group)
        st = measure_case(_settings(), link, "link", COUNT * 4, group=group)
        seen["link"] = {"wrong": st.wrong, "iters": st.iters, "slowest": st.slowest_rank}
        with open(f"{out}/{rank}.json", "w") as f:
            json.dump(seen, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.procs(5)  # 4 ranks, and multiprocessing's resource tracker
def test_two_groups_measure_at_once_each_among_its_own_ranks(tmp_path):
    mp.spawn(_on, args=(4, free_port(), str(tmp_path)), nprocs=4)
    seen = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(4)]
    assert set(seen[0]) == {*OPS, "link"}
    for rank in range(4):
        for name, got in seen[rank].items():
            # checked data right in each group; a group's statistics are its own (2 ranks)
            assert got["wrong"] == 0, (rank, name)
            assert got["iters"] == 3 and got["slowest"] in (0, 1), (rank, name)
    assert seen[0] == seen[1] and seen[2] == seen[3]  # the ranks of a group agree
