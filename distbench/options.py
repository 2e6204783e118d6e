"""Resolved, validated options. No torch import: bad input must fail fast, before any worker."""

from __future__ import annotations

import math
import os
import tempfile
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from distbench.accounting import COLLECTIVES
from distbench.sizes import SizeError, parse_sizes


class OptionError(Exception):
    """One bad option: printed as a single line with a valid example, exit code 2."""

    def __init__(self, option: str, message: str, example: str):
        super().__init__(f"{option}: {message} (example: {example})")


DTYPE_ALIASES = {
    "float32": "float32", "fp32": "float32", "float": "float32",
    "float16": "float16", "fp16": "float16", "half": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float64": "float64", "fp64": "float64", "double": "float64",
    "int32": "int32", "int": "int32",
    "int64": "int64", "long": "int64",
    "int8": "int8",
    "uint8": "uint8",
}
DTYPES = tuple(dict.fromkeys(DTYPE_ALIASES.values()))
REDOPS = ("sum", "prod", "max", "min", "avg")
PLACEMENTS = ("out", "in", "both")
BACKENDS = ("auto", "nccl", "gloo")
MAX_TIMEOUT_S = 7 * 24 * 3600


def _pick(option: str, text: str, valid: tuple[str, ...], example: str,
          aliases: dict[str, str] | None = None) -> list[str]:
    """A comma list of names from `valid` (or 'all'), order kept, duplicates dropped."""
    names = [t.strip().lower() for t in str(text).split(",")]
    if names == ["all"]:
        return list(valid)
    out: list[str] = []
    for name in names:
        canon = (aliases or {}).get(name, name)
        if canon not in valid:
            raise OptionError(option, f"unknown value {name!r} (valid: {', '.join(valid)}, all)",
                              example)
        if canon not in out:
            out.append(canon)
    return out


def _one_of(option: str, value: str, valid: tuple[str, ...], example: str) -> str:
    value = str(value).strip().lower()
    if value not in valid:
        raise OptionError(option, f"unknown value {value!r} (valid: {', '.join(valid)})", example)
    return value


def check_writable_dir(option: str, path: Path, example: str) -> Path:
    """Create the directory and prove a file can be written there, before any work starts."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".distbench-probe-"):
            pass
    except OSError as e:
        raise OptionError(option, f"cannot write to {str(path)!r}: {e.strerror or e}",
                          example) from None
    return path


@dataclass(kw_only=True)
class RunOptions:
    """What every command that starts workers takes."""

    out: Path
    backend: str
    timeout: float
    workers: int | None
    argv: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        d = asdict(self)
        d["out"] = str(self.out)
        d.pop("argv")  # run.json records it once, at the top level
        return d

    def check_world(self, world: int) -> None:
        """Options that depend on the number of ranks. Called as soon as it is known: from the
        flags (--workers, or WORLD_SIZE under a launcher), by the local launcher, and once the
        process group exists; raises OptionError."""

    def identity(self) -> dict:
        """What every rank must agree on (out may legitimately differ per node)."""
        d = self.to_json()
        for k in ("out", "workers"):
            d.pop(k)
        return d


@dataclass(kw_only=True)
class SweepOptions(RunOptions):
    """A size sweep with checked results: what collective and p2p share."""

    sizes: list[int]
    dtypes: list[str]
    iters: int | None
    min_time: float
    warmup: int
    check: bool


@dataclass(kw_only=True)
class CollectiveOptions(SweepOptions):
    ops: list[str]
    redops: list[str]
    root: int
    placement: str

    def check_world(self, world: int) -> None:
        if self.root >= world:
            raise OptionError("--root", f"rank {self.root} does not exist in a world of {world}",
                              "--root 0")


@dataclass(kw_only=True)
class P2POptions(SweepOptions):
    patterns: list[str]
    outlier_below: float
    fail_below: float | None

    def check_world(self, world: int) -> None:
        _at_least_two("p2p", world)


def _at_least_two(command: str, world: int) -> None:
    if world < 2:
        raise OptionError("--workers", f"{command} needs at least 2 ranks, got {world}",
                          "--workers 2")


@dataclass(kw_only=True)
class TopoOptions(RunOptions):
    pass


@dataclass(kw_only=True)
class StepOptions(RunOptions):
    """A training-step benchmark (tp, pp): a model shape, a dtype, fixed iteration counts."""

    hidden_size: int
    seq_len: int
    micro_batch_size: int
    layers: int
    dtype: str
    iters: int
    warmup: int
    check: bool


@dataclass(kw_only=True)
class TPOptions(StepOptions):
    ffn_size: int
    heads: int
    blocks: list[str]

    def check_world(self, world: int) -> None:
        if self.heads % world:
            raise OptionError("--heads", f"{self.heads} heads do not split over {world} ranks",
                              f"--heads {world * 4}")
        if self.ffn_size % world:
            raise OptionError("--ffn-size", f"{self.ffn_size} does not split over {world} "
                              "ranks", f"--ffn-size {world * 1024}")


@dataclass(kw_only=True)
class PPOptions(StepOptions):
    schedules: list[str]
    micro_batches: int
    virtual_stages: int

    def check_world(self, world: int) -> None:
        _at_least_two("pp", world)
        stages = world * (self.virtual_stages if "interleaved-1f1b" in self.schedules else 1)
        if self.layers < stages:
            raise OptionError("--layers", f"{self.layers} layers cannot fill {stages} stages",
                              f"--layers {stages}")


def _run_fields(*, backend: str, timeout: float, workers: int | None, argv: list[str]) -> dict:
    # inf would pass `> 0` but cannot become a timedelta (OverflowError in every worker)
    if not (0 < timeout <= MAX_TIMEOUT_S):
        raise OptionError("--timeout", f"must be above 0 and at most {MAX_TIMEOUT_S} seconds "
                          f"(one week), got {timeout}", "--timeout 300")
    if workers is not None and workers < 1:
        raise OptionError("--workers", f"must be at least 1, got {workers}", "--workers 2")
    return dict(backend=_one_of("--backend", backend, BACKENDS, "--backend gloo"),
                timeout=float(timeout), workers=workers, argv=argv)


def _sweep_fields(*, sizes: str, dtype: str, iters: int | None, min_time: float, warmup: int,
                  check: bool, **run) -> dict:
    try:
        size_list = parse_sizes(str(sizes))
    except SizeError as e:
        raise OptionError("--sizes", str(e), "--sizes 8:128M:x2") from None
    if iters is not None and iters <= 0:
        raise OptionError("--iters", f"must be at least 1, got {iters}", "--iters 20")
    # inf passes `> 0` but cannot become an iteration count; nan fails `> 0` already
    if not (min_time > 0 and math.isfinite(min_time)):
        raise OptionError("--min-time", f"must be a number of seconds above 0, got {min_time}",
                          "--min-time 0.2")
    if warmup < 0:
        raise OptionError("--warmup", f"must be 0 or more, got {warmup}", "--warmup 5")
    return dict(sizes=size_list, iters=iters, min_time=float(min_time), warmup=warmup,
                check=check, **_run_fields(**run),
                dtypes=_pick("--dtype", dtype, DTYPES, "--dtype float32,bfloat16",
                             DTYPE_ALIASES))


def _finish(opts, out: Path):
    world = opts.workers or _env_int("WORLD_SIZE")
    if world is not None:
        opts.check_world(world)
    # Last of all checks: it creates the directory, which a run with any other bad option
    # must not leave behind.
    opts.out = check_writable_dir("--out", Path(out), "--out results")
    return opts


def build_collective(*, op: str, redop: str, root: int, placement: str, out: Path,
                     **common) -> CollectiveOptions:
    fields = _sweep_fields(**common)
    if root < 0:
        raise OptionError("--root", f"must be a rank (0 or more), got {root}", "--root 0")
    return _finish(CollectiveOptions(
        ops=_pick("--op", op, COLLECTIVES, "--op all_reduce,all_gather"),
        redops=_pick("--redop", redop, REDOPS, "--redop sum"),
        root=root,
        placement=_one_of("--placement", placement, PLACEMENTS, "--placement both"),
        **fields, out=Path(out)), out)


P2P_PATTERNS = ("ring", "pingpong", "matrix")


def build_p2p(*, pattern: str, outlier_below: float, fail_below: float | None, out: Path,
              **common) -> P2POptions:
    fields = _sweep_fields(**common)
    if not 0 < outlier_below <= 1:
        raise OptionError("--outlier-below", f"must be a fraction in (0, 1], got {outlier_below}",
                          "--outlier-below 0.8")
    if fail_below is not None and not 0 < fail_below <= 1:
        raise OptionError("--fail-below", f"must be a fraction in (0, 1], got {fail_below}",
                          "--fail-below 0.8")
    return _finish(P2POptions(
        patterns=_pick("--pattern", pattern, P2P_PATTERNS, "--pattern ring,pingpong"),
        outlier_below=float(outlier_below), fail_below=fail_below, **fields, out=Path(out)), out)


def build_topo(*, out: Path, **run) -> TopoOptions:
    return _finish(TopoOptions(**_run_fields(**run), out=Path(out)), out)


def _positive(option: str, value: int, example: str) -> int:
    if value < 1:
        raise OptionError(option, f"must be at least 1, got {value}", example)
    return value


def _step_fields(*, hidden_size: int, seq_len: int, micro_batch_size: int, layers: int,
                 dtype: str, iters: int, warmup: int, check: bool, **run) -> dict:
    fields = _run_fields(**run)
    dtypes = _pick("--dtype", dtype, ("float32", "bfloat16", "float16", "float64"),
                   "--dtype bfloat16", DTYPE_ALIASES)
    if len(dtypes) != 1:
        raise OptionError("--dtype", "takes one floating-point dtype", "--dtype bfloat16")
    if warmup < 0:
        raise OptionError("--warmup", f"must be 0 or more, got {warmup}", "--warmup 2")
    return dict(
        hidden_size=_positive("--hidden-size", hidden_size, "--hidden-size 1024"),
        seq_len=_positive("--seq-len", seq_len, "--seq-len 512"),
        micro_batch_size=_positive("--micro-batch-size", micro_batch_size,
                                   "--micro-batch-size 1"),
        layers=_positive("--layers", layers, "--layers 2"),
        dtype=dtypes[0], iters=_positive("--iters", iters, "--iters 10"), warmup=warmup,
        check=check, **fields)


TP_BLOCKS = ("mlp", "attention")


def build_tp(*, ffn_size: int, heads: int, block: str, out: Path, **common) -> TPOptions:
    fields = _step_fields(**common)
    _positive("--ffn-size", ffn_size, "--ffn-size 4096")
    _positive("--heads", heads, "--heads 16")
    if fields["hidden_size"] % heads:
        raise OptionError("--heads", f"{heads} heads do not divide --hidden-size "
                          f"{fields['hidden_size']}", "--heads 16 --hidden-size 1024")
    blocks = ["mlp", "attention"] if block.strip().lower() == "both" else _pick(
        "--block", block, TP_BLOCKS, "--block both")
    return _finish(TPOptions(ffn_size=ffn_size, heads=heads, blocks=blocks, **fields,
                             out=Path(out)), out)


PP_SCHEDULES = ("naive", "gpipe", "1f1b", "interleaved-1f1b")


def build_pp(*, schedule: str, micro_batches: int, virtual_stages: int, out: Path,
             **common) -> PPOptions:
    fields = _step_fields(**common)
    schedules = _pick("--schedule", schedule, PP_SCHEDULES, "--schedule gpipe,1f1b")
    _positive("--micro-batches", micro_batches, "--micro-batches 8")
    _positive("--virtual-stages", virtual_stages, "--virtual-stages 2")
    return _finish(PPOptions(schedules=schedules, micro_batches=micro_batches,
                             virtual_stages=virtual_stages, **fields, out=Path(out)), out)


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else None


def load_config(path: Path, command: str, known: set[str]) -> dict:
    """Options from a TOML file: top-level keys, or a [command] table. Keys as on the command line
    (`min-time` or `min_time`); list values are joined with commas."""
    example = "--config configs/smoke-gloo.toml"
    try:
        data = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise OptionError("--config", f"no such file {str(path)!r}", example) from None
    except OSError as e:
        raise OptionError("--config", f"cannot read {str(path)!r}: {e.strerror}", example) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise OptionError("--config", f"{path} is not valid TOML: {e}", example) from None
    table = data.get(command, data)
    if not isinstance(table, dict):
        raise OptionError("--config", f"[{command}] in {path} must be a table", example)
    out: dict = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name not in known:
            if isinstance(value, dict):  # another command's table
                continue
            valid = ", ".join(sorted(k.replace("_", "-") for k in known))
            raise OptionError("--config", f"unknown key {key!r} in {path} (valid: {valid})",
                              example)
        if isinstance(value, list):
            value = ",".join(str(v) for v in value)
        out[name] = value
    return out
