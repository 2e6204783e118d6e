"""Shared by the planner's and plan's tests: a small model and hand-computed inputs, and
`distbench plan` run in the test's process."""

from __future__ import annotations

from pathlib import Path

import helpers

from distbench.planner.inputs import CommFit, ComputePoint, Inputs
from distbench.planner.layouts import Layout
from distbench.planner.models import ModelSpec
from distbench.planner.ranking import make_plan

MODEL = ModelSpec(name="custom", layers=4, hidden_size=64, ffn_size=256, heads=4, seq_len=16,
                  batch=32)


SHAPE = {"hidden_size": 64, "ffn_size": 256, "heads": 4, "seq_len": 16}

LAYER_US = 100.0

# The tiny model plan's workers measure for real, and how long one of their ranks may wait on
# its peers (--timeout): their runs take 10 to 40 s, and a stuck one then ends with distbench's
# own account of where (its phase, the ranks it waited on) well before the test's timeout,
# instead of holding its process slots for all of it.
TINY = "layers=2,hidden=16,ffn=32,heads=2,seq=4,batch=4"
STUCK_S = "60"


def plan(tmp_path: Path, *args: str, dispatch: bool = True, plot: bool = False) -> helpers.Run:
    """`distbench plan *args --out tmp_path/out`. Without its figure unless `plot`: drawing it
    was a third of what these runs cost, and what it shows is test_plan_figures.py's (that
    --no-plot changes nothing else, test_plan.py's)."""
    return helpers.cli(tmp_path, "plan", *args, *(() if plot else ("--no-plot",)), "--out",
                       str(tmp_path / "out"), dispatch=dispatch)


def hand_inputs(tp: int = 1, mbs: int = 8, **extra) -> Inputs:
    """All-reduce on 2 and 4 ranks in a node (10 us + S at 1 GB/s, and 20 us + S at 2 GB/s), a
    one-way hop of 5 us + S at 4 GB/s, one layer timed at `tp` and `mbs` samples."""
    fits = [CommFit(op="all_reduce", ranks=2, span="node", alpha_us=10.0, beta_gbps=1.0),
            CommFit(op="all_reduce", ranks=4, span="node", alpha_us=20.0, beta_gbps=2.0),
            CommFit(op="sendrecv", ranks=2, span="node", alpha_us=5.0, beta_gbps=4.0)]
    compute = [ComputePoint(tp=tp, tokens=mbs * MODEL.seq_len, layer_us=LAYER_US,
                            flops=MODEL.flops_per_layer(mbs * MODEL.seq_len, tp))]
    return Inputs(fits=fits, compute=compute, compute_model=dict(SHAPE), **extra)


def one_row(layout: Layout, inputs: Inputs, dtype: str = "float32") -> dict:
    rows = make_plan(MODEL, inputs, layout.world, 8, 80 * 2**30, dtype, layouts=[layout])
    assert len(rows) == 1
    return rows[0]
