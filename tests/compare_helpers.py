"""Shared by compare's tests: a plain and a slowed synthetic run of what
`collective --workers 2` measures on the test machine, and their sweep."""

from __future__ import annotations

from pathlib import Path

from runs import collective_row, times, write_run

SWEEP = ("--sizes", "1K:16K:x4", "--min-time", "0.3")

SWEPT = [("all_reduce", 1, "sum"), ("all_gather", 0, "none")]  # at --placement out: op,


# in_place, redop
SIZES = (1024, 4096, 16384)

STALLED = ("all_gather", 16384)  # the plain run's row whose last repetition stalled


def _plain_and_slowed(where: Path) -> tuple[Path, Path]:
    """What `collective --op all_reduce,all_gather` SWEEP --workers 2 measures on this 2-core
    machine, and the same with rank 1 waiting 20 ms before every op (DISTBENCH_TEST_SLOW_RANK
    1:0.02): gloo takes from 0.1 to 8 ms an op here, so the two runs' samples barely overlap.
    One row of the plain run stalled for its last repetition (tens of ms an op, as a burst of
    load on the shared cores gives), which leaves it too noisy to tell from the slowed run."""
    rows, plain, slowed = [], [], []
    for k, (op, in_place, redop) in enumerate(SWEPT):
        for j, size in enumerate(SIZES):
            rows.append(collective_row(op, size, 500.0, in_place=in_place, redop=redop))
            us = times(500.0 + 100 * j, seed=10 * k + j, spread=0.3)
            if (op, size) == STALLED:
                us[40:] = [v * 80 for v in us[40:]]
            plain.append(us)
            slowed.append(times(20_500.0 + 100 * j, n=15, seed=10 * k + j + 5, spread=0.05))
    return (write_run(where / "plain", rows, plain), write_run(where / "slowed", rows, slowed))
