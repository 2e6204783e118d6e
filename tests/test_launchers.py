"""srun and mpirun without torchrun: their variables become the env:// ones. Unit tests of the
host-list expansion and the mapping, then real local launches with the variables set by hand,
the way Slurm and Open MPI set them: 2 ranks that must agree on the world (4 ranks placed
across 2 nodes, block and cyclic: test_placement.py)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from helpers import clean_env, distbench_lines, free_port, start

from distbench.core.options import OptionError
from distbench.platform.slurm_mpi import adopt, expand_nodelist, expand_tasks_per_node


@pytest.mark.parametrize("text,hosts", [
    ("gpu01", ["gpu01"]),
    ("gpu[01-03,07],login1", ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]),
    ("node-[8-10]-ib", ["node-8-ib", "node-9-ib", "node-10-ib"]),
    ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
    ("a[009-011],b", ["a009", "a010", "a011", "b"]),
])
def test_slurm_host_lists_expand_in_order(text, hosts):
    assert expand_nodelist(text) == hosts


def test_tasks_per_node_expand():
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert expand_tasks_per_node("8") == [8]


SLURM_TASK_3 = {  # srun -N 2 --ntasks-per-node 2, task 3: the second node's second task
    "SLURM_JOB_ID": "123456", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3",
    "SLURM_STEP_NUM_TASKS": "4", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
    "SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_JOB_NODELIST": "gpu[07-08]",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
}


def test_an_srun_task_becomes_an_env_rank():
    env = dict(SLURM_TASK_3)
    assert adopt(env) == "slurm"
    assert {k: env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")} == {
        "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1", "MASTER_ADDR": "gpu07", "MASTER_PORT": str(10000 + 123456 % 10000)}


def test_srun_cyclic_placement_keeps_each_tasks_node():
    """`srun -m cyclic`: task 2 is the first node's second task (tasks 0 and 2 on node 0), and
    its node is SLURM_NODEID's, not one counted from its rank."""
    env = {**SLURM_TASK_3, "SLURM_PROCID": "2", "SLURM_NODEID": "0", "SLURM_LOCALID": "1"}
    assert adopt(env) == "slurm"
    assert (env["RANK"], env["GROUP_RANK"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == (
        "2", "0", "1", "2")


def test_a_batch_script_is_not_a_rank_and_torchrun_wins():
    batch = {k: v for k, v in SLURM_TASK_3.items() if k != "SLURM_STEP_ID"}
    assert adopt(batch) is None and "RANK" not in batch  # one process: nothing to wait for
    under_torchrun = {**SLURM_TASK_3, "RANK": "5", "WORLD_SIZE": "8", "MASTER_ADDR": "h",
                      "MASTER_PORT": "29500"}
    assert adopt(under_torchrun) is None and under_torchrun["RANK"] == "5"  # srun torchrun


def test_mpirun_on_one_node_and_across_nodes():
    env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
           "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    assert adopt(env) == "mpirun" and (env["RANK"], env["MASTER_ADDR"]) == ("1", "127.0.0.1")
    across = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4",
              "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    with pytest.raises(OptionError, match="MASTER_ADDR"):
        adopt(across)
    assert adopt({**across, "MASTER_ADDR": "node01"}) == "mpirun"


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
