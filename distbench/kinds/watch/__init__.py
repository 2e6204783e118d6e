"""`distbench watch`: the command, as the registry (distbench/kinds/__init__.py) takes it."""

from __future__ import annotations

from distbench.kinds.kind import Kind
from distbench.kinds.watch import body, options, output

KIND = Kind("watch", help=options.HELP, options=options.WatchOptions, run=body.run,
            exit_code=body.exit_code, examples=options.EXAMPLES, outputs=(output.OUTPUT,),
            section=output.section, plots=output.draw)
