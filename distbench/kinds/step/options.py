"""`distbench step`: one training step of a transformer stack laid out on a tp x pp x dp device
mesh (TP through parallelize_module, sequence-parallel by default, PP through
torch.distributed.pipelining's 1F1B or interleaved 1F1B (--virtual-stages), DP through DDP,
ZeroRedundancyOptimizer or FSDP2), one row per layout: step time, compute-only time, each
dimension's communication alone and exposed, the bubble, the state per rank and a check against
a single-rank reference."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from distbench.core.options import (
    OptionError,
    RunOptions,
    StepOptions,
    at_least,
    one_of,
    option,
    redefault,
    with_choices,
    with_example,
)
from distbench.planner.layouts import (
    GRAD_SYNC,
    RECOMPUTE,
    ZERO_STAGES,
    Layout,
    default_micro_batches,
    divisors,
    parse_zero,
    problems,
)
from distbench.planner.models import EXAMPLE as MODEL_EXAMPLE
from distbench.planner.models import PRESETS, SHAPE_HELP, ModelSpec, model_text, parse_model

if TYPE_CHECKING:
    pass

HELP = ("One training step of a transformer stack on a tp x pp x dp mesh: step, compute and "
        "communication per dimension, bubble, memory per rank.")
EXAMPLES = (
    "distbench step --workers 4       # every tp x pp x dp of 4 ranks",
    "distbench step --workers 4 --tp 2 --pp 2 --zero 0,1",
    "distbench step --workers 4 --pp 2 --virtual-stages 2   # interleaved 1F1B",
    "distbench step --workers 4 --tp 2 --no-sp --recompute op --grad-sync micro",
    "distbench step --model layers=8,hidden=256,heads=8,seq=64,batch=32",
)

ZERO_EXAMPLE = "--zero 0,1,3"
GRAD_SYNC_EXAMPLE = "--grad-sync last"


def _model(option_name: str, text) -> str:
    """Stored as text (a preset's name or the shape), so run.json's options serialize. The
    step runs fused attention (scaled_dot_product_attention): a shape that says unfused would
    be trained otherwise than it says."""
    spec = parse_model(option_name, text)
    if not spec.fused_attention:
        raise OptionError(option_name, "the step runs fused attention "
                          "(scaled_dot_product_attention); attention=unfused is for "
                          "`plan --from` or `--fabric` (Megatron-LM before FlashAttention)",
                          MODEL_EXAMPLE)
    return model_text(spec)


def _zero_stages(option_name: str, text) -> list[int]:
    return parse_zero(option_name, text, ZERO_EXAMPLE)


def _grad_sync(option_name: str, text) -> str | None:
    """One of GRAD_SYNC, or None (not given): each layout's wrapper's default."""
    return None if text is None else one_of(GRAD_SYNC, GRAD_SYNC_EXAMPLE)(option_name, text)


with_example(_model, MODEL_EXAMPLE)
with_choices(with_example(_zero_stages, ZERO_EXAMPLE), (*map(str, ZERO_STAGES), "all"),
             many=True)
with_choices(with_example(_grad_sync, GRAD_SYNC_EXAMPLE), GRAD_SYNC)


@dataclass(kw_only=True)
class StepCommandOptions(RunOptions):
    model: str = option("toy", f"A preset ({', '.join(PRESETS)}) or a shape: {SHAPE_HELP}. "
                        "batch: samples per step over all replicas.", check=_model)
    tp: int | None = option(None, "Tensor-parallel ranks. With none of --tp, --pp, --dp: every "
                            "layout of the world the model fits.",
                            check=at_least(1, "--tp 2", optional=True), show_default=False)
    pp: int | None = option(None, "Pipeline stages (1F1B; interleaved with --virtual-stages).",
                            check=at_least(1, "--pp 2", optional=True), show_default=False)
    dp: int | None = option(None, "Data-parallel replicas. Default: the ranks --tp and --pp "
                            "leave.", check=at_least(1, "--dp 2", optional=True),
                            show_default=False)
    zero: list[int] = option("0", "ZeRO stages (0 DDP, 1 +ZeroRedundancyOptimizer, 2/3 FSDP2); "
                             "comma list or 'all'; above 0 only where dp > 1.",
                             check=_zero_stages, cli_type=str)
    micro_batches: int | None = option(
        None, "Micro-batches per step. Default: 1 without a pipeline, else the fewest from "
        "2 x pp up that split a replica's batch.", check=at_least(1, "--micro-batches 4",
                                                                  optional=True),
        show_default=False)
    virtual_stages: int = option(
        1, "Model chunks per pipeline rank: above 1, interleaved 1F1B (torch's "
        "ScheduleInterleaved1F1B; rank r holds stages r, r + pp, ...). Megatron's "
        "other form, L layers per virtual pipeline stage, is V = layers / (pp x L). Needs "
        "pp > 1, pp x V dividing the layers and micro-batches a multiple of pp.",
        check=at_least(1, "--virtual-stages 2"))
    recompute: str = option("none", "Activation recomputation: none, selective (the attention "
                            "core checkpointed), op (torchtitan's per-op selective: every "
                            "second matmul and the cheap ops rerun) or full (every layer "
                            "checkpointed).", check=one_of(RECOMPUTE, "--recompute full"))
    recompute_layers: int = option(
        0, "With --recompute full: only the first k layers of each pipeline stage checkpointed "
        "(Megatron's --recompute-method block --recompute-num-layers k); 0: all.",
        check=at_least(0, "--recompute-layers 1"))
    sp: bool = option(
        True, "Sequence parallelism: with tp > 1, the layers' input and output sharded along "
        "the sequence over the TP ranks (Megatron's and torchtitan's): TP's all-reduces become "
        "all-gathers and reduce-scatters.")
    grad_sync: str | None = option(
        None, "With replicas and several micro-batches, when the gradients are synced: micro "
        "(after every micro-batch) or last (on the last only: DDP's no_sync, FSDP2's gradient "
        "sync off before it). Default: micro at ZeRO 2/3 (FSDP2's), last at 0/1 (DDP's).",
        check=_grad_sync, cli_type=str, show_default=False)
    dtype: str = redefault(StepOptions, "dtype", "float32")
    iters: int = redefault(StepOptions, "iters", 10)
    warmup: int = redefault(StepOptions, "warmup", 2)
    check: bool = redefault(StepOptions, "check", True)

    SIZED_BY = ("--model", "--model toy")

    def check_world(self, world: int) -> None:
        if self.recompute_layers and self.recompute != "full":
            raise OptionError("--recompute-layers", f"{self.recompute_layers} counts the layers "
                              "full recomputation checkpoints in each stage; --recompute is "
                              f"{self.recompute}", "--recompute full --recompute-layers 1")
        shapes = shapes_of(self, world)
        if not shapes:
            if self.recompute_layers:
                raise OptionError("--recompute-layers", f"no tp x pp x dp layout of {world} "
                                  f"ranks has {self.recompute_layers} layers in each stage of "
                                  f"{self.model}", "--recompute full --recompute-layers 1")
            if self.virtual_stages > 1:
                raise OptionError("--virtual-stages", f"no tp x pp x dp layout of {world} "
                                  f"ranks runs {self.model} at {self.virtual_stages} virtual "
                                  "stages (pp > 1, pp x V dividing the layers)",
                                  "--pp 2 --virtual-stages 2")
            raise OptionError("--model", f"no tp x pp x dp layout of {world} ranks fits "
                              f"{self.model}", "--model toy")
        named = self._named("")[0]
        for t, p, d in shapes:
            if 0 in (t, p, d):  # the one left unset cannot take what the others leave
                given = [f"{k} {v}" for k in ("tp", "pp", "dp")
                         if (v := getattr(self, k)) is not None]
                raise OptionError(named, f"{' x '.join(given)} does not divide the "
                                  f"{world} ranks", f"--tp {world} --pp 1 --dp 1")
            if t * p * d != world:
                raise OptionError(named, f"tp x pp x dp = {t} x {p} x {d} must be the "
                                  f"{world} ranks", f"--tp {world} --pp 1 --dp 1")
        layouts, _ = layouts_of(self, world)
        if not layouts:
            raise OptionError("--zero", f"ZeRO {','.join(map(str, self.zero))} shards over "
                              "replicas, and no layout asked for has dp > 1", "--zero 0,1")
        model = model_of(self)
        for layout in layouts:
            why = problems(layout, model)
            if why:
                named, example = self._named(why[0])
                raise OptionError(named, f"{layout.label()}: {why[0]}", example)

    def _named(self, why: str) -> tuple[str, str]:
        """The options a layout's problem `why` comes from, and a valid example."""
        if why.startswith("recompute_layers"):
            return "--recompute-layers", "--recompute full --recompute-layers 1"
        named = [f"--{k}" for k in ("tp", "pp", "dp") if getattr(self, k) is not None]
        if why.startswith("sequence parallelism"):
            return "/".join([*named, "--sp"]), "--no-sp"
        if self.virtual_stages > 1:
            named.append("--virtual-stages")
        example = "--tp 1 --pp 2 --virtual-stages 2 --micro-batches 4" \
            if self.virtual_stages > 1 else "--tp 2 --pp 2 --dp 1 --micro-batches 4"
        return "/".join(named) or "--model", example

    def host_bytes(self, backend: str, world: int) -> int:
        """On CPU, per rank: the most one rank of a layout asked for holds in a step
        (planner.memory.held_by_step), and with --check the single-rank reference beside it (the
        whole model on the whole batch, where it is small enough to run: step3d's
        CHECK_MAX_FLOPS, 1e10, not imported here: it would bring torch in)."""
        if backend == "nccl":
            return 0
        from distbench.core.dtypes import element_bytes
        from distbench.planner.memory import held_by_step

        model, elt = model_of(self), element_bytes(self.dtype)
        layouts, _ = layouts_of(self, world)
        need = max((held_by_step(model, lay, elt) for lay in layouts), default=0.0)
        if self.check and model.layers * model.flops_per_layer(model.batch * model.seq_len) \
                <= 1e10:
            need += held_by_step(model, Layout(tp=1, pp=1, dp=1), elt)
        return int(need)


def trained(model: ModelSpec) -> ModelSpec:
    """What `step` trains of `model`: its layers on hidden-size samples. It builds no embedding
    or LM head, so a vocabulary is left out (said in the run's log)."""
    return replace(model, vocab=0)


# What the options select, for the checks above and for the run (kinds/step/body.py)

def model_of(opts) -> ModelSpec:
    """The model --model names, as step trains it."""
    return trained(parse_model("--model", opts.model))

def shapes_of(opts, world: int) -> list[tuple[int, int, int]]:
    """The (tp, pp, dp) asked for. Given some of them, the first unset of dp, tp, pp takes
    what the others leave and any other unset one is 1; given none, every factorization of
    the world the model fits (by problems(), at ZeRO 0)."""
    given = {"tp": opts.tp, "pp": opts.pp, "dp": opts.dp}
    if all(v is None for v in given.values()):
        model = model_of(opts)
        out = []
        for t in divisors(world):
            for p in divisors(world // t):
                d = world // (t * p)
                m = opts.micro_batches or default_micro_batches(model, p, d,
                                                                opts.virtual_stages)
                if not problems(layout_with(opts, t, p, d, 0, m), model):
                    out.append((t, p, d))
        return out
    fill = next(k for k in ("dp", "tp", "pp") if given[k] is None) \
        if None in given.values() else None
    known = 1
    for v in given.values():
        if v is not None:
            known *= v
    values = {k: (v if v is not None else (world // known if k == fill else 1))
              for k, v in given.items()}
    if fill is not None and world % known:
        values[fill] = 0  # refused by check_world
    return [(values["tp"], values["pp"], values["dp"])]

def layouts_of(opts, world: int) -> tuple[list[Layout], list[str]]:
    """Every layout to run, in order, and a note for each ZeRO stage left out where dp is 1."""
    model = model_of(opts)
    out: list[Layout] = []
    notes: list[str] = []
    for t, p, d in shapes_of(opts, world):
        v = opts.virtual_stages
        m = opts.micro_batches or default_micro_batches(model, p, d, v)
        stages = [z for z in opts.zero if d > 1 or z == 0]
        dropped = [z for z in opts.zero if z not in stages]
        if dropped:
            notes.append(f"tp {t} pp {p} dp {d}: ZeRO {', '.join(map(str, dropped))} "
                         "left out (it shards over replicas; dp is 1)")
        out += [layout_with(opts, t, p, d, z, m) for z in stages]
    return out, notes

def layout_with(opts, tp: int, pp: int, dp: int, zero: int, micro_batches: int) -> Layout:
    """The layout (tp, pp, dp, zero, m) with the keys every layout of the run shares."""
    return Layout(tp=tp, pp=pp, dp=dp, zero=zero, micro_batches=micro_batches,
                  recompute=opts.recompute, virtual_stages=opts.virtual_stages,
                  sp=opts.sp, recompute_layers=opts.recompute_layers,
                  grad_sync=opts.grad_sync or "")
