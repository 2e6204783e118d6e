"""`distbench topo`: the command, as the registry (distbench/kinds/__init__.py) takes it."""

from __future__ import annotations

from distbench.kinds.kind import Kind
from distbench.kinds.topo import body, options, output

KIND = Kind("topo", help=options.HELP, options=options.TopoOptions, run=body.run,
            run_local=body.run_local, examples=options.EXAMPLES, section=output.section)
