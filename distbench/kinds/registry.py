"""The registry every kind is in: by name, in the order the command line lists them, report
shows them and compare compares their files. kinds/__init__.py fills it with the built-in
kinds; a kind's own code (report's, which reads every kind's runs back) reads it here."""

from __future__ import annotations

from distbench.core import contracts
from distbench.kinds.kind import Kind

KINDS: dict[str, Kind] = {}


def register(kind: Kind) -> Kind:
    """Adds a kind (a throwaway's too, in the tests) and its CSV contracts; a second of one
    name is refused."""
    if kind.name in KINDS:
        raise ValueError(f"a command {kind.name!r} is registered already")
    for output in kind.outputs:
        contracts.register(output)
    KINDS[kind.name] = kind
    return kind


def commands() -> dict[str, Kind]:
    """The commands that run (on ranks, or here): those with options."""
    return {name: kind for name, kind in KINDS.items() if kind.options is not None}


def tools() -> dict[str, Kind]:
    """The tools that read results back (report, compare): a Typer function of their own."""
    return {name: kind for name, kind in KINDS.items() if kind.command is not None}
