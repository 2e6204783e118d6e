"""`distbench step`'s runs: what each rank does under a launcher, and what runs here
without workers. torch is imported inside them, when a run starts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distbench.kinds.step.options import layouts_of, model_of
from distbench.kinds.step.output import OUTPUT

if TYPE_CHECKING:
    from distbench.run.session import Session


def run(s: Session) -> int:
    """Per rank, under a launcher."""
    from distbench.steps import step3d

    layouts, notes = layouts_of(s.opts, s.rt.world)
    return step3d.run(s, OUTPUT, model_of(s.opts), layouts, notes)
