"""Byte accounting against nccl-tests' PERFORMANCE.md table, written out here on its own."""

from __future__ import annotations

import pytest

from distbench import accounting
from distbench.ops.collectives import OPS
from distbench.series import SENDRECV

NS = (2, 3, 4, 8)
ELTS = (1, 2, 4, 8)

# The nccl-tests table: (split across ranks?, busbw factor as a function of n).
TABLE = {
    "all_reduce": (False, lambda n: 2 * (n - 1) / n),
    "reduce_scatter": (True, lambda n: (n - 1) / n),
    "all_gather": (True, lambda n: (n - 1) / n),
    "broadcast": (False, lambda n: 1.0),
    "reduce": (False, lambda n: 1.0),
    "all_to_all": (True, lambda n: (n - 1) / n),
    "gather": (True, lambda n: (n - 1) / n),
    "scatter": (True, lambda n: (n - 1) / n),
    "sendrecv": (False, lambda n: 1.0),
}

# Hand-computed factors for a few n, so the lambdas above are themselves checked.
KNOWN_BUSBW_FACTOR = {
    ("all_reduce", 2): 1.0, ("all_reduce", 3): 4 / 3, ("all_reduce", 4): 1.5,
    ("all_reduce", 8): 1.75, ("all_gather", 2): 0.5, ("all_gather", 3): 2 / 3,
    ("reduce_scatter", 4): 0.75, ("all_to_all", 8): 0.875, ("broadcast", 8): 1.0,
    ("sendrecv", 3): 1.0,
}

REQUESTED = (1, 3, 7, 8, 24, 1000, 1001, 4096, 65536, 1 << 20, 3 * (1 << 20) + 5)


def expected_layout(op: str, requested: int, elt: int, n: int):
    split, _ = TABLE[op]
    assert _acc(op).split == split
    if split:
        per_rank = requested // (n * elt)
        size = per_rank * n * elt
    else:
        per_rank = requested // elt
        size = per_rank * elt
    if per_rank == 0:
        return None
    return per_rank, size // elt, size


def _acc(op: str) -> accounting.Accounting:
    return SENDRECV if op == "sendrecv" else OPS[op].accounting


def test_registry_matches_the_design_table():
    assert set(OPS) == set(TABLE) - {"sendrecv"}


@pytest.mark.parametrize("op", sorted(TABLE))
@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("elt", ELTS)
def test_layout(op, n, elt):
    for requested in REQUESTED:
        got = accounting.layout(_acc(op), requested, elt, n)
        want = expected_layout(op, requested, elt, n)
        if want is None:
            assert got is None, (op, requested, elt, n)
            continue
        assert got is not None, (op, requested, elt, n)
        per_rank, count, size = want
        assert (got.per_rank_count, got.count, got.size_bytes) == (per_rank, count, size)
        # count is always size_bytes / element size, never the per-rank count
        assert got.count * elt == got.size_bytes
        assert got.size_bytes <= requested
        assert got.per_rank_count >= 1


@pytest.mark.parametrize("op", sorted(TABLE))
@pytest.mark.parametrize("n", NS)
def test_bandwidth(op, n):
    _, factor = TABLE[op]
    for size, seconds in ((1_000_000_000, 1.0), (4096, 1e-5), (1000, 3e-6), (8, 2.5e-6)):
        algbw, busbw = accounting.bandwidth(_acc(op), size, seconds, n)
        assert algbw == pytest.approx(size / seconds / 1e9, rel=1e-12)
        assert busbw == pytest.approx(size / seconds / 1e9 * factor(n), rel=1e-12)
    if (op, n) in KNOWN_BUSBW_FACTOR:
        algbw, busbw = accounting.bandwidth(_acc(op), 2_000_000_000, 1.0, n)
        assert algbw == pytest.approx(2.0)  # decimal GB/s, not GiB/s
        assert busbw == pytest.approx(2.0 * KNOWN_BUSBW_FACTOR[(op, n)])


@pytest.mark.parametrize(
    ("op", "requested", "elt", "n", "want"),
    [
        # odd rank count: 1000 // (3 * 4) = 83 per rank -> 996 bytes used
        ("reduce_scatter", 1000, 4, 3, (83, 249, 996)),
        ("all_gather", 1000, 4, 3, (83, 249, 996)),
        ("all_to_all", 1000, 1, 3, (333, 999, 999)),
        ("gather", 1000, 8, 3, (41, 123, 984)),
        ("scatter", 1000, 2, 3, (166, 498, 996)),
        ("all_reduce", 1000, 4, 3, (250, 250, 1000)),
        ("all_reduce", 1001, 4, 3, (250, 250, 1000)),
        ("broadcast", 1001, 8, 3, (125, 125, 1000)),
        ("reduce", 7, 4, 8, (1, 1, 4)),
        ("sendrecv", 9, 8, 2, (1, 1, 8)),
        # too small to give every rank one element
        ("reduce_scatter", 8, 4, 3, None),
        ("all_gather", 31, 4, 8, None),
        ("all_to_all", 3, 1, 4, None),
        ("gather", 15, 8, 2, None),
        ("scatter", 1, 1, 2, None),
        ("all_reduce", 3, 4, 2, None),
        ("broadcast", 0, 1, 2, None),
        ("sendrecv", 7, 8, 2, None),
        # just big enough
        ("reduce_scatter", 12, 4, 3, (1, 3, 12)),
        ("all_gather", 32, 4, 8, (1, 8, 32)),
    ],
)
def test_layout_known_values(op, requested, elt, n, want):
    got = accounting.layout(_acc(op), requested, elt, n)
    if want is None:
        assert got is None
    else:
        assert got is not None
        assert (got.per_rank_count, got.count, got.size_bytes) == want
