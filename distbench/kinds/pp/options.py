"""`distbench pp`: pipeline-parallel training steps, the schedules side by side: step time,
measured and analytic bubble, bytes across stage boundaries, the scaling view and a check
against a single-rank reference."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from distbench.core.options import (
    OptionError,
    StepOptions,
    at_least,
    at_least_two,
    option,
    pick,
    redefault,
)
from distbench.steps.vocabulary import SCHEDULES

if TYPE_CHECKING:
    pass

HELP = "Pipeline-parallel step timing: schedules side by side, measured and analytic bubble."
EXAMPLES = (
    "distbench pp --workers 2",
    "distbench pp --schedule gpipe,1f1b --micro-batches 16 --workers 4",
)


@dataclass(kw_only=True)
class PPOptions(StepOptions):
    schedules: list[str] = option("all", f"{', '.join(SCHEDULES)}; comma list or 'all'.",
                                  flag="schedule",
                                  check=pick(SCHEDULES, "--schedule gpipe,1f1b"), cli_type=str)
    micro_batches: int = option(8, "Micro-batches per step (m).",
                                check=at_least(1, "--micro-batches 8"))
    virtual_stages: int = option(2, "Stages per rank for interleaved-1f1b (v).",
                                 check=at_least(1, "--virtual-stages 2"))
    seq_len: int = redefault(StepOptions, "seq_len", 128)
    layers: int = redefault(StepOptions, "layers", 8)

    def check_world(self, world: int) -> None:
        at_least_two("pp", world)
        stages = world * (self.virtual_stages if "interleaved-1f1b" in self.schedules else 1)
        if self.layers < stages:
            raise OptionError("--layers", f"{self.layers} layers cannot fill {stages} stages",
                              f"--layers {stages}")


