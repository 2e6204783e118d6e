"""Command line: one Typer command per entry of the command table, its parameters derived from
the command's options dataclass; parse, validate, hand off. No torch import here, so --help and
option errors stay fast; the heavy modules load only once the options are known to be good."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import Annotated

import typer

from distbench.commands import COMMANDS, Command
from distbench.exitcodes import EXIT_BAD_INPUT, EXIT_INTERRUPTED
from distbench.options import OptionError, build, cli_types, load_config, option_fields

app = typer.Typer(
    name="distbench",
    help="Benchmarks for the communication distributed training runs on.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _config_callback(ctx: typer.Context, param: typer.CallbackParam, value: Path | None):
    if value is not None:
        known = {p.name for p in ctx.command.params if p.name and p.name != "config"}
        ctx.default_map = {**(ctx.default_map or {}),
                           **load_config(value, ctx.command.name or "", known)}
    return value


CONFIG = inspect.Parameter(
    "config", inspect.Parameter.KEYWORD_ONLY, default=None,
    annotation=Annotated[Path | None, typer.Option(
        help="TOML file of options; flags on the command line win.", is_eager=True,
        callback=_config_callback)])


def _parameters(options: type) -> list[inspect.Parameter]:
    types = cli_types(options)
    params = []
    for f, spec in option_fields(options):
        text = spec.help() if callable(spec.help) else spec.help
        params.append(inspect.Parameter(
            spec.flag, inspect.Parameter.KEYWORD_ONLY, default=f.default,
            annotation=Annotated[types[f.name], typer.Option(
                help=text, show_default=spec.show_default)]))
    return params


def _add(name: str, command: Command) -> None:
    def handler(**raw) -> None:
        raw.pop("config")
        opts = build(command.options, raw, argv=sys.argv[1:])
        from distbench import launch

        raise typer.Exit(launch.dispatch(name, opts))

    params = [*_parameters(command.options), CONFIG]
    handler.__signature__ = inspect.Signature(params)
    handler.__annotations__ = {p.name: p.annotation for p in params}
    handler.__name__ = name
    app.command(name=name, help=command.help)(handler)


@app.callback()
def _root() -> None:
    """Run a benchmark under torchrun, or alone (it then starts local workers itself)."""


for _name, _command in COMMANDS.items():
    _add(_name, _command)


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
        code = EXIT_INTERRUPTED
    except typer.TyperException as e:  # click's usage errors, vendored by typer
        message = _one_line(e.format_message())
        if message:  # empty when the help text was shown for a bare `distbench`
            print(f"distbench: error: {message} (see distbench --help)", file=sys.stderr)
        code = EXIT_BAD_INPUT
    sys.exit(code or 0)
