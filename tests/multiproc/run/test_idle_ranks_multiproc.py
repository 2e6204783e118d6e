"""A rank that sits a ping-pong out, for real: it outlasts a loop longer than the timeout. The
ranks as threads: test_idle_ranks.py."""

from __future__ import annotations

import json
import os
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from helpers import free_port
from run_helpers import _settings

from distbench.bench import measure
from distbench.ops import p2p
from distbench.run.faults import Faults

PG_TIMEOUT_S = 2.0

DELAY_S = 0.4  # before each op of ranks 0 and 1: 10 ops, 4 s, twice the timeout


def _rank(rank: int, world: int, port: int, out: str) -> None:
    from distbench.run.peers import Peers

    store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0,
                          timeout=timedelta(seconds=30))
    peers = Peers(store, rank, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=PG_TIMEOUT_S))
    try:
        s = _settings(rank, peers, [], timeout=PG_TIMEOUT_S, check=True,
                      faults=Faults(delay_s=DELAY_S if rank < 2 else 0.0))
        buf = torch.empty(16)
        try:
            st = measure.measure_case(s, p2p.pingpong(rank, world, buf), "pingpong", 64, 0.5)
            seen = {"iters": st.iters, "wrong": st.wrong, "time_us": st.time_us,
                    "slowest": st.slowest_rank}
        except Exception as e:  # noqa: BLE001 - what the test reads
            seen = {"error": f"{type(e).__name__}: {str(e).splitlines()[0]}"}
        with open(f"{out}/{rank}.json", "w") as f:
            json.dump(seen, f)
    finally:
        os._exit(0)  # a rank whose peers failed must not wait in teardown


@pytest.mark.procs(4)  # 3 ranks, and multiprocessing's resource tracker
def test_the_odd_rank_of_a_pingpong_outlasts_a_loop_longer_than_the_timeout(tmp_path):
    """Three gloo ranks, ranks 0 and 1 ping-pong for 4 s with a 2 s process-group timeout: the
    odd rank used to enter the statistics' all_reduce at once and time out in it."""
    mp.start_processes(_rank, args=(3, free_port(), str(tmp_path)), nprocs=3,
                       start_method="spawn")
    seen = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(3)]
    for got in seen:
        assert "error" not in got, seen
        assert got["iters"] == 10 and got["wrong"] == 0 and got["slowest"] in (0, 1)
        assert got["time_us"] >= DELAY_S * 1e6 / 2  # one way of a round trip
    assert seen[0] == seen[1] == seen[2]
