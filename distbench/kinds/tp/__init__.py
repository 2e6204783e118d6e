"""`distbench tp`: the command, as the registry (distbench/kinds/__init__.py) takes it."""

from __future__ import annotations

from distbench.kinds.kind import Kind
from distbench.kinds.tp import body, options, output
from distbench.run.forked_workers import TRAINING

KIND = Kind("tp", help=options.HELP, options=options.TPOptions, run=body.run,
            examples=options.EXAMPLES, preload=TRAINING, outputs=(output.OUTPUT,),
            section=output.section, plots=output.draw)
