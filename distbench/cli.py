"""Command line: parse, validate, hand off. No torch import here, so --help and option errors
stay fast; the heavy modules load only once the options are known to be good."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from distbench.options import (
    OptionError,
    build_collective,
    build_p2p,
    build_pp,
    build_topo,
    build_tp,
    load_config,
)

app = typer.Typer(
    name="distbench",
    help="Benchmarks for the communication distributed training runs on.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

EXIT_BAD_INPUT = 2


def _config_callback(ctx: typer.Context, param: typer.CallbackParam, value: Path | None):
    if value is not None:
        known = {p.name for p in ctx.command.params if p.name and p.name != "config"}
        ctx.default_map = {**(ctx.default_map or {}),
                           **load_config(value, ctx.command.name or "", known)}
    return value


# Options shared by the commands, declared once.
Sizes = Annotated[str, typer.Option(
    help="Per-rank buffer sizes: 8:128M:x2 (factor), 1K:64K:+4K (step) or 1K,4K (list). "
         "Binary suffixes.")]
Dtype = Annotated[str, typer.Option(
    help="float32, float16, bfloat16, float64, int32, int64, int8, uint8; comma list or 'all'.")]
Iters = Annotated[int | None, typer.Option(
    help="Timed iterations per size. Default: calibrated to --min-time.", show_default=False)]
MinTime = Annotated[float, typer.Option(
    help="Seconds of timed work per size when --iters is not given.")]
Warmup = Annotated[int, typer.Option(help="Untimed iterations before each size.")]
Check = Annotated[bool, typer.Option(help="Check results against independently computed values.")]
Out = Annotated[Path, typer.Option(help="Parent directory of the run directory.")]
Backend = Annotated[str, typer.Option(help="auto (nccl with CUDA, else gloo), nccl, gloo.")]
Timeout = Annotated[float, typer.Option(
    help="Seconds a rank may wait on its peers before the run is ended.")]
Workers = Annotated[int | None, typer.Option(
    help="Local workers to start when not under torchrun. Default: one per GPU, or 2 on CPU.",
    show_default=False)]
Config = Annotated[Path | None, typer.Option(
    help="TOML file of options; flags on the command line win.", is_eager=True,
    callback=_config_callback)]


def _dispatch(command: str, opts) -> None:
    from distbench.launch import dispatch

    raise typer.Exit(dispatch(command, opts))


@app.callback()
def _root() -> None:
    """Run a benchmark under torchrun, or alone (it then starts local workers itself)."""


@app.command()
def collective(
    op: Annotated[str, typer.Option(
        help="Collectives, comma-separated, or 'all': all_reduce, reduce_scatter, all_gather, "
             "broadcast, reduce, all_to_all, gather, scatter.")] = "all_reduce",
    sizes: Sizes = "8:128M:x2",
    dtype: Dtype = "float32",
    redop: Annotated[str, typer.Option(
        help="sum, prod, max, min, avg; comma list or 'all'.")] = "sum",
    root: Annotated[int, typer.Option(
        help="Root rank for broadcast, reduce, gather, scatter.")] = 0,
    placement: Annotated[str, typer.Option(
        help="out, in or both: out-of-place or in-place buffers.")] = "out",
    iters: Iters = None,
    min_time: MinTime = 0.1,
    warmup: Warmup = 5,
    check: Check = True,
    out: Out = Path("results"),
    backend: Backend = "auto",
    timeout: Timeout = 300.0,
    workers: Workers = None,
    config: Config = None,
) -> None:
    """Time collectives over a size sweep; bus bandwidth as nccl-tests reports it."""
    _dispatch("collective", build_collective(
        op=op, sizes=sizes, dtype=dtype, redop=redop, root=root, placement=placement,
        iters=iters, min_time=min_time, warmup=warmup, check=check, out=out, backend=backend,
        timeout=timeout, workers=workers, argv=sys.argv[1:]))


@app.command()
def p2p(
    pattern: Annotated[str, typer.Option(
        help="ring (send to r+1, receive from r-1), pingpong (pairs i, i+n/2: one-way latency), "
             "matrix (every ordered pair alone); comma list or 'all'.")] = "ring",
    sizes: Sizes = "8:128M:x2",
    dtype: Dtype = "float32",
    outlier_below: Annotated[float, typer.Option(
        help="matrix: name links below this fraction of their class median "
             "(intra-node and inter-node links judged apart).")] = 0.8,
    fail_below: Annotated[float | None, typer.Option(
        help="matrix: exit 4 when a link is below this fraction of its class median.",
        show_default=False)] = None,
    iters: Iters = None,
    min_time: MinTime = 0.1,
    warmup: Warmup = 5,
    check: Check = True,
    out: Out = Path("results"),
    backend: Backend = "auto",
    timeout: Timeout = 300.0,
    workers: Workers = None,
    config: Config = None,
) -> None:
    """Point-to-point: ring, ping-pong latency, and the pairwise link matrix with outliers."""
    _dispatch("p2p", build_p2p(
        pattern=pattern, sizes=sizes, dtype=dtype, outlier_below=outlier_below,
        fail_below=fail_below, iters=iters, min_time=min_time, warmup=warmup, check=check,
        out=out, backend=backend, timeout=timeout, workers=workers, argv=sys.argv[1:]))


@app.command()
def topo(
    out: Out = Path("results"),
    backend: Backend = "auto",
    timeout: Timeout = 300.0,
    config: Config = None,
) -> None:
    """Topology snapshot (nvidia-smi topo -m, NVML inventory, CPU/NUMA): this machine, or one
    per node under torchrun."""
    _dispatch("topo", build_topo(out=out, backend=backend, timeout=timeout, workers=None,
                                 argv=sys.argv[1:]))


HiddenSize = Annotated[int, typer.Option(help="Model hidden size.")]
SeqLen = Annotated[int, typer.Option(help="Sequence length (tokens per sample).")]
MicroBatchSize = Annotated[int, typer.Option(help="Samples per micro-batch.")]
Layers = Annotated[int, typer.Option(help="Transformer layers (blocks) in the stack.")]
StepDtype = Annotated[str, typer.Option(help="float32, bfloat16, float16 or float64.")]
StepIters = Annotated[int, typer.Option(help="Timed training steps.")]
StepWarmup = Annotated[int, typer.Option(help="Untimed steps first.")]
StepCheck = Annotated[bool, typer.Option(
    help="Compare outputs and gradients with a single-rank reference on the same seed.")]


@app.command()
def tp(
    block: Annotated[str, typer.Option(help="mlp, attention or both.")] = "both",
    hidden_size: HiddenSize = 1024,
    ffn_size: Annotated[int, typer.Option(help="MLP inner size.")] = 4096,
    heads: Annotated[int, typer.Option(help="Attention heads.")] = 16,
    seq_len: SeqLen = 512,
    micro_batch_size: MicroBatchSize = 1,
    layers: Layers = 2,
    dtype: StepDtype = "float32",
    iters: StepIters = 10,
    warmup: StepWarmup = 2,
    check: StepCheck = True,
    out: Out = Path("results"),
    backend: Backend = "auto",
    timeout: Timeout = 300.0,
    workers: Workers = None,
    config: Config = None,
) -> None:
    """Tensor-parallel step timing: Megatron-style MLP and attention blocks, forward+backward."""
    _dispatch("tp", build_tp(
        block=block, hidden_size=hidden_size, ffn_size=ffn_size, heads=heads, seq_len=seq_len,
        micro_batch_size=micro_batch_size, layers=layers, dtype=dtype, iters=iters,
        warmup=warmup, check=check, out=out, backend=backend, timeout=timeout, workers=workers,
        argv=sys.argv[1:]))


@app.command()
def pp(
    schedule: Annotated[str, typer.Option(
        help="naive, gpipe, 1f1b, interleaved-1f1b; comma list or 'all'.")] = "all",
    micro_batches: Annotated[int, typer.Option(help="Micro-batches per step (m).")] = 8,
    virtual_stages: Annotated[int, typer.Option(
        help="Stages per rank for interleaved-1f1b (v).")] = 2,
    hidden_size: HiddenSize = 1024,
    seq_len: SeqLen = 128,
    micro_batch_size: MicroBatchSize = 1,
    layers: Layers = 8,
    dtype: StepDtype = "float32",
    iters: StepIters = 10,
    warmup: StepWarmup = 2,
    check: StepCheck = True,
    out: Out = Path("results"),
    backend: Backend = "auto",
    timeout: Timeout = 300.0,
    workers: Workers = None,
    config: Config = None,
) -> None:
    """Pipeline-parallel step timing: schedules side by side, measured and analytic bubble."""
    _dispatch("pp", build_pp(
        schedule=schedule, micro_batches=micro_batches, virtual_stages=virtual_stages,
        hidden_size=hidden_size, seq_len=seq_len, micro_batch_size=micro_batch_size,
        layers=layers, dtype=dtype, iters=iters, warmup=warmup, check=check, out=out,
        backend=backend, timeout=timeout, workers=workers, argv=sys.argv[1:]))


def _one_line(text: str) -> str:
    return " ".join(text.split())


def main(argv: list[str] | None = None) -> None:
    try:
        code = app(args=argv, prog_name="distbench", standalone_mode=False)
    except OptionError as e:
        print(f"distbench: error: {e}", file=sys.stderr)
        code = EXIT_BAD_INPUT
    except typer.Exit as e:
        code = e.exit_code
    except typer.Abort:
        code = 130
    except typer.TyperException as e:  # click's usage errors, vendored by typer
        message = _one_line(e.format_message())
        if message:  # empty when the help text was shown for a bare `distbench`
            print(f"distbench: error: {message} (see distbench --help)", file=sys.stderr)
        code = EXIT_BAD_INPUT
    sys.exit(code or 0)
