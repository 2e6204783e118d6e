"""What the training-step commands (tp, pp, dp, step) share beside the measuring recipe
(steps.recipe): t1, the whole problem timed on rank 0 alone for the scaling view; the check
against a single-rank reference, one verdict on every rank; and writing each row as it is
measured.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from distbench.bench import timing
from distbench.bench.measure import fail_if_wrong
from distbench.core.exitcodes import EXIT_OK
from distbench.core.tables import Output, format_table
from distbench.results.writer import CsvSink, NullSink
from distbench.run.buffers import release
from distbench.run.peers import agree
from distbench.run.session import Session
from distbench.steps.recipe import broadcast_text
from distbench.steps.reference import TensorCheck, TensorPair, check_tensors

NO_T1 = "t1: the whole problem does not fit on one device"


def time_on_rank0_alone(s: Session, what: str, build: Callable[[], Callable[[], object]]
                        ) -> float | None:
    """t1: rank 0 builds a step with build() and runs it alone, warmup untimed steps (at least
    one) then iters timed ones, while the other ranks wait at a barrier. A barrier after every
    step keeps each wait one step long, well inside the process group's timeout. The mean in
    seconds on every rank; None on every rank when the whole problem does not fit on rank 0,
    built or stepped (a model that fits may not fit its activations and gradients)."""
    rt, opts = s.rt, s.opts
    s.phase(f"{what} (build and step 1)", opts.timeout)
    step, fits = None, True
    if rt.rank == 0:
        try:
            step = build()
            step()  # the first warmup step, under the same guard
            timing.sync(rt.device)
        except (torch.OutOfMemoryError, MemoryError):
            step, fits = None, False
            release(rt.device)
    dist.barrier()
    if not agree(fits, rt.device):
        s.console.log(NO_T1 + "; no scaling view")
        return None
    warm = max(1, opts.warmup) - 1  # one ran above
    samples: list[float] = []
    for i in range(warm + opts.iters):
        s.phase(f"{what} step {i + 2}", opts.timeout)  # step 1 ran in the build
        if step is not None:
            if i < warm:
                step()
                timing.sync(rt.device)
            else:
                samples += timing.timed_loop(step, 1, rt.device)
        dist.barrier()
    step = None  # rank 0 lets the whole model go before the next measurement needs the memory
    release(rt.device)
    t1 = torch.tensor([sum(samples) / len(samples) if samples else 0.0], dtype=torch.float64,
                      device=rt.device)
    dist.broadcast(t1, src=0)
    return float(t1.item())


def check_against_reference(s: Session, pairs: list[TensorPair], rtol: float) -> TensorCheck:
    """`pairs` compared by reference.check_tensors, then agreed across ranks. The session's fault
    (tests only) lands on a copy of the first distributed tensor, since the parallel/ wrappers
    hand out live tensors (a model's own gradients)."""
    if pairs:
        name, got, ref = pairs[0]
        got = got.detach().clone()
        s.faults.corrupt_tensor(got)
        pairs = [(name, got, ref), *pairs[1:]]
    return agree_check(check_tensors(pairs, rtol), s.rt.device)


def agree_check(c: TensorCheck, device: torch.device) -> TensorCheck:
    """The verdict of every rank together, the same on each: the largest error and ratio, the
    wrong tensors summed, and the worst tensor as named by the lowest rank holding it (ranks
    compare different tensors, so the name travels as bytes; "?" when no ratio is comparable,
    as with NaN)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    worst = torch.tensor([c.max_abs_err, c.worst_ratio], dtype=torch.float64, device=device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    max_err, ratio = worst.tolist()
    wrong = torch.tensor([c.wrong], dtype=torch.int64, device=device)
    dist.all_reduce(wrong, op=dist.ReduceOp.SUM)
    holder = torch.tensor([rank if c.worst_ratio >= ratio else world], dtype=torch.int64,
                          device=device)
    dist.all_reduce(holder, op=dist.ReduceOp.MIN)
    src = int(holder.item())
    name = "?" if src == world else broadcast_text(c.worst, src, device)
    return TensorCheck(max_err, ratio, name, int(wrong.item()))


# One row of a training step: measure(bad) -> the CSV row and what run.json keeps of it; what
# it found wrong goes into `bad`.
RowMeasure = Callable[[list[str]], tuple[dict, dict]]


def write_rows(s: Session, sink: CsvSink | NullSink, output: Output, details: dict, part: str,
               rows: list[tuple[str, RowMeasure]]) -> int:
    """Each row measured and written before the next starts (a run stopped halfway keeps what
    it measured): the CSV, run.json's `details` so far under the command's name (the row's
    own under details[part][label]), the console. Once every row is written, the run fails if
    one was wrong."""
    bad: list[str] = []
    s.console.start_progress(len(rows))  # a row is seconds of building and stepping a model
    for label, measure in rows:
        s.console.working_on(label)
        row, info = measure(bad)
        details[part][label] = info
        sink.append(row)
        if s.record is not None:
            s.record.update(**{s.command: details})
        s.console.lines(format_table(output.console, [row]))
        s.console.advance()
    s.console.stop_progress()
    fail_if_wrong(bad)
    return EXIT_OK
