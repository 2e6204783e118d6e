"""`distbench pp`: pipeline-parallel training steps, the schedules side by side: step time,
measured and analytic bubble, bytes across stage boundaries, the scaling view and a check
against a single-rank reference."""

from __future__ import annotations

from dataclasses import dataclass

from distbench.core.options import (
    OptionError,
    StepOptions,
    at_least,
    at_least_two,
    option,
    pick,
    redefault,
)
from distbench.core.tables import Column, Output, us_as_ms

SCHEDULES = ("naive", "gpipe", "1f1b", "interleaved-1f1b")

HELP = "Pipeline-parallel step timing: schedules side by side, measured and analytic bubble."


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



# Stable contract: add columns at the end, never rename.
OUTPUT = Output("pp.csv", csv=(
    "schedule", "dtype", "world_size", "nnodes", "stages", "virtual_stages", "layers",
    "layers_per_stage", "micro_batches", "micro_batch_size", "hidden_size", "seq_len", "iters",
    "step_us", "rank_min_us", "rank_max_us", "slowest_rank", "p50_us", "p99_us", "cv_pct",
    "samples_per_s", "bubble_measured", "bubble_measured_per_stage", "bubble_analytic",
    "p2p_bytes_per_step", "t1_us", "speedup", "efficiency", "max_abs_err", "backend", "status",
    "note",
), console=(
    Column("schedule", "schedule", "", 17, ident=True),
    Column("stages", "stages", "", 7, ident=True),
    Column("layers_per_stage", "layers", "/stage", 14, ident=True),
    Column("step_us", "step", "(ms)", 10, us_as_ms(".2f")),
    Column("samples_per_s", "samples/s", "", 11, ".1f"),
    Column("bubble_measured", "bubble", "meas.", 8, ".3f"),
    Column("bubble_analytic", "bubble", "analytic", 9, ".3f"),
    Column("p2p_bytes_per_step", "p2p bytes", "per step", 13),
    Column("t1_us", "t1", "(ms)", 10, us_as_ms(".2f")),
    Column("speedup", "speedup", "", 8, ".2f"),
    Column("efficiency", "effic.", "", 7, ".2f"),
    Column("max_abs_err", "max err", "", 10, ".2e"),
    Column("bubble_measured_per_stage", "bubble per stage", "(per rank)", 20),
))


def run(s) -> int:
    """Per rank, under a launcher."""
    from distbench.steps import pp

    return pp.run(s, OUTPUT)
