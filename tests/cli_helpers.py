"""Shared by the command line's tests (tests/unit/cli/, the commands' own under
tests/unit/kinds/, and their multiproc halves)."""

from __future__ import annotations

from pathlib import Path

import typer.main

import distbench.cli.app
import distbench.run.launch


def _distbench_options() -> dict[str, list[tuple[str, bool]]]:
    """command -> [(long option, takes a value)]"""
    group = typer.main.get_command(distbench.cli.app.app)
    found: dict[str, list[tuple[str, bool]]] = {}
    for name, command in group.commands.items():
        found[name] = [(o, not param.is_flag)
                       for param in command.params
                       for o in (*param.opts, *param.secondary_opts) if o.startswith("--")]
    return found


def _torchrun_parser():
    from torch.distributed.run import get_args_parser

    return get_args_parser()


def _assert_no_run_dir(tmp_path: Path, out: Path) -> None:
    runs = [p for p in tmp_path.rglob("*") if p.is_dir() and p.name.endswith("-collective")]
    assert runs == [], f"a failing invocation created run directories: {runs}"
    # Not even the parent: validation that fails must leave nothing behind.
    assert not out.exists(), f"a failing invocation created {out}"


def _assert_nothing_written(tmp_path: Path, out: Path) -> None:
    assert not out.exists(), f"a failing invocation created {out}"
    runs = [p for p in tmp_path.rglob("*") if p.is_dir() and p.name.endswith(("-p2p", "-topo"))]
    assert runs == [], f"a failing invocation created run directories: {runs}"
