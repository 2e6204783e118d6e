"""`distbench plan`'s runs: what each rank does under a launcher, and what runs here
without workers. torch is imported inside them, when a run starts."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from distbench.core.exitcodes import EXIT_FAILED, EXIT_OK
from distbench.kinds.plan.cluster import (
    cluster,
    fabric_spec,
    memory_per_gpu,
    pure,
    target_gpu,
)
from distbench.kinds.plan.options import PRELOAD, PlanOptions
from distbench.planner.gpus import GPUS
from distbench.planner.models import parse_model

if TYPE_CHECKING:
    from distbench.run.session import Session


def run(s: Session) -> int:
    """Per rank, under a launcher: measure the inputs, plan on rank 0, validate."""
    from distbench.kinds.plan import workers

    return workers.run(s)


def run_local(opts: PlanOptions) -> int:
    if not pure(opts):
        from distbench.run import launch

        return launch.start_local("plan", opts, PRELOAD)
    return plan_from_runs(opts)


def plan_from_runs(opts: PlanOptions) -> int:
    """--from with no workers: read, plan, write; nothing is created before every input is
    known good."""
    from distbench.kinds.plan import pipeline, sources
    from distbench.planner.ranking import enumerated, ranked

    started = time.monotonic()
    model = parse_model("--model", opts.model)
    gpu = target_gpu(opts)
    measured, inputs = sources.read_for([Path(p) for p in opts.sources or []],
                                        GPUS[gpu] if gpu else None,
                                        fabric=opts.fabric is not None)
    if opts.fabric is not None:
        from distbench.planner.fabrics import declare

        declare(inputs, fabric_spec(opts))
    gpus, per_node, per_node_from = cluster(opts, inputs)
    memory, memory_from = memory_per_gpu(opts, inputs)
    rows = pipeline.rows(opts, model, inputs, gpus=gpus, per_node=per_node, memory=memory,
                         gpu=gpu, mfu=opts.mfu, trainer=opts.trainer)

    from distbench.results import writer
    from distbench.run.console import Console

    try:
        record = writer.RunRecord.in_new_dir(opts.out, "plan", opts.to_json(), opts.argv)
    except OSError as e:  # validated, then filled or taken away
        return _cannot_write(None, e)
    run_dir = record.path.parent
    console = Console(True)
    try:
        record.update(world_size=gpus, nnodes=max(1, gpus // per_node))
        pipeline.publish(
            opts, run_dir, console, rows, model, inputs, measured, gpus=gpus, per_node=per_node,
            per_node_from=per_node_from, memory=memory, memory_from=memory_from,
            trainer=opts.trainer, title=(
                f"plan: {model.describe()}; {gpus} GPUs, {per_node} per node "
                f"({per_node_from}), {memory / 2**30:.1f} GiB per GPU ({memory_from})"))
    except OSError as e:  # a full disk: the rows written are whole, run.json says so
        return _cannot_write(record, e)
    for warning in inputs.warnings:
        console.log(f"warning: {warning}")
    console.log(f"{len(enumerated(rows))} layouts, {len(ranked(rows))} fit in memory; planned "
                f"in {time.monotonic() - started:.2f} s")
    record.finish("ok", EXIT_OK)
    console.log(f"results in {run_dir}/")
    return EXIT_OK


def _cannot_write(record, e: OSError) -> int:
    """The results promise on a full disk, as a run with workers keeps it (run.session): one
    line, run.json "failed" with exit 3, and whole rows only (results.writer)."""
    import sys

    from distbench.results import writer

    error = f"cannot write {e.filename}: {e.strerror or e}"
    print(f"distbench: error: {error}", file=sys.stderr)
    if record is not None:
        try:
            record.finish("failed", EXIT_FAILED, error)
        except writer.PartlyWritten:
            pass  # it says how the run ended
        except OSError as again:
            print(f"distbench: error: cannot finish {record.path}: {again.strerror}; it may "
                  "still say \"running\"", file=sys.stderr)
    return EXIT_FAILED


