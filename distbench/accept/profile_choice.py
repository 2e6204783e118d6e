"""The profile every rank of `distbench accept` runs. Rank 0 resolves it: `--profile auto` picks
from what the ranks see (their GPUs, as torch names them, and how many per node), NVML's
snapshot counting them (profiles.pick_for_nodes); a name or a file is read there. Rank 0 then
sends its text, not its path, with what it knows of every node (profiles.NodeFacts: GPUs,
NVLS), and every rank parses that same text: a path resolved on each node reads another file,
or none, where the nodes differ. Apart from profiles.py so that the options are validated
without torch."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch.distributed as dist

from distbench.accept.profiles import (
    Profile,
    ProfileError,
    node_facts,
    parse,
    pick_for_nodes,
    resolve,
)
from distbench.core.exitcodes import EXIT_BAD_INPUT
from distbench.run.runtime import RunFailure

NAMED = "named on the command line"


def agree(rt, spec: str) -> tuple[Profile, str]:
    """Every rank: the profile rank 0 chose from `spec` (--profile: auto, a built-in's name or
    a file), with the nodes' facts, and one line saying why. A profile rank 0 cannot read is
    a RunFailure (exit 2) on every rank alike, so that none waits for a broadcast."""
    sent: list = [None]
    if rt.rank == 0:
        try:
            named = resolve(spec)
            profile, why = (pick_for_nodes(rt.snapshots, rt.ranks, rt.backend) if named is None
                            else (named, NAMED))
            nodes = profile.nodes or node_facts(rt.snapshots, rt.ranks)
            sent = [(str(profile.path), profile.path.read_text(encoding="utf-8"), why, nodes)]
        except (ProfileError, OSError) as e:
            sent = [str(e)]
    dist.broadcast_object_list(sent, src=0)
    if isinstance(sent[0], str):
        raise RunFailure(sent[0], status="bad_input", exit_code=EXIT_BAD_INPUT)
    path, text, why, nodes = sent[0]
    try:
        profile = parse(text, Path(path))
    except ProfileError as e:  # changed since rank 0 read it: every rank fails alike
        raise RunFailure(str(e), status="bad_input", exit_code=EXIT_BAD_INPUT) from None
    return replace(profile, nodes=nodes), why
