"""`distbench pp`'s runs: what each rank does under a launcher, and what runs here
without workers. torch is imported inside them, when a run starts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distbench.kinds.pp.output import OUTPUT

if TYPE_CHECKING:
    from distbench.run.session import Session


def run(s: Session) -> int:
    """Per rank, under a launcher."""
    from distbench.steps import pp

    return pp.run(s, OUTPUT)
