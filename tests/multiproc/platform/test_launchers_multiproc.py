"""srun's and mpirun's variables on real local launches, set by hand the way Slurm and Open MPI
set them. The host-list expansion and the mapping: test_launchers.py."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from helpers import clean_env, distbench_lines, free_port, start


def _fake_slurm(rank: int, port: int) -> dict[str, str]:
    return {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_PROCID": str(rank),
            "SLURM_STEP_NUM_TASKS": "2", "SLURM_LOCALID": str(rank), "SLURM_NODEID": "0",
            "SLURM_STEP_NODELIST": "localhost", "SLURM_STEP_TASKS_PER_NODE": "2",
            "MASTER_PORT": str(port)}


def _fake_mpirun(rank: int, port: int) -> dict[str, str]:
    # Open MPI's NODE_RANK is a process's rank among those on its node, as LOCAL_RANK is
    return {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": "2",
            "OMPI_COMM_WORLD_LOCAL_RANK": str(rank), "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
            "OMPI_COMM_WORLD_NODE_RANK": str(rank), "MASTER_PORT": str(port)}


@pytest.mark.procs(2)
@pytest.mark.parametrize("fake", [_fake_slurm, _fake_mpirun], ids=["srun", "mpirun"])
def test_two_ranks_started_by_hand_agree_on_the_world(tmp_path, fake):
    port = free_port()
    procs = [start(["collective", "--sizes", "4K", "--iters", "2", "--warmup", "1",
                    "--timeout", "60", "--out", str(tmp_path)], tmp_path,
                   clean_env(**fake(rank, port))) for rank in (0, 1)]
    done = [p.communicate(timeout=120) for p in procs]
    for p, (_, err) in zip(procs, done, strict=True):
        assert p.returncode == 0, err
        assert not [x for x in distbench_lines(err) if "error" in x], err
    (run_dir,) = [d for d in Path(tmp_path).iterdir() if d.is_dir()]
    meta = json.loads((run_dir / "run.json").read_text())
    assert (meta["status"], meta["world_size"], meta["nnodes"]) == ("ok", 2, 1)
    assert [(r["rank"], r["local_rank"], r["host"]) for r in meta["ranks"]] == [
        (0, 0, socket.gethostname()), (1, 1, socket.gethostname())]
    rows = (run_dir / "collective.csv").read_text().splitlines()
    assert len(rows) == 2 and ",2,1,4096," in rows[1]  # world_size 2, one node, the row


def _fake_mpirun_of(world: int):
    def fake(rank: int, port: int) -> dict[str, str]:
        return {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(world),
                "OMPI_COMM_WORLD_LOCAL_RANK": str(rank),
                "OMPI_COMM_WORLD_LOCAL_SIZE": str(world),
                "OMPI_COMM_WORLD_NODE_RANK": str(rank),
                "MASTER_PORT": str(port)}
    return fake


@pytest.mark.procs(3)
def test_a_rank_refusing_its_options_where_rank_0_holds_the_store(tmp_path):
    """No launcher agent: rank 0 hosts the store itself. Rank 2 of 3 was given a misspelt
    dtype: every rank ends with exit 2 and no traceback, rank 0 last (the others must read
    why before its store goes)."""
    port, fake = free_port(), _fake_mpirun_of(3)
    base = ["collective", "--sizes", "4K", "--iters", "2", "--timeout", "30", "--out",
            str(tmp_path)]
    procs = [start(base + (["--dtype", "flaot32"] if rank == 2 else []), tmp_path,
                   clean_env(**fake(rank, port))) for rank in range(3)]
    done = [p.communicate(timeout=120) for p in procs]
    for p, (_, err) in zip(procs, done, strict=True):
        assert p.returncode == 2, err
        assert "Traceback" not in err and "Exception raised from" not in err, err
    # one node: its local rank 0 says it, once
    assert distbench_lines(done[0][1]) == [
        f"distbench: error: node {socket.gethostname()} (node rank 0) refused the options: "
        "--dtype: unknown "
        "value 'flaot32' (valid: float32, float16, bfloat16, float64, int32, int64, int8, "
        "uint8, all) (example: --dtype float32,bfloat16)"]
    assert distbench_lines(done[1][1]) == distbench_lines(done[2][1]) == []
    assert not [d for d in Path(tmp_path).iterdir() if d.is_dir()]
