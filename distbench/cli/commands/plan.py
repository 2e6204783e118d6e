"""`distbench plan`: the layouts (TP inside a node, PP, DP, ZeRO stage, micro-batches) of a
model on a cluster, each one's memory per rank judged and its step time predicted from measured
inputs, ranked. With --from and no workers it is arithmetic on earlier runs, torch-free and done
in seconds; otherwise the workers measure the inputs here (and, with --validate, run the best
layouts for real). docs/plan.md gives the model."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from distbench.core import contracts
from distbench.core.dtypes import FLOATS
from distbench.core.exitcodes import EXIT_FAILED, EXIT_OK
from distbench.core.options import (
    OptionError,
    RunOptions,
    at_least,
    fraction,
    iterations,
    one_float_dtype,
    one_of,
    option,
    pick,
    require,
    with_example,
)
from distbench.core.sizes import SizeError, format_size, parse_size
from distbench.planner.fabrics import MAX_GPUS_PER_NODE
from distbench.planner.gpus import DEFAULT_MFU, GPUS
from distbench.planner.layouts import RECOMPUTE, parse_zero
from distbench.planner.models import PRESETS, SHAPE_HELP, model_text, parse_model
from distbench.planner.trainers import TRAINERS
from distbench.run.forked_workers import TRAINING

if TYPE_CHECKING:
    from distbench.planner.inputs import Inputs
    from distbench.run.session import Session

HELP = ("Plan a model's layouts (TP, PP, DP, ZeRO, micro-batches) on a cluster: memory per rank "
        "judged, step time predicted from measured collectives, compute and overlap.")
# the workers validate layouts with training steps (Command.preload)
PRELOAD = TRAINING
EXAMPLES = (
    "distbench plan --from results/<run> --gpus 1024 --gpus-per-node 8 --model 7b",
    "distbench plan --fabric dgx-a100 --gpus 1024 --model 7b --dtype bfloat16",
    "distbench plan --model layers=4,hidden=128,heads=4,seq=32,batch=16 --workers 4",
)

# What a GPU is taken to hold when nothing says: an 80 GB part (A100/H100), said in the output.
ASSUMED_MEMORY = 80 * 2**30
# The most GPUs a plan is for, and per node: the layouts are arithmetic over their divisors,
# and no bound let one number make a plan long (issue 30). Several times the largest real
# figures: clusters of about 200,000 GPUs, NVLink domains of 72 GPUs (GB200 NVL72; 576
# announced), where TP may stay (MAX_GPUS_PER_NODE, planner/fabrics.py: a fabric's
# gpus_per_node= has the same bound).
MAX_GPUS = 2**20


def _count(high: int, largest: str, example: str):
    """A whole number from 1 to `high`, or None."""
    low = at_least(1, example, optional=True)
    top = require(lambda v: v <= high, f"must be at most {high:,} (several times {largest}), "
                  "got {value:,}", example, optional=True)
    return with_example(lambda option_name, value: top(option_name, low(option_name, value)),
                        example)


def _model(option_name: str, text) -> str:
    return model_text(parse_model(option_name, text))


def _zero(option_name: str, text) -> list[int]:
    return sorted(parse_zero(option_name, text, "--zero 1,3"))


def _memory(option_name: str, text) -> int | None:
    if text is None:
        return None
    try:
        size = parse_size(str(text))
    except SizeError as e:
        raise OptionError(option_name, str(e), "--gpu-memory 80G") from None
    if size <= 0:
        raise OptionError(option_name, f"must be above 0, got {text}", "--gpu-memory 80G")
    above_reserve(option_name, size, "--gpu-memory 80G")
    return size


def above_reserve(option_name: str, size: float, example: str, where: str = "") -> None:
    """A GPU's memory must leave some after the planner's reserve: at or below it, every layout
    was judged against a negative figure ("-2.0 GiB usable")."""
    from distbench.planner.memory import RESERVE_MIN_BYTES, usable_bytes

    if usable_bytes(size) <= 0:
        raise OptionError(option_name, f"{where}{format_size(int(size))} per GPU leaves nothing "
                          f"after the reserve of at least {RESERVE_MIN_BYTES / 2**30:g} GiB "
                          "kept for the CUDA context, the allocator and NCCL: give more than "
                          "that", example)


def _paths(option_name: str, text) -> list[str] | None:
    if text is None:
        return None
    paths = [p.strip() for p in str(text).split(",") if p.strip()]
    if not paths:
        raise OptionError(option_name, "names no run directory or nccl-tests log",
                          "--from results/RUN")
    return paths


def _layouts(option_name: str, raw) -> str | None:
    from distbench.planner import given

    return given.canonical(option_name, raw)


def _recompute(option_name: str, text) -> list[str]:
    return pick(RECOMPUTE, "--recompute none,full")(option_name, text)


def _gpu(option_name: str, text) -> str | None:
    return None if text is None else one_of(tuple(GPUS), "--gpu h100")(option_name, text)


def _fabric(option_name: str, text) -> str | None:
    if text is None:
        return None
    from distbench.planner import fabrics

    fabrics.parse(option_name, text)
    return str(text)


for _check, _example in ((_model, "--model 7b"), (_zero, "--zero 1,3"),
                         (_memory, "--gpu-memory 80G"),
                         (_paths, "--from results/RUN1,results/RUN2"), (_gpu, "--gpu h100"),
                         (_fabric, "--fabric dgx-h100"),
                         (_layouts, "--layout tp=8,pp=2,dp=4,zero=1,mbs=2,recompute=full"),
                         (_recompute, "--recompute none,full")):
    with_example(_check, _example)


@dataclass(kw_only=True)
class PlanOptions(RunOptions):
    model: str = option("toy", f"A preset ({', '.join(PRESETS)}) or a shape: {SHAPE_HELP}. "
                        "batch: the global batch in samples, Megatron's --global-batch-size.",
                        check=_model)
    gpus: int | None = option(None, "GPUs to plan for. Default: the workers' world.",
                              check=_count(MAX_GPUS, "the largest clusters'", "--gpus 1024"),
                              show_default=False)
    gpus_per_node: int | None = option(
        None, "GPUs per node (TP stays inside one). Default: the --from runs' GPUs per node, "
        "else the workers' per node; required where that is a CPU's worker count.",
        check=_count(MAX_GPUS_PER_NODE, "the largest NVLink domains'", "--gpus-per-node 8"),
        show_default=False)
    gpu_memory: int | None = option(
        None, "Memory per GPU (80G). Default: the topology's, else --gpu's, else 80 GiB "
        "(said).", check=_memory, cli_type=str, show_default=False)
    gpu: str | None = option(
        None, f"A GPU ({', '.join(GPUS)}) to scale compute from (its datasheet peak x --mfu) "
        "when no layer was timed.", check=_gpu, cli_type=str, show_default=False)
    fabric: str | None = option(
        None, "A declared fabric, for groups no --from run measured (or with no --from at all): "
        "a preset (dgx-a100, dgx-h100, dgx-h200), figures node_gbps= nic_gbps= nics_per_node= "
        "(optionally gpus_per_node= gpu= base_us= node_hop_us= net_hop_us=) comma-joined, or "
        "a preset with figures replaced (dgx-a100,nics_per_node=4).", check=_fabric,
        cli_type=str, show_default=False)
    mfu: float | None = option(None, "Fraction of --gpu's peak a layer reaches. Default: the "
                               "fraction distbench measured on that GPU in 16-bit types "
                               f"(h100: 0.546), else {DEFAULT_MFU}.",
                               check=fraction("--mfu 0.4", optional=True),
                               show_default=False)
    dtype: str = option("float32", f"{', '.join(FLOATS)}: the parameters' and activations' "
                        "type.", check=one_float_dtype)
    zero: list[int] = option("all", "ZeRO stages considered (0 is plain DDP); comma list or "
                             "'all'.", check=_zero, cli_type=str)
    recompute: list[str] = option(
        "none", "Activation recomputation weighed: none, selective (the attention core), op "
        "(torchtitan's per-op), full (each layer; Megatron's large runs); comma list or "
        "'all'.", check=_recompute,
        cli_type=str)
    trainer: str = option(
        "torch", "Whose training step is planned: torch (torch's pipelining, DDP, FSDP2: what "
        "`distbench step` runs) or megatron (Megatron-LM's schedule and memory; zero=1 is its "
        "distributed optimizer).", check=one_of(TRAINERS, "--trainer megatron"))
    layouts: str | None = option(
        None, "A layout you run, predicted beside the ranked list, in Megatron's terms, "
        "comma-joined: tp=8 pp=2 dp=4 zero=1 mbs=2 recompute=full (mbs: samples per "
        "micro-batch; or m=, their count; the global batch is --model's batch=; dp defaults "
        "to the GPUs left; also v=, sp=0, recompute_layers=, grad_sync=micro|last, "
        "tp_overlap=1, dp_overlap=0: docs/plan.md). Repeat it, or separate layouts with ';'.",
        flag="layout",
        check=_layouts, cli_type=list[str] | None, show_default=False)
    sources: list[str] | None = option(
        None, "Earlier run directories to predict from (collective, p2p, dp, accept, plan), "
        "nccl-tests logs or folders of them; comma list. Nothing is started: not with "
        "--workers or --validate.", flag="from",
        check=_paths, cli_type=str, show_default=False)
    # not `validate`: that is RunOptions' check between fields
    validations: int = option(0, "Layouts to run for real after planning (the best and "
                              "others, out of sample first).", flag="validate",
                              check=at_least(0, "--validate 4"))
    top: int = option(5, "Layouts shown and summarised.", check=at_least(1, "--top 5"))
    iters: int | None = option(None, "Timed steps of each layout run (the overlap's and the "
                               "validation's). Default: calibrated to --min-time.",
                               check=iterations("--iters 10", optional=True), show_default=False)
    min_time: float = option(
        3.0, "Seconds of timed steps per layout run; each input point fills three times a "
        "twentieth of it (a collective at one size, the optimizer) or a fifth (a layer).",
        check=require(lambda v: v > 0 and math.isfinite(v), "must be a number of seconds above "
                      "0, got {value}", "--min-time 1.0", float))
    warmup: int = option(2, "Untimed steps first.", check=at_least(0, "--warmup 2"))

    def validate_nodes(self, gpus: int, per_node: int) -> None:
        """Up to one node, any count (a part of one node); past one, whole nodes."""
        if gpus > per_node and gpus % per_node:
            raise OptionError("--gpus", f"{gpus} GPUs are more than one node of {per_node} "
                              "(--gpus-per-node) and not whole nodes: a plan takes a part of "
                              "one node, or whole nodes", "--gpus 1024 --gpus-per-node 8")

    def validate(self) -> None:
        if self.sources:
            # --from plans from earlier runs with nothing started; workers measure here, and
            # a plan from both would mix two machines' figures without saying which is which
            mixed = [f for f, on in (("--workers", self.workers is not None),
                                     ("--validate", bool(self.validations))) if on]
            if mixed:
                verb = "start" if len(mixed) > 1 else "starts"
                raise OptionError("--from", "plans from earlier runs and starts nothing, "
                                  f"while {' and '.join(mixed)} {verb} workers to measure "
                                  "here: give one or the other",
                                  "--from results/RUN --gpus 1024 --gpus-per-node 8")
            from distbench.platform import env

            if env.under_launcher():
                raise OptionError("--from", "plans from earlier runs with nothing started: run "
                                  "it without a launcher (under one every rank would measure "
                                  "and ignore --from)",
                                  "--from results/RUN --gpus 1024 --gpus-per-node 8")
        if self.gpus is not None and self.gpus_per_node is not None:
            self.validate_nodes(self.gpus, self.gpus_per_node)
            self.named_layouts(self.gpus, self.gpus_per_node)
        if not self.model_spec.fused_attention and (self.workers is not None
                                                     or self.validations):
            raise OptionError("--model", "attention=unfused is planned from --from runs or a "
                              "--fabric: the workers time and step fused attention",
                              "--model 7b --fabric dgx-a100 --gpus 64")
        if self.trainer != "torch" and (self.workers is not None or self.validations):
            raise OptionError("--trainer", f"{self.trainer}'s step is planned from --from runs "
                              "or a --fabric: the workers run torch's (drop --workers and "
                              "--validate)", "--trainer megatron --fabric dgx-a100 --gpus 64")
        if self.fabric is not None and (self.workers is not None or self.validations):
            raise OptionError("--fabric", "declares a cluster to plan for without workers: "
                              "the workers measure the fabric they run on (drop --workers and "
                              "--validate)", "--fabric dgx-h100 --gpus 1024")

    def check_backend(self, backend: str) -> None:
        self._backend = backend  # check_world's rule for CPU workers needs it

    def check_world(self, world: int) -> None:
        """With workers, before any starts: a node size for the GPUs planned, and a plan (and
        a validation) with layouts at all; the --from path refuses the same in
        planner.assemble.plan_rows."""
        if self.pure:
            return
        from distbench.planner.assemble import require_layouts
        from distbench.platform import env

        if getattr(self, "_backend", None) == "gloo" and self.gpus not in (None, world) \
                and self.gpus_per_node is None:
            raise OptionError("--gpus-per-node", f"the {world} workers run on the CPU: their "
                              f"count per node is no GPU node size for a plan of {self.gpus} "
                              "GPUs: say how many GPUs a node has", "--gpus-per-node 8")
        local = (env.local_world_size() if env.under_launcher() else None) or world
        gpus = self.gpus or world
        per_node = self.gpus_per_node or local
        self.validate_nodes(gpus, per_node)
        self.named_layouts(gpus, per_node)
        require_layouts(self.model_spec, gpus, per_node, self.zero, *(
            ("--gpus", "", "--gpus 1024 --gpus-per-node 8") if self.gpus else
            ("--workers", " (the workers' world)", "--workers 4")))
        if self.validations and (gpus, per_node) != (world, local):
            require_layouts(self.model_spec, world, local, self.zero, "--validate",
                            f" to validate on the {world} workers", "--workers 4 --validate 3")

    def named_layouts(self, gpus: int, per_node: int):
        """The --layout layouts on this cluster (planner.given); raises OptionError."""
        from distbench.planner import given

        return given.resolve_all(self.layouts, self.model_spec, gpus, per_node,
                                 trainer=self.trainer)

    SIZED_BY = ("--model", "--model toy")

    def host_bytes(self, backend: str, world: int) -> int:
        """On CPU, per worker: the most a rank holds while plan measures its inputs and
        validates, within what a worker may hold here (planner.points): only what fits is
        measured, and a model none of whose layouts fits needs its smallest layout's memory,
        which the launcher then refuses with the figures."""
        if backend == "nccl":
            return 0
        from distbench.core.dtypes import element_bytes
        from distbench.planner import points
        from distbench.platform import limits

        budget = limits.rank_budget(world)
        return int(points.need(self.model_spec, world, self.gpus_per_node or world, self.zero,
                               element_bytes(self.dtype),
                               math.inf if budget is None else budget))

    @property
    def model_spec(self):
        return parse_model("--model", self.model)

    def memory_per_gpu(self, inputs: Inputs) -> int:
        return memory_per_gpu(self, inputs)[0]

    def memory_from(self, inputs: Inputs) -> str:
        return memory_per_gpu(self, inputs)[1]

    @property
    def pure(self) -> bool:
        """Arithmetic on earlier runs only: no worker to start."""
        return ((bool(self.sources) or self.fabric is not None) and self.workers is None
                and not self.validations)

    @property
    def fabric_spec(self):
        from distbench.planner import fabrics

        return None if self.fabric is None else fabrics.parse("--fabric", self.fabric)

    @property
    def target_gpu(self) -> str | None:
        """The GPU planned for: --gpu, else the declared fabric's."""
        fabric = self.fabric_spec
        return self.gpu or (fabric.gpu if fabric is not None else None)


OUTPUT = contracts.PLAN
VALIDATION = contracts.VALIDATION


def run(s: Session) -> int:
    """Per rank, under a launcher: measure the inputs, plan on rank 0, validate."""
    from distbench.steps import plan_run

    return plan_run.run(s, OUTPUT)


def run_local(opts: PlanOptions) -> int:
    if not opts.pure:
        from distbench.run import launch

        return launch.start_local("plan", opts, PRELOAD)
    return plan_from_runs(opts)


def memory_per_gpu(opts: PlanOptions, inputs: Inputs) -> tuple[int, str]:
    """Memory per GPU and where it came from."""
    if opts.gpu_memory is not None:
        return opts.gpu_memory, "--gpu-memory"
    if inputs.memory_per_gpu:
        above_reserve("--from", inputs.memory_per_gpu, "--gpu-memory 80G",
                      "the runs' topology says ")
        return int(inputs.memory_per_gpu), "the --from topology"
    if opts.target_gpu is not None:
        return GPUS[opts.target_gpu].memory_bytes, (
            f"--gpu {opts.gpu}'s datasheet" if opts.gpu else
            f"--fabric {opts.fabric}'s {opts.target_gpu}, its datasheet")
    from distbench.planner.gpus import by_device_name

    named = by_device_name(inputs.device) if inputs.device else None
    if named is not None:
        return named.memory_bytes, f"the --from runs' {named.name}, its datasheet"
    return ASSUMED_MEMORY, ("assumed: no --gpu-memory, no GPU in the --from topology and no "
                            "--gpu")


def plan_from_runs(opts: PlanOptions) -> int:
    """--from with no workers: read, plan, write; nothing is created before every input is
    known good."""
    from distbench.planner import assemble, sources
    from distbench.planner.given import lines as given_lines
    from distbench.planner.plan import enumerated, ranked, top_lines

    started = time.monotonic()
    model = parse_model("--model", opts.model)
    target = GPUS[opts.target_gpu] if opts.target_gpu else None
    measured, inputs = sources.read_for([Path(p) for p in opts.sources or []], target,
                                        fabric=opts.fabric is not None)
    if opts.fabric is not None:
        from distbench.planner.fabrics import declare

        declare(inputs, opts.fabric_spec)
    gpus, per_node, per_node_from = cluster(opts, inputs)
    memory, memory_from = memory_per_gpu(opts, inputs)
    rows = assemble.plan_rows(model, inputs, gpus, per_node, memory, opts.dtype, opts.zero,
                              gpu=opts.target_gpu, mfu=opts.mfu, recompute=opts.recompute,
                              layouts=opts.layouts, trainer=opts.trainer)

    from distbench.results import writer
    from distbench.run.console import Console

    try:
        run_dir = writer.new_run_dir(opts.out, "plan")
    except OSError as e:  # validated, then filled or taken away
        return _cannot_write(None, e)
    record = writer.RunRecord(run_dir, "plan", opts.to_json(), opts.argv)
    try:
        record.update(world_size=gpus, nnodes=max(1, gpus // per_node))
        assemble.write(run_dir, rows, model, inputs, gpus=gpus, gpus_per_node=per_node,
                       memory_per_gpu=memory, memory_from=memory_from, dtype=opts.dtype,
                       top=opts.top, measured=measured, per_node_from=per_node_from,
                       recompute=opts.recompute, trainer=opts.trainer)
    except OSError as e:  # a full disk: the rows written are whole, run.json says so
        return _cannot_write(record, e)
    console = Console(True)
    fitting = ranked(rows)
    console.lines(top_lines(rows, opts.top, title=(
        f"plan: {model.describe()}; {gpus} GPUs, {per_node} per node ({per_node_from}), "
        f"{memory / 2**30:.1f} GiB per GPU ({memory_from})")))
    for line in given_lines(rows):
        console.log(f"your layout: {line}")
    for warning in inputs.warnings:
        console.log(f"warning: {warning}")
    console.log(f"{len(enumerated(rows))} layouts, {len(fitting)} fit in memory; planned in "
                f"{time.monotonic() - started:.2f} s")
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


def cluster(opts: PlanOptions, inputs: Inputs) -> tuple[int, int, str]:
    """GPUs, GPUs per node and where the second came from."""
    if opts.gpus is None:
        raise OptionError("--gpus", "needed with --from or --fabric and no workers: how many "
                          "GPUs to plan for", "--gpus 1024 --gpus-per-node 8")
    if opts.gpus_per_node is not None:
        per_node, per_node_from = opts.gpus_per_node, "--gpus-per-node"
    elif inputs.fabric is not None and inputs.fabric.gpus_per_node:
        per_node, per_node_from = inputs.fabric.gpus_per_node, f"--fabric {opts.fabric}"
    elif inputs.device == "cpu" and inputs.gpus_per_node:
        # a CPU run's workers per node: how many processes shared its cores, not its GPUs
        raise OptionError("--gpus-per-node", f"the --from runs were measured on the CPU: their "
                          f"{inputs.gpus_per_node} workers a node are no GPU node size: say how "
                          "many GPUs a node has", "--gpus-per-node 8")
    elif inputs.gpus_per_node is None:
        # say what is missing: a fabric's figures with no --from blamed "the --from runs"
        missing = [f"--fabric {opts.fabric} gives no gpus_per_node="] if opts.fabric else []
        if opts.sources:
            missing.insert(0, "the --from runs' topology lists no GPUs")
        raise OptionError("--gpus-per-node", f"{' and '.join(missing) or 'nothing says'}: say "
                          "how many GPUs a node has, with --gpus-per-node"
                          + (" or the fabric's gpus_per_node=" if opts.fabric else ""),
                          "--gpus-per-node 8")
    else:
        per_node, per_node_from = inputs.gpus_per_node, "the --from runs'"
    opts.validate_nodes(opts.gpus, per_node)
    return opts.gpus, per_node, per_node_from
