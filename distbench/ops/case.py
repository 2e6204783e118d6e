"""What every benchmarked operation hands the timing loop."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class Case:
    """One op at one size on this rank: the call to time and how to prepare and check it."""

    run: Callable[[], object]
    prepare: Callable[[], None]
    check: Callable[[], int]
    output: torch.Tensor | None  # what the check reads (tests corrupt it)
    active: bool = True  # False: this rank sits the pattern out (an odd rank in a ping-pong)
