"""`distbench report`: the command, as the registry (distbench/kinds/__init__.py) takes it."""

from __future__ import annotations

from distbench.kinds.kind import Kind
from distbench.kinds.report import options

KIND = Kind("report", help=options.HELP, command=options.command, examples=options.EXAMPLES)
