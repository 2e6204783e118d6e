"""Launchers other than torchrun: `srun distbench ...` under Slurm and `mpirun distbench ...`
under Open MPI start one process per rank without the env:// variables torch reads. Their own
variables say the same things; `adopt` sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
GROUP_RANK, MASTER_ADDR and MASTER_PORT from them, so the rest of distbench sees a launcher as
under torchrun. Rank 0 then hosts the rendezvous store itself. No torch here, and no
`scontrol`: Slurm's compressed host lists are expanded in Python."""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import MutableMapping

from distbench.core.options import OptionError
from distbench.platform.env import TORCH_VARS

DEFAULT_PORT = 29500


def expand_nodelist(text: str) -> list[str]:
    """Slurm's compressed host list, in order: "gpu[01-03,07],login1" -> gpu01, gpu02, gpu03,
    gpu07, login1; several bracket groups in one name expand as a product."""
    hosts: list[str] = []
    for name in _split_top_level(text.strip()):
        parts = re.split(r"(\[[^\]]*\])", name)
        choices = [_expand_range(p[1:-1]) if p.startswith("[") else [p] for p in parts if p]
        hosts.extend("".join(combo) for combo in itertools.product(*choices))
    return hosts


def _split_top_level(text: str) -> list[str]:
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            out.append(text[start:i])
            start = i + 1
    out.append(text[start:])
    return [s for s in out if s]


def _expand_range(body: str) -> list[str]:
    """"01-03,07" -> 01, 02, 03, 07 (zero padding kept)."""
    out = []
    for item in body.split(","):
        low, _, high = item.partition("-")
        if not high:
            out.append(low)
            continue
        width = len(low) if low.startswith("0") else 0
        out.extend(str(i).zfill(width) for i in range(int(low), int(high) + 1))
    return out


def expand_tasks_per_node(text: str) -> list[int]:
    """SLURM_STEP_TASKS_PER_NODE: "2(x3),1" -> 2, 2, 2, 1."""
    out = []
    for item in text.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if m:
            out.extend([int(m.group(1))] * int(m.group(2) or 1))
    return out


def _slurm(env: MutableMapping[str, str]) -> dict[str, str] | None:
    # SLURM_STEP_ID: inside an srun step. A batch script sees SLURM_PROCID and SLURM_NTASKS
    # too, but it is one process: taking those would wait for ranks that never come.
    if "SLURM_STEP_ID" not in env or "SLURM_PROCID" not in env:
        return None
    world = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS", "1")
    nodes = expand_nodelist(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", ""))
    node = int(env.get("SLURM_NODEID", "0"))
    per_node = expand_tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE")
                                     or env.get("SLURM_TASKS_PER_NODE", ""))
    # one port per job, below Linux's ephemeral range, the same on every task
    port = env.get("MASTER_PORT") or str(10000 + int(env.get("SLURM_JOB_ID", "0")) % 10000)
    return {"RANK": env["SLURM_PROCID"], "WORLD_SIZE": world,
            "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
            "LOCAL_WORLD_SIZE": str(per_node[node]) if node < len(per_node) else "1",
            "GROUP_RANK": str(node),
            "MASTER_ADDR": env.get("MASTER_ADDR") or (nodes[0] if nodes else "127.0.0.1"),
            "MASTER_PORT": port}


def _open_mpi(env: MutableMapping[str, str]) -> dict[str, str] | None:
    if "OMPI_COMM_WORLD_RANK" not in env:
        return None
    world = env.get("OMPI_COMM_WORLD_SIZE", "1")
    local_world = env.get("OMPI_COMM_WORLD_LOCAL_SIZE", world)
    addr = env.get("MASTER_ADDR")
    if addr is None:
        if local_world != world:  # ranks on several nodes: only the user knows rank 0's host
            raise OptionError("MASTER_ADDR", "mpirun across nodes needs rank 0's host name",
                              "mpirun -x MASTER_ADDR=node01 -x MASTER_PORT=29500 distbench ...")
        addr = "127.0.0.1"
    return {"RANK": env["OMPI_COMM_WORLD_RANK"], "WORLD_SIZE": world,
            "LOCAL_RANK": env.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            "LOCAL_WORLD_SIZE": local_world,
            # Open MPI has no node index (OMPI_COMM_WORLD_NODE_RANK is a process's rank among
            # those on its node): one value for all, so ranks group into nodes by machine
            "GROUP_RANK": "0",
            "MASTER_ADDR": addr, "MASTER_PORT": env.get("MASTER_PORT", str(DEFAULT_PORT))}


def adopt(env: MutableMapping[str, str] = os.environ) -> str | None:
    """Under srun or mpirun (and not torchrun, whose variables win), set the env:// variables
    from the launcher's own; the launcher's name, or None. Raises OptionError when they cannot
    say enough (mpirun across nodes without MASTER_ADDR)."""
    if all(k in env for k in TORCH_VARS):
        return None
    for name, read in (("slurm", _slurm), ("mpirun", _open_mpi)):
        found = read(env)
        if found is not None:
            env.update(found)
            return name
    return None
