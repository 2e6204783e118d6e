"""`distbench compare`: the command, as the registry (distbench/kinds/__init__.py) takes it."""

from __future__ import annotations

from distbench.kinds.compare import options
from distbench.kinds.kind import Kind

KIND = Kind("compare", help=options.HELP, command=options.command, examples=options.EXAMPLES)
