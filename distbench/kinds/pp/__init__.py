"""`distbench pp`: the command, as the registry (distbench/kinds/__init__.py) takes it."""

from __future__ import annotations

from distbench.kinds.kind import Kind
from distbench.kinds.pp import body, options, output

KIND = Kind("pp", help=options.HELP, options=options.PPOptions, run=body.run,
            examples=options.EXAMPLES, outputs=(output.OUTPUT,), section=output.section,
            plots=output.draw)
