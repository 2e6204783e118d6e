"""srun and mpirun without torchrun: their variables become the env:// ones. Unit tests of the
host-list expansion and the mapping, then real local launches with the variables set by hand,
the way Slurm and Open MPI set them: 2 ranks that must agree on the world (4 ranks placed
across 2 nodes, block and cyclic: test_placement.py).
The tests that start processes: test_launchers_multiproc.py."""

from __future__ import annotations

import pytest

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
