"""`distbench accept`'s runs: what each rank does under a launcher, and what runs here
without workers. torch is imported inside them, when a run starts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distbench.kinds.accept.options import AcceptOptions
from distbench.kinds.accept.output import OUTPUT
from distbench.platform import env

if TYPE_CHECKING:
    from distbench.run.session import Session


def dry_run(opts: AcceptOptions) -> int:
    """The plan, on this machine alone: the same planning code the run uses (itinerary.py),
    on a cluster of the size given."""

    from distbench.core.exitcodes import EXIT_OK
    from distbench.kinds.accept import itinerary
    from distbench.kinds.accept.profile_files import resolve

    if not env.reads_files():  # under a launcher: one rank says it
        return EXIT_OK
    spec = opts.profile
    if spec == "auto":
        spec = "generic-gpu"
        print("distbench: auto picks a profile from the GPUs it finds, and a dry run has "
              "none: planning generic-gpu (name one with --profile)")
    profile = resolve(spec)
    route = itinerary.make(profile, itinerary.Cluster.uniform(
        opts.nodes, opts.gpus_per_node), opts.quick)
    unjudged = _floors_not_judged(profile, opts.gpus_per_node)
    if unjudged:
        print(f"distbench: warning: {unjudged}")
    print("\n".join(itinerary.lines(route)))
    return EXIT_OK


def _floors_not_judged(profile, per_node: int) -> str:
    """What a dry run must say before its plan when the profile's floors are for another node
    size: the run would measure those checks and skip each row (accept.verdicts), never pass it;
    an operator should learn that before booking the nodes, not from the verdict."""
    want = profile.gpus_per_node
    absolute = [c.name for c in profile.checks if c.vs == "absolute"]
    if not want or want == per_node or not absolute:
        return ""
    return (f"{profile.name}'s floors are for {want} GPUs per node, and at {per_node} ranks "
            f"per node its {len(absolute)} checks against them ({', '.join(absolute)}) are "
            "planned but will not be judged: each row a SKIP, never a pass")


def run(s: Session) -> int:
    """Per rank, under a launcher."""
    from distbench.kinds.accept import acceptance

    return acceptance.run(s, OUTPUT)
