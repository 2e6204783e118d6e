"""`distbench plan`: the command, as the registry (distbench/kinds/__init__.py) takes it."""

from __future__ import annotations

from distbench.kinds.kind import Kind
from distbench.kinds.plan import body, options, output
from distbench.kinds.plan.cluster import pure

KIND = Kind("plan", help=options.HELP, options=options.PlanOptions, run=body.run,
            run_local=body.run_local, local=pure, examples=options.EXAMPLES,
            preload=options.PRELOAD, outputs=(output.OUTPUT, output.VALIDATION),
            section=output.section, plots=output.draw)
