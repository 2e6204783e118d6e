"""`distbench p2p`: the command, as the registry (distbench/kinds/__init__.py) takes it."""

from __future__ import annotations

from distbench.kinds.kind import Kind
from distbench.kinds.p2p import body, options, output

KIND = Kind("p2p", help=options.HELP, options=options.P2POptions, run=body.run,
            examples=options.EXAMPLES, outputs=(output.OUTPUT, output.MATRIX_OUTPUT),
            section=output.section, plots=output.draw)
