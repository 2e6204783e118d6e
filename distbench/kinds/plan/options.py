"""`distbench plan`: the layouts (TP inside a node, PP, DP, ZeRO stage, micro-batches) of a
model on a cluster, each one's memory per rank judged and its step time predicted from measured
inputs, ranked. With --from and no workers it is arithmetic on earlier runs, torch-free and done
in seconds; otherwise the workers measure the inputs here (and, with --validate, run the best
layouts for real). docs/plan-model.md gives the model."""

from __future__ import annotations

import math
from dataclasses import dataclass

from distbench.core.dtypes import FLOATS
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
    with_choices,
    with_example,
)
from distbench.core.sizes import SizeError, parse_size
from distbench.kinds.plan.cluster import above_reserve, check_nodes, named_layouts, pure
from distbench.planner.fabrics import MAX_GPUS_PER_NODE
from distbench.planner.gpus import DEFAULT_MFU, GPUS
from distbench.planner.layouts import RECOMPUTE, ZERO_STAGES, parse_zero
from distbench.planner.models import PRESETS, SHAPE_HELP, model_text, parse_model
from distbench.planner.trainers import TRAINERS
from distbench.run.forked_workers import TRAINING

HELP = ("Plan a model's layouts (TP, PP, DP, ZeRO, micro-batches) on a cluster: memory per rank "
        "judged, step time predicted from measured collectives, compute and overlap.")
# the workers validate layouts with training steps (Kind.preload)
PRELOAD = TRAINING
EXAMPLES = (
    "distbench plan --from results/<run> --gpus 1024 --gpus-per-node 8 --model 7b",
    "distbench plan --fabric dgx-a100 --gpus 1024 --model 7b --dtype bfloat16",
    "distbench plan --model layers=4,hidden=128,heads=4,seq=32,batch=16 --workers 4",
)

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
with_choices(_zero, (*map(str, ZERO_STAGES), "all"), many=True)
with_choices(_recompute, (*RECOMPUTE, "all"), many=True)
with_choices(_gpu, tuple(GPUS))


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
    plot: bool = option(True, "Draw plan.png (and with --validate, validation.png). A sweep of "
                        "plans that reads plan.csv turns it off: drawing is most of a plan "
                        "--fabric's time.")

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
            check_nodes(self.gpus, self.gpus_per_node)
            named_layouts(self, self.gpus, self.gpus_per_node)
        if not parse_model("--model", self.model).fused_attention and (self.workers is not None
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
        if pure(self):
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
        check_nodes(gpus, per_node)
        named_layouts(self, gpus, per_node)
        model = parse_model("--model", self.model)
        require_layouts(model, gpus, per_node, self.zero, *(
            ("--gpus", "", "--gpus 1024 --gpus-per-node 8") if self.gpus else
            ("--workers", " (the workers' world)", "--workers 4")))
        if self.validations and (gpus, per_node) != (world, local):
            require_layouts(model, world, local, self.zero, "--validate",
                            f" to validate on the {world} workers", "--workers 4 --validate 3")

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
        return int(points.need(parse_model("--model", self.model), world,
                               self.gpus_per_node or world, self.zero, element_bytes(self.dtype),
                               math.inf if budget is None else budget))
