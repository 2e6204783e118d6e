"""Byte accounting against nccl-tests' PERFORMANCE.md table, written out here on its own."""

from __future__ import annotations

import pytest

from distbench.bench.series import SENDRECV
from distbench.core import accounting
from distbench.ops.collectives import OPS

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
        # whole 16-byte blocks per rank, written as a floor rather than nccl-tests' bit mask
        per_rank = requested // (n * 16) * 16 // elt
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
        got = accounting.buffer_of(_acc(op), requested, elt, n)
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
        # odd rank count: 1000 // (3 * 4) = 83 per rank, down to a multiple of 16 B: 80 floats
        ("reduce_scatter", 1000, 4, 3, (80, 240, 960)),
        ("all_gather", 1000, 4, 3, (80, 240, 960)),
        ("all_to_all", 1000, 1, 3, (320, 960, 960)),
        ("gather", 1000, 8, 3, (40, 120, 960)),
        ("scatter", 1000, 2, 3, (160, 480, 960)),
        ("all_reduce", 1000, 4, 3, (250, 250, 1000)),
        ("all_reduce", 1001, 4, 3, (250, 250, 1000)),
        ("broadcast", 1001, 8, 3, (125, 125, 1000)),
        ("reduce", 7, 4, 8, (1, 1, 4)),
        ("sendrecv", 9, 8, 2, (1, 1, 8)),
        # too small to give every rank one element, or (split ops) one 16-byte block
        ("reduce_scatter", 8, 4, 3, None),
        ("reduce_scatter", 47, 4, 3, None),
        ("all_gather", 127, 4, 8, None),
        ("all_to_all", 63, 1, 4, None),
        ("gather", 31, 8, 2, None),
        ("scatter", 31, 1, 2, None),
        ("all_reduce", 3, 4, 2, None),
        ("broadcast", 0, 1, 2, None),
        ("sendrecv", 7, 8, 2, None),
        # just big enough: 16 B per rank
        ("reduce_scatter", 48, 4, 3, (4, 12, 48)),
        ("all_gather", 128, 4, 8, (4, 32, 128)),
        ("gather", 32, 8, 2, (2, 4, 32)),
        ("scatter", 32, 1, 2, (16, 32, 32)),
    ],
)
def test_layout_known_values(op, requested, elt, n, want):
    got = accounting.buffer_of(_acc(op), requested, elt, n)
    if want is None:
        assert got is None
    else:
        assert got is not None
        assert (got.per_rank_count, got.count, got.size_bytes) == want


# ---------------------------------------------------------------------------------------------
# Sizes exactly as nccl-tests prints them. Transcribed from nccl-tests' src/common.cu
# (setupArgs: count = size / wordSize; the row's size is max(sendBytes, expectedBytes)) and the
# *GetCollByteCount functions of all_gather.cu, reduce_scatter.cu, alltoall.cu, gather.cu and
# scatter.cu, which all compute the per-rank count as (count/nranks) & -(16/eltSize).

DTYPE_ELT = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int32": 4, "int64": 8,
             "int8": 1, "uint8": 1}
NCCL_TESTS_NS = (3, 24)
NCCL_TESTS_SIZES = (1, 16, 47, 48, 100, 383, 384, 385, 1000, 4096, 65536, 1 << 20,
                    3 * (1 << 20) + 5, 1 << 30)
# (sendcount, recvcount) from the per-rank count `base`, per file
NCCL_TESTS_COUNTS = {
    "all_gather": lambda base, n: (base, base * n),
    "reduce_scatter": lambda base, n: (base * n, base),
    "all_to_all": lambda base, n: (n * base, n * base),
    "gather": lambda base, n: (base, base * n),
    "scatter": lambda base, n: (base * n, base),
}
SPLIT_OPS = sorted(NCCL_TESTS_COUNTS)
WHOLE_OPS = ("all_reduce", "broadcast", "reduce")


def nccl_tests_row(op: str, size: int, elt: int, nranks: int) -> tuple[int, int]:
    """(base, printed size in bytes) for a split op, as nccl-tests computes them."""
    count = size // elt
    base = (count // nranks) & -(16 // elt)
    send, recv = NCCL_TESTS_COUNTS[op](base, nranks)
    return base, max(send * elt, recv * elt)


def test_dtype_table_matches_distbench():
    from distbench.core.dtypes import NAMES, element_bytes
    from distbench.ops.torch_dtypes import TORCH_DTYPES

    assert set(DTYPE_ELT) == set(TORCH_DTYPES) == set(NAMES)
    assert {name: element_bytes(name) for name in NAMES} == DTYPE_ELT
    assert {name: TORCH_DTYPES[name].itemsize for name in NAMES} == DTYPE_ELT


def test_every_split_op_is_one_nccl_tests_transcribed():
    assert SPLIT_OPS == sorted(name for name, op in OPS.items() if op.accounting.split)
    assert set(WHOLE_OPS) == {name for name, op in OPS.items() if not op.accounting.split}


@pytest.mark.parametrize("op", SPLIT_OPS)
@pytest.mark.parametrize("dtype", sorted(DTYPE_ELT))
@pytest.mark.parametrize("n", NCCL_TESTS_NS)
def test_split_sizes_are_nccl_tests_sizes(op, dtype, n):
    elt = DTYPE_ELT[dtype]
    for size in NCCL_TESTS_SIZES:
        base, want = nccl_tests_row(op, size, elt, n)
        got = accounting.buffer_of(OPS[op].accounting, size, elt, n)
        if base == 0:  # nccl-tests would run an empty op; distbench skips the row
            assert got is None, (size, dtype, n)
            continue
        assert got is not None, (size, dtype, n)
        assert (got.per_rank_count, got.size_bytes, got.count) == (base, want, want // elt), (
            size, dtype, n)
        assert got.per_rank_count * elt % 16 == 0


@pytest.mark.parametrize("op", SPLIT_OPS)
def test_split_sizes_pinned(op):
    acc = OPS[op].accounting
    # 4 KiB of float32 on 3 ranks: 1024 // 3 = 341 floats per rank, down to 340
    assert accounting.buffer_of(acc, 4096, 4, 3).size_bytes == 4080
    # 1 MiB of float32 on 24 ranks: 262144 // 24 = 10922 floats per rank, down to 10920
    assert accounting.buffer_of(acc, 1 << 20, 4, 24).size_bytes == 1048320


@pytest.mark.parametrize("op", WHOLE_OPS)
@pytest.mark.parametrize("dtype", sorted(DTYPE_ELT))
@pytest.mark.parametrize("n", NCCL_TESTS_NS)
def test_whole_buffer_ops_are_not_rounded(op, dtype, n):
    elt = DTYPE_ELT[dtype]
    for size in NCCL_TESTS_SIZES:
        got = accounting.buffer_of(OPS[op].accounting, size, elt, n)
        if size < elt:
            assert got is None
            continue
        assert (got.per_rank_count, got.count, got.size_bytes) == (
            size // elt, size // elt, size // elt * elt)


@pytest.mark.parametrize("op", WHOLE_OPS)
def test_whole_buffer_sizes_pinned(op):
    acc = OPS[op].accounting
    assert accounting.buffer_of(acc, 4096, 4, 3).size_bytes == 4096
    assert accounting.buffer_of(acc, 1 << 20, 4, 24).size_bytes == 1 << 20
    assert accounting.buffer_of(acc, 1001, 8, 24).size_bytes == 1000
    assert accounting.buffer_of(acc, 2, 1, 24).size_bytes == 2


@pytest.mark.parametrize("op", sorted(TABLE))
@pytest.mark.parametrize("dtype", sorted(DTYPE_ELT))
@pytest.mark.parametrize("n", (2, 3, 24))
def test_min_bytes_is_where_layout_starts(op, dtype, n):
    """The too-small note states min_bytes: the first size with a row, the last without."""
    acc, elt = _acc(op), DTYPE_ELT[dtype]
    need = accounting.min_bytes(acc, elt, n)
    assert need == (16 * n if acc.split else elt)
    assert accounting.buffer_of(acc, need, elt, n) is not None
    assert accounting.buffer_of(acc, need - 1, elt, n) is None


@pytest.mark.parametrize("op_name", ["reduce_scatter", "all_gather"])
@pytest.mark.parametrize("dtype", sorted(DTYPE_ELT))
@pytest.mark.parametrize("n", NCCL_TESTS_NS)
def test_in_place_slices_start_16_byte_aligned(op_name, dtype, n):
    """In place, rank r's block is the slice at r x per-rank count of the shared buffer; with
    the rounding every such slice starts at a multiple of 16 bytes, whatever the size."""
    import torch

    from distbench.bench.series import allocate
    from distbench.ops.collectives import Ctx
    from distbench.ops.torch_dtypes import TORCH_DTYPES

    op, elt = OPS[op_name], DTYPE_ELT[dtype]
    lays = [lay for size in NCCL_TESTS_SIZES if size <= 4 << 20  # no GiB buffers here
            if (lay := accounting.buffer_of(op.accounting, size, elt, n)) is not None]
    assert lays
    biggest = max(lay.per_rank_count for lay in lays)
    for rank in range(n):
        ctx = Ctx(rank=rank, n=n, root=0, redop="sum", in_place=True)
        # as the engine does: one allocation for the largest size, sliced for every size
        bufs = allocate(op, ctx, biggest, TORCH_DTYPES[dtype], "cpu")
        starts = [b.data_ptr() for b in bufs if b.numel()]
        for lay in lays:
            case = op.build(ctx, *bufs, lay.per_rank_count)
            views = [t for t in case.run.args if isinstance(t, torch.Tensor)]
            offsets = {t.data_ptr() - start for t in views for start in starts
                       if 0 <= t.data_ptr() - start < biggest * n * elt}
            # the rank's own block really is one of the call's arguments
            assert rank * lay.per_rank_count * elt in offsets, (rank, lay)
            assert all(off % 16 == 0 for off in offsets), (rank, lay, sorted(offsets))
