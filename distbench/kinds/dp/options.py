"""`distbench dp`: data-parallel training steps through torch's own APIs (DDP, DDP with
ZeroRedundancyOptimizer, FSDP2 without and with resharding after forward), side by side: step
time, the same work with the communication removed, the same collectives alone, how much of
them hid behind compute, bytes per step, the state each rank holds and a check against a
single-rank reference."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from distbench.core.options import (
    OptionError,
    StepOptions,
    at_least,
    one_of,
    option,
    pick,
    redefault,
    with_choices,
    with_example,
)
from distbench.platform import env
from distbench.steps.vocabulary import BLOCKS, FSDP, MODES

if TYPE_CHECKING:
    pass

HELP = ("Data-parallel step timing: DDP buckets, ZeRO-1, FSDP2 as ZeRO-2/3; exposed "
        "communication and memory per rank.")
EXAMPLES = (
    "distbench dp --workers 2",
    "distbench dp --mode ddp --bucket-cap-mb 1,5,25,100",
)


def _modes(option_name: str, text) -> list[str]:
    if str(text).strip().lower() == "all":  # the modes, not the fsdp alias beside them
        return list(MODES)
    return pick((*MODES, FSDP), "--mode ddp,zero3")(option_name, text)


# DDP takes the bucket as a 64-bit byte count; past it torch refuses the constructor's
# arguments in every worker. A bucket larger than the model is one bucket all the same.
MAX_BUCKET_MB = 2**20


def _bucket_sizes(option_name: str, text) -> list[float]:
    example = "--bucket-cap-mb 1,25,100"
    out: list[float] = []
    for part in str(text).split(","):
        try:
            value = float(part)
        except ValueError:
            raise OptionError(option_name, f"{part.strip()!r} is not a number of MiB",
                              example) from None
        if not (value > 0 and math.isfinite(value)):
            raise OptionError(option_name, f"must be above 0 MiB, got {part.strip()}", example)
        if value > MAX_BUCKET_MB:
            raise OptionError(option_name, f"must be at most {MAX_BUCKET_MB} MiB (1 TiB: one "
                              f"bucket holds the whole model long before), got {part.strip()}",
                              example)
        if f"{value:g}" not in [f"{v:g}" for v in out]:  # rows are named by the :g form
            out.append(value)
    return out


with_choices(with_example(_modes, "--mode ddp,zero3"), (*MODES, FSDP, "all"), many=True)
with_example(_bucket_sizes, "--bucket-cap-mb 1,25,100")


@dataclass(kw_only=True)
class DPOptions(StepOptions):
    modes: list[str] = option(
        "all", f"{', '.join(MODES)} or {FSDP} (zero3, or zero2 with --reshard-after-forward "
        "false); comma list or 'all'.", flag="mode", check=_modes, cli_type=str)
    bucket_cap_mb: list[float] = option(
        "25", "DDP's gradient bucket size in MiB; a comma list gives one ddp row each (zero1 "
        "takes the first).", check=_bucket_sizes, cli_type=str)
    reshard_after_forward: str = option(
        "true", "What --mode fsdp runs: true (zero3) or false (zero2).",
        check=one_of(("true", "false"), "--reshard-after-forward false"))
    block: str = option("mlp", "mlp or attention: what each of the --layers blocks is.",
                        check=one_of(BLOCKS, "--block attention"))
    ffn_size: int = option(2048, "MLP inner size.", check=at_least(1, "--ffn-size 2048"))
    heads: int = option(8, "Attention heads.", check=at_least(1, "--heads 8"))
    hidden_size: int = redefault(StepOptions, "hidden_size", 512)
    seq_len: int = redefault(StepOptions, "seq_len", 128)
    layers: int = redefault(StepOptions, "layers", 4)

    def validate(self) -> None:
        fsdp = "zero3" if self.reshard_after_forward == "true" else "zero2"
        self.modes = list(dict.fromkeys(fsdp if m == FSDP else m for m in self.modes))
        if self.block == "attention" and self.hidden_size % self.heads:
            raise OptionError("--heads", f"{self.heads} heads do not divide --hidden-size "
                              f"{self.hidden_size}", "--heads 8 --hidden-size 512")

    def host_bytes(self, backend: str, world: int) -> int:
        if backend == "nccl":
            return 0
        from distbench.steps.dp_formulas import need_per_rank

        return max(need_per_rank(self, m, world) for m in self.modes)

    def check_backend(self, backend: str) -> None:
        self._backend = backend  # the fit check needs the world size too: check_world's

    def check_world(self, world: int) -> None:
        """A model that cannot fit is refused before any worker starts: the largest of the
        modes' state, compute-only replica and replay buffers, plus the activations, against a
        GPU's memory or this machine's share per local rank. Needs the backend (check_backend
        runs first wherever both are known)."""
        backend = getattr(self, "_backend", None)
        if backend is None:
            return
        from distbench.steps.dp_formulas import capacity_per_rank, need_per_rank

        mode, need = max(((m, need_per_rank(self, m, world)) for m in self.modes),
                         key=lambda item: item[1])
        have, where = capacity_per_rank(backend, self.workers or env.local_world_size())
        if have is not None and need > have:
            raise OptionError("--hidden-size", f"{mode} on {world} ranks needs about "
                              f"{need / 2**30:.1f} GiB per rank for this model (--hidden-size, "
                              f"--ffn-size, --layers, --micro-batch-size, --seq-len); {where} "
                              f"has {have / 2**30:.1f} GiB per rank",
                              "--hidden-size 512 --layers 4")


