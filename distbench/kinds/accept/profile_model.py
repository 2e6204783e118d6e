"""Acceptance profiles, what they hold: what `distbench accept` checks on one class of hardware,
read from configs/profiles/*.toml (the layout is in docs/accept-profiles.md). A profile lists
checks; each names a measurement (command, op or pattern, dtype, size), where it runs (each node
alone, pairs of nodes, or every rank), the metric judged and the expectation: absolute floors in
the metric's unit, each citing the public figure it comes from, or a fraction of what the healthy
peers reach.

The profiles' other modules: profile_files.py (where the built-ins are, and --profile's value
resolved to one), profile_toml.py (a file's TOML validated), profile_choice.py (--profile auto's
pick, and the profile every rank of a run agrees on).

No torch here: profiles are read and validated with the other options, before any worker
starts, so that a bad profile costs one line and exit code 2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

from distbench.core.contracts import MEASURES
from distbench.core.options import OptionError

EXAMPLE = "--profile h100-sxm-8"
AUTO = "auto"
# What auto picks when the snapshots decide nothing more specific.
CPU_PROFILE = "cpu-gloo"
GENERIC_PROFILE = "generic-gpu"

SCOPES = ("node", "pair", "cluster")
COMMANDS = ("collective", "p2p")
# The p2p patterns a check can measure (distbench p2p's matrix is a separate, per-link
# measurement with its own outlier judging).
P2P_PATTERNS = ("ring", "pingpong")
VS = ("absolute", "peers")

# metric -> the commands (and ops or patterns) that report it; None for a command: every op it
# has. The names are the columns of collective.csv and p2p.csv (core.contracts.MEASURES gives
# each one's unit and direction).
_REPORTED_BY = {
    "busbw_gbps": {"collective": None, "p2p": ("ring",)},
    "algbw_gbps": {"collective": None, "p2p": ("ring",)},
    # pingpong's time is one-way latency, half the round trip
    "time_us": {"collective": None, "p2p": ("ring", "pingpong")},
    "p99_us": {"collective": None, "p2p": ("ring", "pingpong")},
    # The median iteration: a burst of load from a neighbour slows some iterations, a fault
    # slows every one. For judging nodes against each other on shared machines (cpu-gloo);
    # blind to a link that stalls now and then, which the mean and p99 see.
    "p50_us": {"collective": None, "p2p": ("ring", "pingpong")},
    # busbw at the median iteration's time (not a CSV column: derived from p50_us)
    "p50_busbw_gbps": {"collective": None, "p2p": ("ring",)},
}
METRICS: dict[str, dict] = {
    name: {"unit": MEASURES[name].unit, "higher_is_better": MEASURES[name].higher_is_better,
           "commands": commands}
    for name, commands in _REPORTED_BY.items()}

DEFAULT_DTYPE = "float32"  # as --dtype


@dataclass(frozen=True)
class NodeFloors:
    """A cluster check's floors for clusters of `nodes` nodes: one row of the check's
    [[check.floors_by_nodes]], each citing the figure published for that many nodes."""

    nodes: int
    fail: float | None
    warn: float | None
    fail_no_nvls: float | None = None
    warn_no_nvls: float | None = None


class ProfileError(OptionError):
    """A profile that cannot be used: one line naming the file and the key, exit code 2."""

    def __init__(self, message: str, example: str = EXAMPLE):
        super().__init__("--profile", message, example)


@dataclass(frozen=True)
class ProfileCheck:
    """One measurement and what it must reach."""

    name: str  # unique within the profile; how the verdict names the check
    scope: str  # "node" (each node alone), "pair" (pairs of nodes) or "cluster" (all ranks)
    command: str  # "collective" or "p2p"
    op: str  # a registered collective op, or a p2p pattern: "ring" or "pingpong"
    dtype: str  # one of options.DTYPES, aliases resolved
    size: int  # bytes, as --sizes counts them for this command and op
    metric: str  # a key of METRICS valid for this command and op
    vs: str  # "absolute" (floors in the metric's unit) or "peers" (fractions, see fraction())
    # worse than fail: FAIL; worse than warn: WARN. Absolute: in the metric's unit (a bandwidth
    # below, a time above); peers: a fraction of the peers' value. None: no such line
    fail: float | None
    warn: float | None
    # an absolute check's floors where NCCL cannot use NVLink SHARP (NVLS): the 8 x H100
    # all_reduce figure is NVLS's, and a healthy node without it reaches the ring's. None: the
    # check's figure holds either way
    fail_no_nvls: float | None = None
    warn_no_nvls: float | None = None
    # a cluster check's floors by node count, ascending (then fail, warn and the floors without
    # NVLS above are None until for_nodes() picks a row): what a healthy cluster reaches across
    # its network changes with its size. (): the floors above hold at any size
    by_nodes: tuple[NodeFloors, ...] = ()

    @property
    def unit(self) -> str:
        return METRICS[self.metric]["unit"]

    def for_nodes(self, nodes: int) -> tuple[ProfileCheck, str, str]:
        """The check with the floors for a target of `nodes` nodes, with which row that is and
        any caveat, as a verdict's note says them (" for 4 nodes", "; extrapolated ...";
        both "" for a check without floors by node count). The row of that count, else of the
        nearest count above it (past two nodes a cluster's busbw does not grow as nodes are
        added, so a healthy cluster reaches at least the larger count's figure), else, beyond
        the table, its last row, which the caveat calls extrapolated."""
        if not self.by_nodes:
            return self, "", ""
        row = next((r for r in self.by_nodes if r.nodes >= nodes), None)
        caveat = ""
        if row is None:
            row = self.by_nodes[-1]
            caveat = f"; extrapolated to {nodes_text(nodes)}: none is given beyond {row.nodes}"
        elif row.nodes != nodes:
            caveat = f"; none is given for {nodes_text(nodes)}: the nearest count above"
        return (replace(self, fail=row.fail, warn=row.warn, fail_no_nvls=row.fail_no_nvls,
                        warn_no_nvls=row.warn_no_nvls, by_nodes=()),
                f" for {nodes_text(row.nodes)}", caveat)

    def floors(self, nvls: bool | None) -> ProfileCheck:
        """The check with the floors for NVLS in use (True), or not or unknown: where unknown
        it is judged by the figure without, so no healthy node fails for want of evidence."""
        if nvls or (self.fail_no_nvls is None and self.warn_no_nvls is None):
            return self
        return replace(self, fail=self.fail_no_nvls, warn=self.warn_no_nvls)

    @property
    def higher_is_better(self) -> bool:
        return METRICS[self.metric]["higher_is_better"]

    def fraction(self, value: float, reference: float) -> float:
        """How well `value` does against `reference` (the healthy peers' value, or a baseline
        run's), as a fraction where 1 is as good and below 1 is worse, whatever the metric's
        direction: a latency twice the peers' is 0.5. A peers check's fail and warn are such
        fractions."""
        if self.higher_is_better:
            return value / reference if reference > 0 else math.inf
        return reference / value if value > 0 else math.inf

    def grade(self, value: float, reference: float | None = None) -> str:
        """One of "fail", "warn" or "ok". `reference`: what the healthy peers reach, for a
        peers check (an absolute one ignores it)."""
        if self.vs == "peers":
            if reference is None:
                raise ValueError(f"check {self.name!r} is judged against its peers: "
                                 "give their value")
            value, better = self.fraction(value, reference), True
        else:
            better = self.higher_is_better
        for grade, floor in (("fail", self.fail), ("warn", self.warn)):
            if floor is not None and (value < floor if better else value > floor):
                return grade
        return "ok"


@dataclass(frozen=True)
class NodeFacts:
    """What is known of one node before anything is measured: --profile auto picks by it, and
    the verdicts judge by it (accept_profile.agree sends it to every rank with the profile)."""

    name: str  # as reports name the node (runtime.node_names)
    # (model, count), sorted: the GPUs of the models its ranks run on, as many as NVML lists
    # (it also sees those hidden from the run) or, where NVML lists fewer, as its ranks use;
    # without ranks to go by (profile_choice.pick_for_nodes on snapshots alone), NVML's list
    gpus: tuple[tuple[str, int], ...]
    # the counts are NVML's; False: NVML did not list them, so they are the ranks' (at least)
    counted: bool = True
    nvml_error: str | None = None
    nvls: bool | None = None  # whether NCCL can use NVLink SHARP there (topo's snapshot)
    nvls_why: str = "unknown"

    @property
    def count(self) -> int:
        return sum(n for _, n in self.gpus)


@dataclass(frozen=True)
class Profile:
    """One class of hardware and the checks its nodes must pass."""

    name: str  # what --profile takes; a built-in's is its file name without .toml
    description: str  # one line: the hardware, and any assumption the figures rest on
    path: Path  # the file it was read from
    match_gpu: str | None  # substring of the NVML GPU name (any case); None: no GPU or generic
    gpus_per_node: int | None  # None: any count; 0: nodes without a GPU
    iters: int  # timed iterations of every check, the same on every run so runs compare
    warmup: int  # untimed iterations before each check
    baseline_tolerance: float  # 0.05: a check worse than -5% against a --baseline run fails
    checks: tuple[ProfileCheck, ...]  # in the file's order, names unique
    # substrings of the NVML name that rule a GPU out although match_gpu is in it: "H200" is
    # also in "NVIDIA H200 NVL" (PCIe cards) and "NVIDIA GH200 480GB"
    match_exclude: tuple[str, ...] = ()
    # the nodes it runs on, by node index, once accept_profile.agree has learnt them; () when
    # only read from a file
    nodes: tuple[NodeFacts, ...] = ()

    def matches(self, gpu_name: str, count: int) -> bool:
        """Whether nodes of `count` GPUs named `gpu_name` are this profile's hardware."""
        name = gpu_name.lower()
        return (self.match_gpu is not None and self.match_gpu.lower() in name
                and not any(x.lower() in name for x in self.match_exclude)
                and self.gpus_per_node in (None, count))



def nodes_text(count: int) -> str:
    return f"{count} node" if count == 1 else f"{count} nodes"
