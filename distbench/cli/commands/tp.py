"""`distbench tp`: forward+backward of Megatron-style tensor-parallel blocks (MLP, attention),
sharded over every rank; step time, compute-only time, exposed communication, the scaling view
and a check against a single-rank reference."""

from __future__ import annotations

from dataclasses import dataclass

from distbench.core.options import OptionError, StepOptions, at_least, option, pick
from distbench.core.tables import Column, Output, us_as_ms

BLOCKS = ("mlp", "attention")

HELP = "Tensor-parallel step timing: Megatron-style MLP and attention blocks, forward+backward."


def _blocks(option_name: str, text) -> list[str]:
    if str(text).strip().lower() == "both":
        return list(BLOCKS)
    return pick(BLOCKS, "--block both")(option_name, text)


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


# Stable contract: add columns at the end, never rename.
OUTPUT = Output("tp.csv", csv=(
    "block", "dtype", "world_size", "nnodes", "hidden_size", "ffn_size", "heads", "seq_len",
    "micro_batch_size", "layers", "iters", "step_us", "rank_min_us", "rank_max_us",
    "slowest_rank", "p50_us", "p99_us", "cv_pct", "compute_only_us", "comm_pct",
    "tflops_per_rank", "tokens_per_s", "allreduce_bytes_per_step", "implied_busbw_gbps",
    "t1_us", "speedup", "efficiency", "max_abs_err", "backend", "status", "note",
), console=(
    Column("block", "block", "", 10, ident=True),
    Column("step_us", "step", "(ms)", 10, us_as_ms(".2f")),
    Column("compute_only_us", "compute", "(ms)", 10, us_as_ms(".2f")),
    Column("comm_pct", "comm", "(%)", 7, ".1f"),
    # model FLOPs, counted in closed form; the kernels execute more (docs/methodology.md)
    Column("tflops_per_rank", "mTFLOP/s", "(/rank)", 10, ".4f"),
    Column("tokens_per_s", "tokens/s", "", 11, ".1f"),
    Column("allreduce_bytes_per_step", "AR bytes", "(/step)", 12),
    Column("implied_busbw_gbps", "busbw", "(GB/s)", 9, ".3f"),
    Column("t1_us", "t1", "(ms)", 10, us_as_ms(".2f")),
    Column("speedup", "speedup", "", 9, ".2f"),
    Column("efficiency", "effic", "", 7, ".2f"),
    Column("max_abs_err", "max_err", "", 10, ".3g"),
))


def run(s) -> int:
    """Per rank, under a launcher."""
    from distbench.steps import tp

    return tp.run(s, OUTPUT)
