"""`distbench tp`: forward+backward of Megatron-style tensor-parallel blocks (MLP, attention),
sharded over every rank; step time, compute-only time, exposed communication, the scaling view
and a check against a single-rank reference."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from distbench.core.options import (
    OptionError,
    StepOptions,
    at_least,
    option,
    pick,
    with_choices,
)
from distbench.steps.vocabulary import BLOCKS

if TYPE_CHECKING:
    pass

HELP = "Tensor-parallel step timing: Megatron-style MLP and attention blocks, forward+backward."
EXAMPLES = (
    "distbench tp --workers 2",
    "distbench tp --block mlp --hidden-size 4096 --ffn-size 16384 --dtype bf16",
)


def _blocks(option_name: str, text) -> list[str]:
    if str(text).strip().lower() == "both":
        return list(BLOCKS)
    return pick(BLOCKS, "--block both")(option_name, text)


with_choices(_blocks, (*BLOCKS, "both"), many=True)


@dataclass(kw_only=True)
class TPOptions(StepOptions):
    blocks: list[str] = option("both", "mlp, attention or both.", flag="block", check=_blocks,
                               cli_type=str)
    ffn_size: int = option(4096, "MLP inner size.", check=at_least(1, "--ffn-size 4096"))
    heads: int = option(16, "Attention heads.", check=at_least(1, "--heads 16"))

    def validate(self) -> None:
        if self.hidden_size % self.heads:
            raise OptionError("--heads", f"{self.heads} heads do not divide --hidden-size "
                              f"{self.hidden_size}", "--heads 16 --hidden-size 1024")

    def check_world(self, world: int) -> None:
        if self.heads % world:
            raise OptionError("--heads", f"{self.heads} heads do not split over {world} ranks",
                              f"--heads {world * 4}")
        if self.ffn_size % world:
            raise OptionError("--ffn-size", f"{self.ffn_size} does not split over {world} "
                              "ranks", f"--ffn-size {world * 1024}")


