"""`distbench collective`: the command, as the registry (distbench/kinds/__init__.py) takes it."""

from __future__ import annotations

from distbench.kinds.collective import body, options, output
from distbench.kinds.kind import Kind

KIND = Kind("collective", help=options.HELP, options=options.CollectiveOptions, run=body.run,
            examples=options.EXAMPLES, outputs=(output.OUTPUT,), section=output.section,
            plots=output.draw, fits=output.fits, world_note=output.world_note)
