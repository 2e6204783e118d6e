"""The launcher's environment, read in one place: the env:// variables torchrun sets (or that
slurm_mpi.adopt derives from Slurm's and Open MPI's), and those distbench's own local launcher
hands its workers. Everything else asks here, so each variable's name and default is written
once."""

from __future__ import annotations

import json
import os
import sys

# What torch's env:// rendezvous needs: a process with all four runs as one rank.
TORCH_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# Set by distbench's local launcher for the workers it starts.
RUN_DIR_ENV = "DISTBENCH_RUN_DIR"  # the run directory it made
ARGV_ENV = "DISTBENCH_ARGV"  # the command line as the user typed it, as JSON
LAUNCHER_PID_ENV = "DISTBENCH_LAUNCHER_PID"  # its pid: workers end with it
# the host memory each worker may hold beyond a bare worker's (limits.rank_budget), in bytes
RANK_MEMORY_ENV = "DISTBENCH_RANK_MEMORY"
# Read by the local launcher: 0 starts CPU workers as fresh interpreters, as torchrun and GPU
# runs do, instead of forking them (run/forked_workers.py)
FORK_ENV = "DISTBENCH_FORK_WORKERS"


def under_launcher() -> bool:
    return all(k in os.environ for k in TORCH_VARS)


def fork_workers() -> bool:
    """Whether a local launcher with no GPU in play may fork its workers (the default)."""
    return os.environ.get(FORK_ENV, "1").strip() != "0"


def started_by_us() -> bool:
    """A worker distbench started itself (its launcher hands its workers the run directory)."""
    return RUN_DIR_ENV in os.environ


def given_run_dir() -> str | None:
    """The run directory our own launcher made, for a worker it started; else None."""
    return os.environ.get(RUN_DIR_ENV) or None


def rank_memory() -> int | None:
    """The host memory our own launcher gave each worker it started, in bytes; else None."""
    given = os.environ.get(RANK_MEMORY_ENV)
    return int(given) if given and started_by_us() else None


def user_argv() -> list[str]:
    """The command line as the user typed it: a worker we started runs resolved flags instead."""
    given = os.environ.get(ARGV_ENV)
    return json.loads(given) if given and started_by_us() else sys.argv[1:]


def rank_text() -> str:
    """This process's global rank as the launcher wrote it, "?" where none did."""
    return os.environ.get("RANK", "?")


def rank() -> int:
    """The global rank; -1 where the launcher wrote none or no number."""
    text = os.environ.get("RANK", "")
    return int(text) if text.isdigit() else -1


def reads_files() -> bool:
    """Rank 0, or no launcher: the rank that writes results, and so the one that reads what a
    run is compared with (a baseline, a profile file); on other nodes those paths need not
    exist."""
    return os.environ.get("RANK", "0") == "0"


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def local_world_size() -> int | None:
    """Ranks on this node, as the launcher says; None where it says nothing usable."""
    value = os.environ.get("LOCAL_WORLD_SIZE", "")
    return int(value) if value.isdigit() else None


def world_size() -> int | None:
    """The ranks the launcher started; None where it says nothing usable."""
    value = os.environ.get("WORLD_SIZE", "")
    return int(value) if value.isdigit() else None


def world_size_text() -> str:
    return os.environ.get("WORLD_SIZE", "?")


def node_rank() -> str:
    """The launcher's node rank (GROUP_RANK), "" where it gives none."""
    return os.environ.get("GROUP_RANK", "")


def store_address() -> str:
    """Where the launcher's store is, for people: MASTER_ADDR:MASTER_PORT."""
    return f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"


def restart_count() -> str:
    """How many times torchrun's agent has restarted the workers ("0" for any other launcher)."""
    return os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")


def agent_store() -> bool:
    """torchrun's agent hosts the store the ranks meet in (rank 0 does not)."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def launcher_pid() -> int:
    """Our own launcher's pid, handed to the workers it started; 0 for any other launcher."""
    value = os.environ.get(LAUNCHER_PID_ENV, "")
    return int(value) if value.isdigit() else 0
