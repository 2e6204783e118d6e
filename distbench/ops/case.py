"""What every benchmarked operation hands the timing loop."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Case:
    """One op at one size on this rank: the call to time and how to prepare and check it."""

    run: Callable[[], object]
    prepare: Callable[[], None]
    check: Callable[[], int]
    output: torch.Tensor | None  # what the check reads
    active: bool = True  # False: this rank sits the pattern out (an odd rank in a ping-pong)
    sends: bool = True  # this rank sends in the op
    receives: bool = True  # this rank receives in the op


def idle() -> Case:
    """A rank with no part in the pattern: it runs nothing and adds nothing to the statistics."""
    return Case(run=lambda: None, prepare=lambda: None, check=lambda: 0, output=None,
                active=False, sends=False, receives=False)
