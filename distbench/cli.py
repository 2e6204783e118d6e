"""Command line: parse, validate, hand off. No torch import here, so --help and option errors
stay fast; the heavy modules load only once the options are known to be good."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from distbench.options import OptionError, build_collective, load_config

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


@app.callback()
def _root() -> None:
    """Run a benchmark under torchrun, or alone (it then starts local workers itself)."""


@app.command()
def collective(
    op: Annotated[str, typer.Option(
        help="Collectives, comma-separated, or 'all': all_reduce, reduce_scatter, all_gather, "
             "broadcast, reduce, all_to_all, gather, scatter.")] = "all_reduce",
    sizes: Annotated[str, typer.Option(
        help="Per-rank buffer sizes: 8:128M:x2 (factor), 1K:64K:+4K (step) or 1K,4K (list). "
             "Binary suffixes.")] = "8:128M:x2",
    dtype: Annotated[str, typer.Option(
        help="float32, float16, bfloat16, float64, int32, int64, int8, uint8; comma list or "
             "'all'.")] = "float32",
    redop: Annotated[str, typer.Option(
        help="sum, prod, max, min, avg; comma list or 'all'.")] = "sum",
    root: Annotated[int, typer.Option(
        help="Root rank for broadcast, reduce, gather, scatter.")] = 0,
    placement: Annotated[str, typer.Option(
        help="out, in or both: out-of-place or in-place buffers.")] = "out",
    iters: Annotated[int | None, typer.Option(
        help="Timed iterations per size. Default: calibrated to --min-time.",
        show_default=False)] = None,
    min_time: Annotated[float, typer.Option(
        help="Seconds of timed work per size when --iters is not given.")] = 0.1,
    warmup: Annotated[int, typer.Option(help="Untimed iterations before each size.")] = 5,
    check: Annotated[bool, typer.Option(
        help="Check results against independently computed values.")] = True,
    out: Annotated[Path, typer.Option(help="Parent directory of the run directory.")] = Path(
        "results"),
    backend: Annotated[str, typer.Option(help="auto (nccl with CUDA, else gloo), nccl, gloo.")
                       ] = "auto",
    timeout: Annotated[float, typer.Option(
        help="Seconds a rank may wait on its peers before the run is ended.")] = 300.0,
    workers: Annotated[int | None, typer.Option(
        help="Local workers to start when not under torchrun. Default: one per GPU, or 2 on CPU.",
        show_default=False)] = None,
    config: Annotated[Path | None, typer.Option(
        help="TOML file of options; flags on the command line win.", is_eager=True,
        callback=_config_callback)] = None,
) -> None:
    """Time collectives over a size sweep; bus bandwidth as nccl-tests reports it."""
    opts = build_collective(
        op=op, sizes=sizes, dtype=dtype, redop=redop, root=root, placement=placement,
        iters=iters, min_time=min_time, warmup=warmup, check=check, out=out, backend=backend,
        timeout=timeout, workers=workers, argv=sys.argv[1:],
    )
    from distbench.launch import dispatch

    raise typer.Exit(dispatch("collective", opts))


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
