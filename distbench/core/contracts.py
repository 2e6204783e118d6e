"""The output contracts' registry and the facts every contract shares. Each CSV a command writes
is declared once, as an `Output`, in its kind's folder (distbench/kinds/<name>/output.py:
its columns in order, what the console shows, what reading it back relies on) and registered
with its kind; the boxes below the kinds read them here (`outputs()`), never by a command's
name. Here: the columns several contracts share, which columns are numbers, which can never be
negative, and each metric's unit and direction. Stable: add columns at the end, never rename."""

from __future__ import annotations

from dataclasses import dataclass

from distbench.core.tables import Column, Output, fmt_us

# What a sized measurement is, and what was measured, as nccl-tests prints them (p2p too).
SIZE_COLUMNS = (
    Column("size_bytes", "size", "(B)", 12, ident=True),
    Column("count", "count", "(elements)", 13, ident=True),
    Column("dtype", "type", "", 9, ident=True),
)

MEASURED_COLUMNS = (
    Column("time_us", "time", "(us)", 11, fmt=fmt_us),
    Column("algbw_gbps", "algbw", "(GB/s)", 9, ".2f"),
    Column("busbw_gbps", "busbw", "(GB/s)", 9, ".2f"),
    Column("wrong", "#wrong", "", 7),
    Column("p99_us", "p99", "(us)", 11, fmt=fmt_us),
    Column("slowest_rank", "slowest", "(rank)", 8),
)

# A layout's columns as step and validation show them (plan's rank first, its own widths)
LAYOUT_COLUMNS = (
    Column("tp", "tp", "", 4, ident=True),
    Column("pp", "pp", "", 4, ident=True),
    Column("dp", "dp", "", 4, ident=True),
    Column("zero", "zero", "", 5, ident=True),
    Column("micro_batches", "micro", "batches", 8, ident=True),
)


# Every CSV, in the order report shows a run's tables and compare compares them: the order the
# kinds are registered in (kinds.register).
_REGISTERED: list[Output] = []


def outputs() -> tuple[Output, ...]:
    """Every registered contract. None registered means distbench.kinds was never imported (the
    command line imports it; a script reading results must too): said, not read as no files."""
    if not _REGISTERED:
        raise RuntimeError("no output contract is registered: import distbench.kinds first "
                           "(it registers every command's)")
    return tuple(_REGISTERED)


def register(output: Output) -> Output:
    """A kind's contract; one file name, one contract."""
    if any(o.file == output.file and o is not output for o in _REGISTERED):
        raise ValueError(f"{output.file} has a contract already")
    if output not in _REGISTERED:
        _REGISTERED.append(output)
    return output


# The columns report and compare read as numbers, in whichever CSV: a cell that is none is
# refused, naming the file, column and row. Checked in this order (the first bad cell is named).
NUMBERS = ("root", "in_place", "world_size", "nnodes", "pairs", "size_bytes", "count", "iters",
           "time_us", "p50_us", "p99_us", "cv_pct", "algbw_gbps", "busbw_gbps", "gbps",
           "src_rank", "dst_rank", "step_us", "compute_only_us", "comm_pct", "micro_batches",
           "bubble_measured", "bubble_analytic", "measured", "expected", "ratio", "retest",
           "bucket_cap_mb", "comm_alone_us", "exposed_comm_us", "overlap_pct",
           "state_bytes_per_rank", "state_bytes_formula", "group_size", "group_stride",
           "groups", "per_node")
# The numbers no measurement can make negative: a negative one is a broken write, left out and
# named by report and compare (a root of -1 says "no root", and an exposed time or an overlap
# may come out below zero in the noise, so those are not here).
NONNEGATIVE = frozenset({
    "world_size", "nnodes", "pairs", "size_bytes", "count", "iters", "time_us", "p50_us",
    "p99_us", "cv_pct", "algbw_gbps", "busbw_gbps", "gbps", "step_us", "compute_only_us",
    "micro_batches", "comm_alone_us", "state_bytes_per_rank", "state_bytes_formula",
    "group_size", "groups", "per_node"})



@dataclass(frozen=True)
class Measure:
    unit: str
    higher_is_better: bool


# Each measured column's unit and direction: compare, --baseline and accept's verdicts all judge
# a change by it. p50_busbw_gbps is no column: accept derives it from p50_us.
MEASURES = {
    "busbw_gbps": Measure("GB/s", True),
    "algbw_gbps": Measure("GB/s", True),
    "gbps": Measure("GB/s", True),
    "p50_busbw_gbps": Measure("GB/s", True),
    "time_us": Measure("us", False),
    "p50_us": Measure("us", False),
    "p99_us": Measure("us", False),
}


def measure_of(column: str) -> Measure:
    """A column's unit and direction; one this version does not know (a newer run's) by its
    suffix: a time in us is better lower, anything else is a bandwidth."""
    known = MEASURES.get(str(column))
    if known is not None:
        return known
    return Measure("us", False) if str(column).endswith("_us") else Measure("GB/s", True)
