"""Deterministic inputs and closed-form expected results (distbench.ops.data)."""

from __future__ import annotations

import pytest
import torch

from distbench.ops import data

REDOPS = ("sum", "prod", "max", "min", "avg")
DTYPES = (torch.float32, torch.bfloat16, torch.int8, torch.uint8, torch.int32)
# n < PERIOD, == PERIOD, > PERIOD, plus a few large counts (uint8 prod wraps to 0 from 8 twos
# upward, uint8 sum wraps past 255)
NS = (*range(1, 18), 56, 300)
STARTS = (0, 1000)
COUNT = 3 * data.PERIOD + 5  # every residue several times, not a multiple of PERIOD


def brute_force(start: int, count: int, n: int, redop: str, dtype) -> torch.Tensor:
    inputs = torch.stack([data.reduction_input(r, start, count, redop, dtype, "cpu")
                          for r in range(n)]).to(torch.int64)
    if redop == "sum":
        return inputs.sum(0)
    if redop == "avg":
        return inputs.double().sum(0) / n
    if redop == "prod":
        out = torch.ones(count, dtype=torch.int64)
        for row in inputs:
            out = out * row
        return out
    if redop == "max":
        return inputs.amax(0)
    return inputs.amin(0)


def test_period_cases_covered():
    assert data.PERIOD in NS and min(NS) < data.PERIOD < max(NS)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("redop", REDOPS)
def test_reduction_expected_matches_brute_force(redop, dtype):
    for n in NS:
        for start in STARTS:
            want = brute_force(start, COUNT, n, redop, dtype)
            got = data.reduction_expected(start, COUNT, n, redop, dtype, "cpu")
            assert got.shape == (COUNT,)
            ctx = f"n={n} start={start}"
            if dtype.is_floating_point:
                assert torch.equal(got.double(), want.double()), ctx
            else:  # integer results wrap: compare after the same cast
                assert torch.equal(got.to(dtype), want.to(dtype)), ctx
                # the int64 value itself is exact too, except uint8 prod, already wrapped
                if redop != "avg" and not (redop == "prod" and dtype == torch.uint8):
                    assert torch.equal(got.long(), want), ctx


def test_uint8_prod_wraps_to_zero():
    # enough ranks that some element multiplies eight 2s together: 256 wraps to 0 in uint8
    got = data.reduction_expected(0, 50, 70, "prod", torch.uint8, "cpu").to(torch.uint8)
    want = brute_force(0, 50, 70, "prod", torch.uint8).to(torch.uint8)
    assert torch.equal(got, want)
    assert (got == 0).any()


@pytest.mark.parametrize(("redop", "dtype"), [
    (r, d) for r in REDOPS for d in DTYPES if r != "avg" or d.is_floating_point  # avg: floats
], ids=str)
def test_reduction_in_dtype_passes_the_check(redop, dtype):
    """A reduction done in the buffer's own dtype (as the backend does it) counts 0 wrong."""
    for n in range(1, 18):
        for start in STARTS:
            inputs = [data.reduction_input(r, start, COUNT, redop, dtype, "cpu").to(dtype)
                      for r in range(n)]
            acc = inputs[0].clone()
            for x in inputs[1:]:
                if redop in ("sum", "avg"):
                    acc += x
                elif redop == "prod":
                    acc *= x
                elif redop == "max":
                    acc = torch.maximum(acc, x)
                else:
                    acc = torch.minimum(acc, x)
            if redop == "avg":
                acc /= n

            def make(s, c, n=n, start=start):
                return data.reduction_expected(start + s, c, n, redop, dtype, "cpu")

            assert data.count_wrong(acc, make, redop) == 0, f"n={n} start={start}"


def test_inputs_depend_on_start_offset_consistently():
    for redop in REDOPS:
        whole = data.reduction_input(2, 0, 100, redop, torch.float32, "cpu")
        part = data.reduction_input(2, 37, 63, redop, torch.float32, "cpu")
        assert torch.equal(whole[37:], part)
    assert torch.equal(data.movement(1, 0, 100, "cpu")[37:], data.movement(1, 37, 63, "cpu"))


# ---- count_wrong ----------------------------------------------------------------------------

def _expected(n=5, redop="sum", dtype=torch.float32):
    def make(s, c):
        return data.reduction_expected(s, c, n, redop, dtype, "cpu")
    return make


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64, torch.bfloat16, torch.float16,
                                   torch.int8, torch.uint8, torch.int32, torch.int64), ids=str)
@pytest.mark.parametrize("k", (0, 1, 3, 17))
def test_count_wrong_counts_perturbed_elements(dtype, k):
    make = _expected(dtype=dtype)
    buf = make(0, 200).to(dtype)
    assert data.count_wrong(buf, make, "sum") == 0
    idx = torch.randperm(200, generator=torch.Generator().manual_seed(k))[:k]
    buf[idx] += 5 if dtype.is_floating_point else 1
    assert data.count_wrong(buf, make, "sum") == k


def test_count_wrong_integers_compare_after_wrapping():
    def make(s, c):
        return torch.full((c,), 200, dtype=torch.int64)  # outside int8: wraps to -56
    buf = torch.full((10,), 200, dtype=torch.int64).to(torch.int8)
    assert data.count_wrong(buf, make) == 0
    buf[3] = 127
    assert data.count_wrong(buf, make) == 1


def _const(value):
    def make(s, c):
        return torch.full((c,), value, dtype=torch.float64)
    return make


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=str)
def test_half_precision_tolerance(dtype):
    ulp_at_100 = {torch.bfloat16: 0.5, torch.float16: 0.0625}[dtype]
    near = torch.tensor([100.0 + ulp_at_100, 100.0 - ulp_at_100 / 2], dtype=dtype)
    assert near[0].item() != 100.0
    assert data.count_wrong(near, _const(100.0), "sum") == 0
    # off by 2 on a small value is a real error
    assert data.count_wrong(torch.tensor([5.0, 1.0], dtype=dtype), _const(3.0), "sum") == 2
    assert data.count_wrong(torch.tensor([3.0], dtype=dtype), _const(3.0), "sum") == 0
    # and so is a clearly wrong large value
    assert data.count_wrong(torch.tensor([104.0], dtype=dtype), _const(100.0), "sum") == 1
    # a few ulps past the tolerance (0.2 at 100 for float16, 1.61 for bfloat16) is wrong too:
    # a tolerance loosened tenfold would pass these
    off = {torch.bfloat16: 2.0, torch.float16: 0.5}[dtype]
    assert data.count_wrong(torch.tensor([100.0 + off], dtype=dtype), _const(100.0), "sum") == 1


def test_float32_is_exact_outside_avg():
    buf = torch.tensor([3.0 + 2 ** -20], dtype=torch.float32)
    assert buf.item() != 3.0
    assert data.count_wrong(buf, _const(3.0), "sum") == 1
    assert data.count_wrong(buf, _const(3.0)) == 1


def test_avg_float32_tolerance():
    third = 1.0 / 3.0
    rounded = torch.tensor([third, -2 * third, 10 * third], dtype=torch.float32)
    assert rounded.double()[0].item() != third  # float32 cannot hold 1/3 exactly

    def make(s, c):
        return torch.tensor([third, -2 * third, 10 * third], dtype=torch.float64)[s:s + c]

    assert data.count_wrong(rounded, make, "avg") == 0
    off = rounded.clone()
    off[1] += 1e-3
    assert data.count_wrong(off, make, "avg") == 1
    # the same rounding is an error outside avg: float32 is otherwise exact
    assert data.count_wrong(rounded, make, "sum") == 3


def test_avg_real_expected_float32():
    for n in (3, 6, 7, 11):
        make = _expected(n=n, redop="avg", dtype=torch.float32)
        buf = make(0, 100).float()
        assert data.count_wrong(buf, make, "avg") == 0
        buf[7] += 0.01
        assert data.count_wrong(buf, make, "avg") == 1


# ---- chunking ---------------------------------------------------------------------------------

def test_fill_and_count_wrong_across_chunks(monkeypatch):
    monkeypatch.setattr(data, "CHUNK", 7)
    calls = []

    def make(s, c):
        calls.append((s, c))
        return data.movement(1, s, c, "cpu")

    buf = torch.full((30,), data.SENTINEL, dtype=torch.int32)
    data.fill(buf, make)
    assert calls == [(0, 7), (7, 7), (14, 7), (21, 7), (28, 2)]
    assert torch.equal(buf, data.movement(1, 0, 30, "cpu").to(torch.int32))

    calls.clear()
    assert data.count_wrong(buf, make) == 0
    assert calls == [(0, 7), (7, 7), (14, 7), (21, 7), (28, 2)]
    for i in (0, 6, 7, 13, 14, 29):  # both sides of each chunk boundary, and the last element
        buf[i] = data.SENTINEL
    assert data.count_wrong(buf, make) == 6


def test_fill_float_exact_multiple_of_chunk(monkeypatch):
    monkeypatch.setattr(data, "CHUNK", 7)
    make = _expected(n=4, redop="max", dtype=torch.bfloat16)
    buf = torch.zeros(21, dtype=torch.bfloat16)
    data.fill(buf, make)
    assert torch.equal(buf, make(0, 21).to(torch.bfloat16))
    assert data.count_wrong(buf, make, "max") == 0
    buf[20] = 50
    assert data.count_wrong(buf, make, "max") == 1


# ---- movement pattern and sentinel ------------------------------------------------------------

@pytest.mark.parametrize("dtype", (torch.float32, torch.int64, torch.float16, torch.bfloat16,
                                   torch.int8, torch.uint8), ids=str)
def test_movement_values(dtype):
    m = data.modulus(dtype)
    for start in (0, 1000):
        a = data.movement(0, start, 5000, "cpu", dtype)
        b = data.movement(1, start, 5000, "cpu", dtype)
        assert (a != b).all()
        for v in (a, b):
            assert int(v.min()) >= 0 and int(v.max()) <= m - 1
        assert len(torch.unique(a)) == min(m, 5000)  # the whole range occurs
    # a block from a rank that many ranks away is told apart up to the modulus
    assert (data.movement(0, 0, 100, "cpu", dtype) !=
            data.movement(min(m - 1, 1000), 0, 100, "cpu", dtype)).all()


def test_movement_moduli_are_exact_in_their_dtype():
    for dtype, exact in ((torch.float32, 2**24), (torch.float16, 2048), (torch.bfloat16, 256),
                         (torch.int8, 256), (torch.uint8, 256)):
        assert data.modulus(dtype) <= exact
        values = torch.arange(data.modulus(dtype), dtype=torch.int64)
        back = values.to(dtype).to(torch.int64) % 256 if dtype == torch.int8 else \
            values.to(dtype).to(torch.int64)  # int8 wraps 128..255 to negatives
        assert torch.equal(back, values)  # every value comes back: they are all told apart
    # consecutive indices differ too, so a shifted block is caught
    a = data.movement(0, 0, 500, "cpu")
    assert (a[1:] != a[:-1]).all()


@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.bfloat16, torch.float64,
                                   torch.int32, torch.int64, torch.int8, torch.uint8), ids=str)
def test_sentinel_never_a_movement_value(dtype):
    values = torch.arange(data.modulus(dtype), dtype=torch.int64)
    cast = values.to(dtype)
    if dtype != torch.int8:  # int8 wraps 128..250 to negatives, still distinct
        assert torch.equal(cast.long(), values)  # the pattern is exact in every dtype
    sentinel = torch.tensor([data.SENTINEL]).to(dtype)
    assert not (cast == sentinel).any()
    # a buffer left at the sentinel counts as wrong everywhere
    buf = torch.full((50,), data.SENTINEL).to(dtype)
    assert data.count_wrong(buf, lambda s, c: data.movement(2, s, c, "cpu", dtype)) == 50
