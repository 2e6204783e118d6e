"""`distbench accept`: cluster acceptance. A hardware profile's checks run in one launch: node
checks on every node at once, pair checks on disjoint pairs of nodes at once (round-robin),
cluster checks on every rank. Each result is judged against the profile's expectation (a floor,
or what the healthy peers reach) or a baseline run; the verdict is a table, accept.json and
accept.md, and the bad node is named."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from distbench.core.options import (
    OptionError,
    RunOptions,
    at_least,
    option,
    require,
    with_example,
)
from distbench.platform import env

if TYPE_CHECKING:
    pass

HELP = "Cluster acceptance: a hardware profile's checks, a verdict, and the bad node named."
EXAMPLES = (
    "distbench accept                # the profile picked from the GPUs",
    "distbench accept --profile h100-sxm-8 --baseline results/<run>",
    "distbench accept --dry-run --nodes 128 --gpus-per-node 8 --profile h100-sxm-8",
)

# What a dry run plans at most. It makes no target, but it counts every round of every check
# (N - 1 per pair check) and lists every rank: 100000 nodes of 8 GPUs, 800000 ranks, plan in
# about 2 s on a 2-core machine, and no cluster built is as large.
MAX_NODES = 100_000
MAX_RANKS = 2**20


def _profile(option_name: str, value) -> str:
    """A profile named on the command line is loaded and validated now, before any worker
    starts; auto is decided once the topology is known."""
    from distbench.kinds.accept.profile_files import resolve

    spec = str(value).strip()
    if spec != "auto" and env.reads_files():
        resolve(spec)  # raises ProfileError (an OptionError) naming the file and the key
    return spec


with_example(_profile, "--profile auto")


def _baseline(option_name: str, value) -> str | None:
    if value is None:
        return None
    from distbench.kinds.accept.files import read_baseline

    path = Path(str(value))
    if not env.reads_files():
        return str(path)
    if not path.is_dir():  # "no accept.json in" a directory that is not there misleads
        raise OptionError(option_name, f"{str(path)!r} is no directory (a previous distbench "
                          "accept run directory)", "--baseline results/<run>")
    if not (path / "accept.json").is_file():
        raise OptionError(option_name, f"no accept.json in {str(path)!r} (a previous "
                          "distbench accept run directory)", "--baseline results/<run>")
    try:
        read_baseline(path)  # read whole now: a broken file must not end a finished run
    except ValueError as e:
        raise OptionError(option_name, str(e), "--baseline results/<run>") from None
    return str(path)


with_example(_baseline, "--baseline results/<run>")

_fewest_nodes = at_least(1, "--nodes 128", optional=True)
_most_nodes = require(
    lambda v: v <= MAX_NODES, f"must be at most {MAX_NODES}, got {{value}}: a dry run counts "
    f"each round of every check (N - 1 per pair check), and {MAX_NODES} nodes, more than any "
    "cluster built, plan in seconds", "--nodes 128", optional=True)
_nodes = with_example(lambda option, value: _most_nodes(option, _fewest_nodes(option, value)),
                      "--nodes 128")


def _profiles_help() -> str:
    from distbench.kinds.accept.profile_files import available

    return ("auto (from each node's GPUs), a built-in profile, or a profile file. Built in: "
            + ", ".join(available()) + ".")


@dataclass(kw_only=True)
class AcceptOptions(RunOptions):
    profile: str = option("auto", _profiles_help, check=_profile)
    baseline: str | None = option(
        None, "A previous accept run directory: its figures are the expectation, and worse by "
        "more than the profile's tolerance fails.", check=_baseline, cli_type=str,
        show_default=False)
    quick: bool = option(False, "Pair checks in one round (even nodes with odd ones) instead "
                         "of every pair.")
    strict: bool = option(False, "Exit 4 on a warning too, not only on a failure.")
    dry_run: bool = option(False, "Print the plan (checks, rounds, process groups, an estimate "
                           "of the wall time) for --nodes nodes of --gpus-per-node GPUs, and "
                           "exit: no worker starts, no file is written.")
    nodes: int | None = option(None, f"Nodes to plan for, with --dry-run (at most {MAX_NODES}).",
                               check=_nodes, show_default=False)
    gpus_per_node: int | None = option(
        None, f"Ranks (GPUs) per node to plan for, with --dry-run (at most {MAX_RANKS} ranks "
        "in all).",
        check=at_least(1, "--gpus-per-node 8", optional=True), show_default=False)

    def validate(self) -> None:
        example = "--dry-run --nodes 128 --gpus-per-node 8 --profile h100-sxm-8"
        if self.dry_run:
            for name, value in (("--nodes", self.nodes), ("--gpus-per-node", self.gpus_per_node)):
                if value is None:
                    raise OptionError(name, "a dry run plans for a cluster: give its size",
                                      example)
        elif self.nodes is not None or self.gpus_per_node is not None:
            flag = "--nodes" if self.nodes is not None else "--gpus-per-node"
            raise OptionError(flag, "only plans a cluster, with --dry-run (a real run takes "
                              "its size from the launcher)", example)
        if self.dry_run and self.nodes * self.gpus_per_node > MAX_RANKS:
            raise OptionError("--gpus-per-node", f"{self.nodes} nodes of {self.gpus_per_node} "
                              f"are {self.nodes * self.gpus_per_node} ranks, and a dry run "
                              f"plans at most {MAX_RANKS}: it lists every rank, and "
                              f"{MAX_NODES} nodes of 8 GPUs, more than any cluster built, are "
                              f"{MAX_NODES * 8}", example)
        if self.dry_run:
            self._check_sizes(self.nodes * self.gpus_per_node, self.gpus_per_node,
                              f"--nodes {self.nodes} --gpus-per-node {self.gpus_per_node}")

    def check_world(self, world: int) -> None:
        if self.dry_run:  # it plans for --nodes and --gpus-per-node, which validate() saw to
            return
        if env.under_launcher():
            # each node's ranks are known to every rank alike only once the group exists: the
            # node and pair checks are held to the fewest ranks that measure, the cluster's to
            # the world
            self._check_sizes(world, None, f"the launch's {world} ranks")
        else:
            self._check_sizes(world, world, f"{world} local workers, one machine")

    def _check_sizes(self, world: int, per_node: int | None, how: str) -> None:
        """A named profile's sizes against the ranks each check will run on: too small, every
        target would be skipped at run time. auto picks a built-in once the GPUs are known."""
        from distbench.kinds.accept.profile_files import resolve
        from distbench.kinds.accept.profile_toml import check_sizes

        profile = resolve(self.profile) if env.reads_files() else None
        if profile is not None:
            check_sizes(profile, world, per_node, how)


