"""The option schema: each command's options are one dataclass whose fields carry their default,
help text and validation (`option()`); the command line, the TOML `--config` keys and run.json's
`options` all derive from it. The checks are in core/option_checks.py, the config file's reading
in core/config_file.py; both are named here too, for the commands that declare options. No torch
import: bad input must fail fast, before any worker."""

from __future__ import annotations

import math
import typing
from collections.abc import Callable
from dataclasses import Field, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from distbench.core.config_file import load_config
from distbench.core.dtypes import ALIASES as DTYPE_ALIASES
from distbench.core.dtypes import FLOATS as FLOAT_DTYPES
from distbench.core.dtypes import NAMES as DTYPES
from distbench.core.dtypes import element_bytes
from distbench.core.noise import MAX_REPS, REPS
from distbench.core.option_checks import (
    MAX_ITERS,
    OptionError,
    Validator,
    at_least,
    check_writable_dir,
    choices_of,
    fraction,
    headroom,
    iterations,
    one_float_dtype,
    one_of,
    optional,
    parse_headroom,
    pick,
    require,
    sizes,
    with_choices,
    with_example,
)

# Named here for the commands and the command line, defined in the modules split from this one.
__all__ = [
    "DTYPE_ALIASES", "DTYPES", "FLOAT_DTYPES", "MAX_ITERS", "OptionError", "Validator", "at_least",
    "check_writable_dir", "choices_of", "fraction", "headroom", "iterations", "load_config",
    "one_float_dtype", "one_of", "optional", "parse_headroom", "pick", "require", "sizes",
    "with_choices", "with_example"]


def example_of(spec: Spec) -> str | None:
    return getattr(spec.check, "example", None)


@dataclass(frozen=True)
class Spec:
    """How one option appears on the command line and in a config file."""

    help: str | Callable[[], str]  # a function when the text depends on a registry
    flag: str  # the command-line and TOML name (underscores; dashes on the command line)
    check: Validator | None
    cli_type: Any  # what the command line parses into, when the stored field differs
    show_default: bool


def option(default: Any, help: str | Callable[[], str], *, flag: str | None = None,
           check: Validator | None = None, cli_type: Any = None, show_default: bool = True) -> Any:
    """A dataclass field that is a command-line option. `default` is the value as typed on the
    command line; `check` validates it and turns it into the stored value."""
    return field(default=default, metadata={"option": Spec(help, flag or "", check, cli_type,
                                                           show_default)})


def spec_of(f: Field) -> Spec | None:
    spec = f.metadata.get("option")
    return None if spec is None else Spec(spec.help, spec.flag or f.name, spec.check,
                                          spec.cli_type, spec.show_default)


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def negatable(f: Field) -> bool:
    """A bool option on by default: the command line turns it off with --no-NAME. One off by
    default is a plain flag that only turns it on (--once, never --no-once)."""
    return f.default is True


BACKENDS = ("auto", "nccl", "gloo")
MAX_TIMEOUT_S = 7 * 24 * 3600
DEFAULT_TIMEOUT_S = 300.0


# ---------------------------------------------------------------------------------------------
# The options every command shares

def at_least_two(command: str, world: int) -> None:
    if world < 2:
        raise OptionError("--workers", f"{command} needs at least 2 ranks, got {world}",
                          "--workers 2")


@dataclass(kw_only=True)
class RunOptions:
    """What every command that starts workers takes."""

    # read as text: a Path would turn "" into "." and write into the current directory
    out: Path = option("results", "Parent directory of the run directory.", cli_type=str,
                       check=require(lambda v: str(v).strip() != "", "must name a directory, "
                                     "got an empty path", "--out results", Path))
    backend: str = option("auto", "auto (nccl with CUDA, else gloo), nccl, gloo.",
                          check=one_of(BACKENDS, "--backend gloo"))
    # inf would pass `> 0` but cannot become a timedelta (OverflowError in every worker)
    timeout: float = option(
        DEFAULT_TIMEOUT_S, "Seconds a rank may wait on its peers before the run is ended.",
        check=require(lambda v: 0 < v <= MAX_TIMEOUT_S, f"must be above 0 and at most "
                      f"{MAX_TIMEOUT_S} seconds (one week), got {{value}}", "--timeout 300",
                      float))
    workers: int | None = option(
        None, "Local workers to start; not under a launcher (torchrun, srun), which starts the "
        "ranks itself. Default: one per GPU, or 2 on CPU.",
        check=at_least(1, "--workers 2", optional=True), show_default=False)
    argv: list[str] = field(default_factory=list)  # as typed; run.json records it at top level

    def validate(self) -> None:
        """Rules between fields, once each field is valid; raises OptionError."""

    def check_world(self, world: int) -> None:
        """Options that depend on the number of ranks. Called as soon as it is known: from the
        flags (--workers, or WORLD_SIZE under a launcher), by the local launcher, and once the
        process group exists; raises OptionError."""

    def check_backend(self, backend: str) -> None:
        """Options that depend on the backend `--backend auto` resolves to (needs torch): called
        by the local launcher before any worker starts, and by each rank at startup; raises
        OptionError."""

    def host_bytes(self, backend: str, world: int) -> int:
        """Bytes each local worker holds in host memory beyond a bare worker's (buffers on
        gloo, a model on CPU): what the local launcher checks against this machine's memory
        before it starts `world` workers."""
        return 0

    # The flags host_bytes grows with, and a valid example: what a refusal names.
    SIZED_BY = ("", "")

    def to_json(self) -> dict:
        d = asdict(self)
        d["out"] = str(self.out)
        d.pop("argv")
        return d

    def identity(self) -> dict:
        """What every rank must agree on (out may legitimately differ per node)."""
        d = self.to_json()
        for k in ("out", "workers"):
            d.pop(k)
        return d


@dataclass(kw_only=True)
class SweepOptions(RunOptions):
    """A size sweep with checked results: what collective and p2p share."""

    sizes: list[int] = option(
        "8:128M:x2", "Per-rank buffer sizes: 8:128M:x2 (factor), 1K:64K:+4K (step) or 1K,4K "
        "(list). Binary suffixes.", check=sizes("--sizes 8:128M:x2"), cli_type=str)
    dtypes: list[str] = option(
        "float32", f"{', '.join(DTYPES)}; comma list or 'all'.", flag="dtype",
        check=pick(DTYPES, "--dtype float32,bfloat16", DTYPE_ALIASES),
        cli_type=str)
    iters: int | None = option(None, "Timed iterations per size. Default: calibrated to "
                               "--min-time.", check=iterations("--iters 20", optional=True),
                               show_default=False)
    reps: int = option(
        REPS, "Separated repetitions of each size's timed iterations, each after a barrier: "
        "their spread is the noise compare and --baseline must see beyond.",
        check=require(lambda v: 1 <= v <= MAX_REPS, f"must be 1 to {MAX_REPS}, got {{value}}",
                      "--reps 5", int))
    # inf passes `> 0` but cannot become an iteration count; nan fails `> 0` already
    min_time: float = option(
        0.1, "Seconds of timed work per size when --iters is not given.",
        check=require(lambda v: v > 0 and math.isfinite(v), "must be a number of seconds above "
                      "0, got {value}", "--min-time 0.2", float))
    warmup: int = option(5, "Untimed iterations before each size.",
                         check=at_least(0, "--warmup 5"))
    check: bool = option(True, "Check results against independently computed values.")
    headroom: str = option(
        "512M", "Device memory each rank leaves free for what NCCL allocates itself (peer "
        "buffers, NVLS): a size (512M) or a fraction of the device (0.05). GPU only.",
        check=headroom("--headroom 1G"))
    cuda_graph: bool = option(
        False, "Capture each size's timed ops in one CUDA graph and replay it, as nccl-tests -G "
        "does: the host's launch cost leaves the time of small messages. nccl only.")

    def host_bytes(self, backend: str, world: int) -> int:
        if backend == "nccl":  # on the GPU, where a size that does not fit is a skipped row
            return 0
        # the buffers for the largest size, and the check's expected values beside them
        return max(self.sizes) * (self.buffer_multiple(world) + 1)

    SIZED_BY = ("--sizes", "--sizes 8:128M:x2")

    def buffer_multiple(self, world: int) -> int:
        """A rank's buffers, in multiples of the per-rank size, at the largest size."""
        return 2

    def validate(self) -> None:
        if self.cuda_graph and self.backend == "gloo":
            self.check_backend("gloo")

    def check_backend(self, backend: str) -> None:
        if self.cuda_graph and backend != "nccl":
            raise OptionError("--cuda-graph", f"needs CUDA GPUs and the nccl backend; this run "
                              f"would use {backend}", "--cuda-graph --backend nccl")


@dataclass(kw_only=True)
class StepOptions(RunOptions):
    """A training-step benchmark (tp, pp): a model shape, a dtype, fixed iteration counts."""

    hidden_size: int = option(1024, "Model hidden size.",
                              check=at_least(1, "--hidden-size 1024"))
    seq_len: int = option(512, "Sequence length (tokens per sample).",
                          check=at_least(1, "--seq-len 512"))
    micro_batch_size: int = option(1, "Samples per micro-batch.",
                                   check=at_least(1, "--micro-batch-size 1"))
    layers: int = option(2, "Transformer layers (blocks) in the stack.",
                         check=at_least(1, "--layers 2"))
    dtype: str = option("float32", f"{', '.join(FLOAT_DTYPES[:-1])} or {FLOAT_DTYPES[-1]}.",
                        check=one_float_dtype)
    iters: int = option(10, "Timed training steps.", check=iterations("--iters 10"))
    warmup: int = option(2, "Untimed steps first.", check=at_least(0, "--warmup 2"))
    check: bool = option(True, "Compare outputs and gradients with a single-rank reference on "
                         "the same seed.")

    SIZED_BY = ("--hidden-size", "--hidden-size 1024 --layers 2")

    def host_bytes(self, backend: str, world: int) -> int:
        """On CPU, a rough bound on one rank's model: weights, gradients and AdamW's states
        per parameter, and twice the activations kept for the backward pass, for every layer
        unsharded (the reference replica is whole) of both block kinds, as planner.models and
        planner.memory count them."""
        if backend == "nccl":
            return 0
        from distbench.core.transformer import (
            attention_activation_bytes,
            attention_params,
            mlp_activation_bytes,
            mlp_params,
            optimizer_bytes_per_param,
        )

        h, elt = self.hidden_size, element_bytes(self.dtype)
        ffn, heads = getattr(self, "ffn_size", 4 * h), getattr(self, "heads", 1)
        params = self.layers * (attention_params(h, heads, heads) + mlp_params(h, ffn, False))
        tokens = self.seq_len * self.micro_batch_size * getattr(self, "micro_batches", 1)
        activations = self.layers * tokens * (
            attention_activation_bytes(h, heads, heads, 1, elt)
            + mlp_activation_bytes(h, ffn, False, 1, elt))
        return int(params * (2 * elt + optimizer_bytes_per_param(elt)) + 2 * activations)


def redefault(options: type, name: str, default) -> Any:
    """`options`' field `name` (its help and check) with another default, for a command whose
    sensible size differs from the shared one."""
    base = options.__dataclass_fields__[name]
    return field(default=default, metadata=base.metadata)


# ---------------------------------------------------------------------------------------------
# From raw values (command line, config file) to validated options

def option_fields(cls: type) -> list[tuple[Field, Spec]]:
    """The options of `cls` in the order --help lists them: the command's own first, then those
    it shares, the most general last."""
    by_owner: dict[type, list[tuple[Field, Spec]]] = {}
    order = [k for k in cls.__mro__ if "__dataclass_fields__" in vars(k)]
    for f in fields(cls):
        spec = spec_of(f)
        if spec is None:
            continue
        owner = next(k for k in reversed(order) if f.name in vars(k).get("__annotations__", {}))
        by_owner.setdefault(owner, []).append((f, spec))
    return [item for k in order for item in by_owner.get(k, [])]


def path_options(cls: type) -> frozenset[str]:
    """The options of `cls` declared as a Path (or Path | None), they name a file: by their
    flag's name, as cli_types' callers key them."""
    hints = typing.get_type_hints(cls)
    return frozenset(spec.flag for f, spec in option_fields(cls)
                     if hints[f.name] is Path or Path in typing.get_args(hints[f.name]))


def cli_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: spec.cli_type or hints[f.name] for f, spec in option_fields(cls)}


def build(cls: type, raw: dict[str, Any], argv: list[str], world: int | None = None,
          machine: Callable[[Any, int | None], None] | None = None):
    """Validated options from raw values keyed by flag name (missing ones take the default).
    Checked in field order, the options every command shares first, so that of several bad
    options the same one is named whichever command is run; then `machine(opts, world)` (what
    this machine can hold); --out is created last of all, so a run with any other bad option leaves
    nothing behind. `world`: the ranks a launcher started, where one did; --workers says it
    otherwise."""
    values = {}
    for f in fields(cls):
        spec = spec_of(f)
        if spec is None:
            continue
        value = raw.get(spec.flag, f.default)
        values[f.name] = spec.check(flag(spec.flag), value) if spec.check else value
    out = values.pop("out")
    opts = cls(**values, out=out, argv=argv)
    opts.validate()
    world = opts.workers or world
    if world is not None:
        opts.check_world(world)
    if machine is not None:
        machine(opts, world)
    opts.out = check_writable_dir("--out", out, "--out results")
    return opts


def to_argv(opts) -> list[str]:
    """Flags that make `build` give these options again: what the local launcher hands its
    workers, so they run exactly what was validated here (a --config read from a pipe cannot
    be read twice). --workers goes too: the workers record it in run.json."""
    flags: list[str] = []
    for f, spec in option_fields(type(opts)):
        value = getattr(opts, f.name)
        if value is None:
            continue
        name = flag(spec.flag)
        if isinstance(value, bool):
            if value:
                flags.append(name)
            elif negatable(f):  # off by default needs no flag: a plain one has no --no- form
                flags.append(f"--no-{name[2:]}")
        else:
            text = ",".join(str(v) for v in value) if isinstance(value, list) else str(value)
            flags += [name, text]
    return flags
