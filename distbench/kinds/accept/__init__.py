"""`distbench accept`: the command, as the registry (distbench/kinds/__init__.py) takes it."""

from __future__ import annotations

from distbench.kinds.accept import body, options, output
from distbench.kinds.kind import Kind

KIND = Kind("accept", help=options.HELP, options=options.AcceptOptions, run=body.run,
            dry_run=body.dry_run, examples=options.EXAMPLES, outputs=(output.OUTPUT,),
            section=output.section, plots=output.draw)
