"""The output contracts: every CSV distbench writes, its columns in order, what the console
shows of it and what reading it back relies on (the columns that identify a row, those that
must be there, those read as numbers), declared once. Commands write them, report and compare
read them, and nccl-tests logs are read into them, so a column is named here and nowhere else.
Stable: add columns at the end, never rename."""

from __future__ import annotations

from dataclasses import dataclass

from distbench.core.layout_label import EXTRA_COLUMNS, row_label
from distbench.core.tables import Column, Output, fmt_us, us_as_ms

# collective
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

# Stable contract: add columns at the end, never rename.
COLLECTIVE = Output("collective.csv", csv=(
    "op", "dtype", "redop", "root", "in_place", "world_size", "nnodes", "size_bytes", "count",
    "iters", "time_us", "rank_min_us", "rank_max_us", "slowest_rank", "p50_us", "p99_us",
    "cv_pct", "algbw_gbps", "busbw_gbps", "wrong", "backend", "status", "note", "launch_bound",
    "reps", "spread_pct", "group_size", "group_stride", "groups", "per_node",
), console=(
    *SIZE_COLUMNS,
    Column("redop", "redop", "", 6, ident=True),
    Column("root", "root", "", 5, ident=True),
    Column("in_place", "place", "", 6, fmt=lambda v: "in" if v else "out", ident=True),
    *MEASURED_COLUMNS,
), identity=("op", "dtype", "redop", "root", "in_place", "world_size", "nnodes", "size_bytes",
             "group_size", "group_stride"),
    read=("time_us", "p99_us", "algbw_gbps", "busbw_gbps", "status"),
    identity_since=("group_size", "group_stride"),
    busbw="busbw_gbps", time="time_us", p99="p99_us", group=lambda row: str(row["op"]))


# p2p
# Stable contracts: add columns at the end, never rename.
P2P = Output("p2p.csv", csv=(
    "pattern", "dtype", "world_size", "nnodes", "pairs", "size_bytes", "count", "iters",
    "time_us", "rank_min_us", "rank_max_us", "slowest_rank", "p50_us", "p99_us", "cv_pct",
    "algbw_gbps", "busbw_gbps", "wrong", "backend", "status", "note", "launch_bound", "reps",
    "spread_pct",
), console=(*SIZE_COLUMNS, *MEASURED_COLUMNS),
    identity=("pattern", "dtype", "world_size", "nnodes", "pairs", "size_bytes"),
    read=("time_us", "p99_us", "busbw_gbps", "status"),
    busbw="busbw_gbps", time="time_us", p99="p99_us", group=lambda row: str(row["pattern"]))

# Long form: one row per ordered pair, direction and size. On the console: N x N grids.
P2P_MATRIX = Output("p2p_matrix.csv", csv=(
    "direction", "src_rank", "dst_rank", "src_host", "dst_host", "src_local_rank",
    "dst_local_rank", "link", "dtype", "world_size", "nnodes", "size_bytes", "count", "iters",
    "time_us", "p50_us", "p99_us", "cv_pct", "gbps", "wrong", "backend", "reps", "spread_pct",
), identity=("direction", "src_rank", "dst_rank", "dtype", "world_size", "nnodes", "size_bytes"),
    read=("src_host", "dst_host", "src_local_rank", "dst_local_rank", "link", "time_us", "p99_us",
          "gbps"),
    busbw="gbps", time="time_us", p99="p99_us", group=lambda row: f"matrix {row['direction']}")


# tp
# Stable contract: add columns at the end, never rename.
TP = Output("tp.csv", csv=(
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
), read=("block", "dtype", "world_size", "step_us", "compute_only_us", "comm_pct", "status"),
    identity=("block", "dtype", "world_size", "nnodes", "hidden_size", "seq_len",
              "micro_batch_size", "layers"),
    time="step_us", p99="p99_us")  # a training step's figure is its step time


# pp
# Stable contract: add columns at the end, never rename.
PP = Output("pp.csv", csv=(
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
), read=("schedule", "dtype", "world_size", "micro_batches", "step_us", "bubble_measured",
         "bubble_analytic", "status"),
    identity=("schedule", "dtype", "world_size", "nnodes", "stages", "micro_batches",
              "micro_batch_size"),
    time="step_us", p99="p99_us")


# dp
# Stable contract: add columns at the end, never rename.
DP = Output("dp.csv", csv=(
    "mode", "bucket_cap_mb", "dtype", "world_size", "nnodes", "block", "hidden_size",
    "ffn_size", "heads", "seq_len", "micro_batch_size", "layers", "params", "iters", "step_us",
    "rank_min_us", "rank_max_us", "slowest_rank", "p50_us", "p99_us", "cv_pct",
    "compute_only_us", "comm_alone_us", "exposed_comm_us", "overlap_pct", "bytes_per_step",
    "bytes_counted", "implied_busbw_gbps", "state_bytes_per_rank", "state_bytes_formula",
    "peak_mem_bytes",
    "samples_per_s", "t1_us", "efficiency", "max_abs_err", "backend", "status", "note",
), console=(
    Column("mode", "mode", "", 7, ident=True),
    Column("bucket_cap_mb", "bucket", "(MiB)", 8, "g", ident=True),
    Column("step_us", "step", "(ms)", 10, us_as_ms(".2f")),
    Column("compute_only_us", "compute", "(ms)", 10, us_as_ms(".2f")),
    Column("comm_alone_us", "comm", "alone(ms)", 10, us_as_ms(".2f")),
    Column("exposed_comm_us", "exposed", "(ms)", 10, us_as_ms(".2f")),
    Column("overlap_pct", "overlap", "(%)", 8, ".1f"),
    Column("bytes_per_step", "bytes", "(/step)", 12),
    Column("implied_busbw_gbps", "busbw", "(GB/s)", 8, ".3f"),
    Column("state_bytes_per_rank", "state", "(MB/rank)", 10, lambda b: f"{b / 1e6:.2f}"),
    Column("samples_per_s", "samples/s", "", 10, ".1f"),
    Column("efficiency", "effic", "", 7, ".2f"),
    Column("max_abs_err", "max_err", "", 10, ".3g"),
), read=("mode", "bucket_cap_mb", "dtype", "world_size", "step_us", "compute_only_us",
         "comm_alone_us", "exposed_comm_us", "overlap_pct", "state_bytes_per_rank", "status"),
    identity=("mode", "bucket_cap_mb", "dtype", "world_size", "nnodes", "block",
              "micro_batch_size", "layers"),
    time="step_us", p99="p99_us")


# A layout's columns as step and validation show them (plan's rank first, its own widths)
LAYOUT_COLUMNS = (
    Column("tp", "tp", "", 4, ident=True),
    Column("pp", "pp", "", 4, ident=True),
    Column("dp", "dp", "", 4, ident=True),
    Column("zero", "zero", "", 5, ident=True),
    Column("micro_batches", "micro", "batches", 8, ident=True),
)

# step
# One row per layout: the parts add up as predicted (docs/plan.md) and as measured.
# Stable contract: add columns at the end, never rename.
STEP = Output("step.csv", csv=(
    "model", "tp", "pp", "dp", "zero", "micro_batches", "micro_batch_size", "schedule",
    "dtype", "world_size", "nnodes", "layers", "hidden_size", "ffn_size", "heads", "seq_len",
    "batch", "params", "iters", "step_us", "rank_min_us", "rank_max_us", "slowest_rank",
    "p50_us", "p99_us", "cv_pct", "compute_only_us", "tp_comm_alone_us", "pp_comm_alone_us",
    "dp_comm_alone_us", "exposed_comm_us", "tp_exposed_us", "pp_exposed_us", "dp_exposed_us",
    "bubble_analytic", "bubble_us", "tp_bytes_per_step", "pp_bytes_per_step",
    "dp_bytes_per_step", "state_bytes_per_rank", "peak_mem_bytes", "samples_per_s",
    "max_abs_err", "backend", "status", "note", "recompute", "model_mem_bytes",
    "virtual_stages", *EXTRA_COLUMNS,
), console=(
    *LAYOUT_COLUMNS,
    Column("step_us", "step", "(ms)", 10, us_as_ms(".2f")),
    Column("compute_only_us", "compute", "(ms)", 10, us_as_ms(".2f")),
    Column("tp_comm_alone_us", "tp comm", "alone(ms)", 10, us_as_ms(".2f")),
    Column("pp_comm_alone_us", "pp comm", "alone(ms)", 10, us_as_ms(".2f")),
    Column("dp_comm_alone_us", "dp comm", "alone(ms)", 10, us_as_ms(".2f")),
    Column("exposed_comm_us", "exposed", "(ms)", 10, us_as_ms(".2f")),
    Column("bubble_analytic", "bubble", "", 7, ".3f"),
    Column("state_bytes_per_rank", "state", "(MB/rank)", 10, lambda b: f"{b / 1e6:.2f}"),
    Column("peak_mem_bytes", "peak", "(MB/rank)", 10, lambda b: f"{b / 1e6:.2f}"),
    Column("model_mem_bytes", "model", "(MB/rank)", 10, lambda b: f"{b / 1e6:.2f}"),
    Column("max_abs_err", "max_err", "", 10, ".3g"),
), identity=("model", "tp", "pp", "dp", "zero", "micro_batches", "dtype", "world_size",
             "recompute", "virtual_stages", *EXTRA_COLUMNS),
    read=("tp", "pp", "dp", "zero", "micro_batches", "step_us", "compute_only_us",
          "exposed_comm_us", "status"),
    # a layout recomputed, interleaved, sequence-parallel or synced otherwise is another
    # layout; older runs lack the columns
    identity_since=("recompute", "virtual_stages", *EXTRA_COLUMNS),
    time="step_us", p99="p99_us",
    # a layout reads as its label, not as five bare numbers
    label=lambda row: f"{row_label(row)} {row.get('dtype')}")



# plan
# One row per layout on --gpus ranks: the predicted step and its parts (docs/plan.md), the
# memory per rank and its parts, whether it fits, and its rank among those that fit. Predicted,
# not measured: no identity, so compare does not pair it with a measurement.
# Stable contract: add columns at the end, never rename.
PLAN = Output("plan.csv", csv=(
    "model", "tp", "pp", "dp", "zero", "micro_batches", "micro_batch_size", "dtype",
    "world_size", "gpus_per_node", "predicted_step_ms", "compute_ms", "tp_comm_ms",
    "pp_comm_ms", "bubble_ms", "dp_comm_ms", "dp_exposed_ms", "optimizer_ms",
    "bubble_fraction", "tokens_per_s", "memory_per_rank_bytes", "params_bytes", "grads_bytes",
    "optimizer_bytes", "buffers_bytes", "activations_bytes", "memory_limit_bytes", "fits",
    "rank", "recompute", "given", "enumerated", "virtual_stages", *EXTRA_COLUMNS,
    "tp_exposed_ms", "trainer",
), console=(
    Column("rank", "rank", "", 5),
    Column("tp", "tp", "", 4),
    Column("pp", "pp", "", 4),
    Column("dp", "dp", "", 6),
    Column("zero", "zero", "", 5),
    Column("micro_batches", "micro", "batches", 8),
    Column("predicted_step_ms", "step", "(ms)", 10, ".2f"),
    Column("compute_ms", "compute", "(ms)", 10, ".2f"),
    Column("tp_comm_ms", "tp comm", "(ms)", 10, ".2f"),
    Column("pp_comm_ms", "pp comm", "(ms)", 10, ".2f"),
    Column("bubble_ms", "bubble", "(ms)", 10, ".2f"),
    Column("dp_exposed_ms", "dp exp.", "(ms)", 10, ".2f"),
    Column("optimizer_ms", "optim", "(ms)", 9, ".2f"),
    Column("memory_per_rank_bytes", "memory", "(GiB)", 9, lambda b: f"{b / 2**30:.1f}"),
    Column("fits", "fits", "", 5, lambda v: "yes" if v else "no"),
), read=("tp", "pp", "dp", "zero", "micro_batches", "predicted_step_ms", "fits"),
    not_compared="predictions, not measurements: plan --validate measures step.csv")

# validation
# One row per layout `plan --validate K` ran for real: what was predicted against what a real
# step took. Stable contract: add columns at the end, never rename.
VALIDATION = Output("validation.csv", csv=(
    "model", "tp", "pp", "dp", "zero", "micro_batches", "predicted_step_ms",
    "measured_step_ms", "error_pct", "in_sample", "status", "note", "recompute",
    "virtual_stages", *EXTRA_COLUMNS,
), console=(
    *LAYOUT_COLUMNS,
    Column("predicted_step_ms", "predicted", "(ms)", 11, ".2f"),
    Column("measured_step_ms", "measured", "(ms)", 11, ".2f"),
    Column("error_pct", "error", "(%)", 8, ".1f"),
), read=("predicted_step_ms", "measured_step_ms", "status"),
    not_compared="each prediction against one measurement: its step.csv is compared")

# accept
# One row per check and target (a node, a pair of nodes, the cluster), retests included; its
# metric (a profile's choice) says which way is better, so it is part of the row's identity.
# Stable contract: add columns at the end, never rename.
ACCEPT = Output("accept.csv", csv=(
    "check", "scope", "target", "command", "op", "dtype", "size_bytes", "ranks", "iters",
    "time_us", "p99_us", "algbw_gbps", "busbw_gbps", "wrong", "metric", "measured", "expected",
    "warn_at", "reference", "ratio", "verdict", "retest", "note", "p50_us", "spread",
), console=(
    Column("check", "check", "", 28, ident=True),
    Column("scope", "scope", "", 8, ident=True),
    Column("target", "target", "", 22, ident=True),
    Column("measured", "measured", "", 11, ".4g"),
    Column("expected", "expected", "", 11, ".4g"),
    Column("ratio", "ratio", "", 8, ".3g"),
    Column("verdict", "verdict", "", 8),
), identity=("check", "scope", "target", "metric", "retest"),
    read=("measured", "expected", "ratio", "verdict"),
    # each check is judged by its own metric: `measured` is whatever the profile judged
    busbw="measured", time="measured", p99="measured", row_metric="metric",
    group=lambda row: str(row["check"]), grouped_by="check")

# watch: one row per probe per cycle, flushed as each cycle ends (distbench/watch)
WATCH = Output("watch.csv", csv=(
    "cycle", "started", "duration_s", "late", "op", "size_bytes", "scope", "dtype", "world_size",
    "nnodes", "status", "time_us", "busbw_gbps", "spread_pct", "late_rank", "lateness_us",
    "state", "median_us", "p95_us", "cv", "baseline_us", "verdict", "stragglers", "note",
), identity=("cycle", "op", "size_bytes", "scope", "dtype"),
    read=("time_us", "busbw_gbps", "state", "verdict"),
    not_compared="cycles watch judges itself, against its own baseline")

# Every CSV, in the order report shows a run's tables and compare compares them: these, then
# any a kind registers (its own folder's contracts: kinds.register).
_REGISTERED: list[Output] = [COLLECTIVE, P2P, P2P_MATRIX, TP, PP, DP, STEP, PLAN, VALIDATION,
                             ACCEPT, WATCH]


def outputs() -> tuple[Output, ...]:
    return tuple(_REGISTERED)


def register(output: Output) -> Output:
    """A contract declared outside this file (a kind's own); one file name, one contract."""
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
_unknown = [c for c in NUMBERS if not any(c in o.csv for o in _REGISTERED)]
if _unknown or not NONNEGATIVE <= set(NUMBERS):
    raise ValueError(f"NUMBERS names no CSV's column: {_unknown}, or NONNEGATIVE a column "
                     f"not in NUMBERS: {sorted(NONNEGATIVE - set(NUMBERS))}")


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
