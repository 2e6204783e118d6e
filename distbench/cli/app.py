"""Command line: one Typer command per registered kind (distbench/kinds), its parameters derived
from the kind's options dataclass (a tool's own Typer function as it is); parse, validate, hand
off. No torch import here, so --help and
option errors stay fast; the heavy modules load only once the options are known to be good."""

from __future__ import annotations

import contextlib
import functools
import inspect
import keyword
import os
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

import distbench
from distbench.core.errors import ReadError, one_line
from distbench.core.exitcodes import EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_TERMINATED
from distbench.core.option_checks import completer
from distbench.core.options import (
    DEFAULT_TIMEOUT_S,
    OptionError,
    build,
    choices_of,
    cli_types,
    example_of,
    flag,
    load_config,
    negatable,
    option_fields,
    path_options,
)
from distbench.kinds import KINDS, commands
from distbench.kinds.kind import Kind
from distbench.platform import env, lifeline, limits, slurm_mpi
from distbench.run import faults


def epilog(examples: tuple[str, ...]) -> str:
    """The examples under a command's --help. Typer joins an epilog's single line breaks
    into one paragraph: each example is a paragraph of its own."""
    return "\n\n".join(["Examples:", *examples])


# -h as well as --help, on the root and every command
CONTEXT = {"help_option_names": ["-h", "--help"]}

app = typer.Typer(
    name="distbench",
    help="Benchmarks for the communication distributed training runs on.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion: choices and options completed by the shell
    pretty_exceptions_enable=False,
    context_settings=CONTEXT,
    epilog=epilog(("distbench collective --op all_reduce --workers 2",
                   "distbench step --workers 4",
                   "distbench plan --help     # a command's options and examples")),
)


def dispatch(name: str, opts) -> int:
    """Where a command runs: under a launcher, as one rank of a session; with --dry-run, or
    for a command that needs no workers, here; else on local workers we start."""
    entry = KINDS[name]
    if entry.dry_run is not None and getattr(opts, "dry_run", False):
        return entry.dry_run(opts)
    if env.under_launcher():
        from distbench.run import session

        return session.run(name, opts, entry.run)
    if entry.run_local is not None:
        return entry.run_local(opts)
    from distbench.run import launch

    code = launch.start_local(name, opts, entry.preload)
    return entry.exit_code(opts, code) if entry.exit_code is not None else code


def _machine_check(name: str) -> Callable[[object, int | None], None]:
    """What this machine can hold, checked as the options are built, for a run that will start
    local workers (not a dry run, and not a command that runs here alone: topo, or plan from
    earlier runs)."""
    entry = KINDS[name]

    def check(opts, world: int | None) -> None:
        if entry.dry_run is not None and getattr(opts, "dry_run", False):
            return
        if entry.run_local is not None and (entry.local is None or entry.local(opts)):
            return
        from distbench.run import launch

        launch.check_machine(opts, world)
    return check


def _py_name(flag_name: str) -> str:
    """The handler's parameter for a flag; a Python keyword (plan's --from) gets a "_"."""
    return flag_name + "_" if keyword.iskeyword(flag_name) else flag_name


def _flag_name(py_name: str) -> str:
    return py_name[:-1] if keyword.iskeyword(py_name[:-1]) else py_name


def _config_callback(ctx: typer.Context, param: typer.CallbackParam, value: Path | None):
    if value is not None:
        name = ctx.command.name or ""
        known = {spec.flag: cli_types(KINDS[name].options)[f.name]
                 for f, spec in option_fields(KINDS[name].options)}
        loaded = load_config(value, name, known, set(commands()),
                             path_options(KINDS[name].options))
        ctx.default_map = {**(ctx.default_map or {}),
                           **{_py_name(k): v for k, v in loaded.items()}}
    return value


CONFIG = inspect.Parameter(
    "config", inspect.Parameter.KEYWORD_ONLY, default=None,
    annotation=Annotated[Path | None, typer.Option(
        help="TOML file of options; flags on the command line win.", is_eager=True,
        callback=_config_callback)])


def _choice_help(check, text: str) -> dict:
    """typer.Option's arguments for an option of fixed choices: the help text names them all
    (added where it does not already, and for a comma list of them that it is one), the shell
    completes them, and the value shows as <name>, or <list> for a comma list. Not in brackets
    beside the option ([auto|nccl|gloo]): at 80 columns that column would squeeze every
    option's help."""
    found = choices_of(check)
    if found is None:
        return {"help": text}
    shown, many = found
    words = {w.strip(".,;:()'\"") for w in text.replace(",", " ").replace("/", " ").split()}
    if any(c not in words for c in shown):
        text = f"{text.rstrip()} Choices: {', '.join(shown)}."
    if many and "comma" not in text:  # the one list syntax, said where the text does not
        text = f"{text.rstrip()} A comma list takes several."
    return {"help": text, "metavar": "<list>" if many else "<name>",
            "autocompletion": completer(lambda: choices_of(check)[0], many)}


def _parameters(options: type) -> list[inspect.Parameter]:
    types = cli_types(options)
    params = []
    for f, spec in option_fields(options):
        text = spec.help() if callable(spec.help) else spec.help
        # a flag off by default only turns on: --once, not --once/--no-once
        plain_flag = types[f.name] is bool and not negatable(f)
        declared = [flag(spec.flag)] if keyword.iskeyword(spec.flag) or plain_flag else []
        params.append(inspect.Parameter(
            _py_name(spec.flag), inspect.Parameter.KEYWORD_ONLY, default=f.default,
            annotation=Annotated[types[f.name], typer.Option(
                *declared, show_default=spec.show_default, **_choice_help(spec.check, text))]))
    return params


def _add(name: str, command: Kind) -> None:
    def handler(**raw) -> None:
        raw.pop("config")
        raw = {_flag_name(k): v for k, v in raw.items()}
        if raw.get("workers") is not None and env.under_launcher() \
                and not env.started_by_us():  # ours: what we started, kept for run.json
            # the launcher decided the world: a count that says otherwise is a mistake
            per_node = env.local_world_size() or env.world_size_text()
            raise OptionError("--workers", f"not with a launcher (torchrun, srun): it started "
                              f"{env.world_size_text()} ranks already",
                              f"torchrun --nproc-per-node {per_node} -m distbench {name}")
        if isinstance(raw.get("workers"), int) and raw["workers"] >= 1 \
                and not env.under_launcher():
            # first of all, before torch loads: a count past the machine is refused at once
            limits.check_workers(raw["workers"])
        opts = build(command.options, raw, argv=env.user_argv(), world=env.world_size(),
                     machine=_machine_check(name))
        raise typer.Exit(dispatch(name, opts))

    params = [*_parameters(command.options), CONFIG]
    handler.__signature__ = inspect.Signature(params)
    handler.__annotations__ = {p.name: p.annotation for p in params}
    handler.__name__ = name
    app.command(name=name, help=command.help, epilog=epilog(command.examples),
                context_settings=CONTEXT)(handler)


def _version(value: bool) -> None:
    if value:
        print(f"distbench {distbench.__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(version: Annotated[bool, typer.Option(
        "--version", help="Print the version and exit.", is_eager=True,
        callback=_version)] = False) -> None:
    """Run a benchmark under torchrun, or alone (it then starts local workers itself)."""


def add(kind: Kind) -> None:
    """The kind's command on the application: its options' handler, or a tool's own function
    (they read results back: no launcher, no option dataclass)."""
    if kind.command is not None:
        app.command(name=kind.name, help=kind.help, epilog=epilog(kind.examples),
                    context_settings=CONTEXT)(kind.command)
    else:
        _add(kind.name, kind)


for _kind in KINDS.values():
    add(_kind)


def _usage_error(e: typer.TyperException, argv: list[str]) -> str:
    """Click's words for a command line it could not parse; for a value of the wrong type
    (`--iters 1.5`), the value given and a valid example, as our own checks give."""
    param, ctx = getattr(e, "param", None), getattr(e, "ctx", None)
    if isinstance(e, typer.BadParameter) and param is not None and ctx is not None:
        command = commands().get(ctx.command.name or "")
        fields = {spec.flag: (f, spec) for f, spec in option_fields(command.options)
                  } if command else {}
        if param.name and _flag_name(param.name) in fields:
            f, spec = fields[_flag_name(param.name)]
            kinds = set(typing.get_args(cli_types(command.options)[f.name])) or {
                cli_types(command.options)[f.name]}
            need = ("must be a whole number" if int in kinds else
                    "must be a number" if float in kinds else e.message.rstrip("."))
            name = flag(_flag_name(param.name))
            given = next((v for k, v in zip(argv, argv[1:], strict=False) if k == name),
                         next((a.split("=", 1)[1] for a in argv if a.startswith(name + "=")),
                              None))
            got = f", got {given!r}" if given is not None else ""
            return f"{name}: {need}{got} (example: {example_of(spec)})"
    return f"{one_line(e.format_message(), whole=True)} (see distbench --help)"


def _refuse(message: str, args: list[str] | None = None) -> int:
    """Bad input: one line and exit 2 (with watch --npd, node-problem-detector's line on stdout
    too). Under a launcher the other ranks would wait for this one in process-group setup until
    their timeout: they are told first, and each node says it once (from its local rank 0)."""
    from distbench.kinds.watch.health import npd_refusal
    from distbench.kinds.watch.options import npd_asked

    speaks = not env.under_launcher() or env.local_rank() == 0
    if speaks and npd_asked(args or []):
        print(npd_refusal(message), flush=True)
    if not env.under_launcher():
        print(f"distbench: error: {message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if speaks:
        print(f"distbench: error: {message}", file=sys.stderr, flush=True)
    from distbench.run.peers import refuse

    refuse(message, DEFAULT_TIMEOUT_S)
    return EXIT_BAD_INPUT


def _launcher_lost(parent: int) -> None:
    """A rank's launcher is gone before the run began: rank 0 says so in run.json (the local
    launcher made it), and every rank says why it leaves. Once the run has begun, the session
    says it instead, with the step it was in."""
    from distbench.results import writer

    rank = env.rank_text()
    message = lifeline.describe_loss(parent, "startup", rank)
    where = env.given_run_dir()
    if rank == "0" and where:
        writer.mark_unfinished(where, message, EXIT_TERMINATED, "terminated")
    print(f"distbench: rank {rank}: error: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    try:
        slurm_mpi.adopt()  # srun or mpirun without torchrun: their ranks as env:// ones
    except OptionError as e:
        print(f"distbench: error: {e}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    if argv is None and env.under_launcher():
        # a rank: it must not outlive what started it
        rank = env.rank()
        lifeline.watch(_launcher_lost if rank == 0 else None)
        faults.stall_before_join(rank)
    try:
        code = _run_app(args, argv)
    except BaseException:
        # Whatever broke, a lost launcher is the cause. A SIGKILLed one resets the connection
        # to the store it held before its ranks are re-parented: look a moment longer, or the
        # rank leaves with a traceback and run.json still says "running" (seen under load).
        lifeline.leave_if_orphaned(lifeline.WATCH_INTERVAL_S)
        raise
    lifeline.leave_if_orphaned()
    if argv is None and "torch" in sys.modules and not env.under_launcher():
        # Nothing is left to do: every file is written and closed. The interpreter's teardown of
        # torch's modules would take another half CPU-second (1.5 s against 2.0 s for a
        # process that only imports torch), paid by every launcher, report and plan. Not a
        # rank's: a rank refused at startup that left at once had torchrun stop its node's
        # local rank 0 before that one said why (the session's ranks leave by os._exit anyway).
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a reader gone, a closed stream
                stream.flush()
        os._exit(code or 0)
    sys.exit(code or 0)


@functools.cache
def _command():
    """The click command typer makes of `app`, made once: typer inspects every command's
    signature to make it (about 19 ms), and the test suite runs the command line in one process
    more than a thousand times. As `app(...)` runs it, less typer's exception hook, which
    `pretty_exceptions_enable=False` leaves to Python's anyway."""
    return typer.main.get_command(app)


def _run_app(args: list[str], argv: list[str] | None) -> int | None:
    """The command line parsed and run, and what it raised turned into an exit code (dispatch
    decides where a parsed command runs)."""
    try:
        return _command().main(args=argv, prog_name="distbench", standalone_mode=False)
    except OptionError as e:
        return _refuse(str(e), args)
    except ReadError as e:  # report or compare given something that holds no result
        print(f"distbench: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except typer.Exit as e:
        return e.exit_code
    except typer.Abort:
        return EXIT_INTERRUPTED
    except typer.TyperException as e:  # click's usage errors, vendored by typer
        if one_line(e.format_message(), whole=True):
            return _refuse(_usage_error(e, args), args)
        return EXIT_BAD_INPUT  # the help text was shown for a bare `distbench`
