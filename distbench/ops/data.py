"""Deterministic inputs from (rank, element index, seed) and the expected results, computed in
closed form rather than by a collective, so a broken op cannot vouch for itself.

Reductions use values that depend on the rank only through (index + rank) mod PERIOD, so the
result for n ranks is a sum over PERIOD residues with known multiplicities: O(PERIOD) per element
whatever n is. Data movement ops use a pattern that differs per rank and per index; received
buffers start as a sentinel the pattern never produces.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

PERIOD = 7
SENTINEL = -1  # uint8 sees 255, int8 -1: never a movement value (those are 0..modulus-1 <= 250)
CHUNK = 1 << 20  # elements per generated block: bounds temporary int64 memory (~0.2 GB)

# Movement values are (5 i + 3 rank + SEED) mod a prime, as many distinct values as the dtype
# holds exactly, so a block from the wrong rank or offset shows unless the ranks (or offsets)
# differ by a multiple of that prime: 16M for 32/64-bit types, 2039 and 251 for 16/8-bit ones.
_MODULI = {torch.float16: 2039, torch.bfloat16: 251, torch.int8: 251, torch.uint8: 251}
_WIDE_MODULUS = 16_777_213  # largest prime below 2**24: exact in float32
SEED = 12345

# |got - expected| <= atol + rtol * |expected|. Exact (0, 0) unless listed: integers and
# float32/64 are exact at the magnitudes used; 16-bit floats and avg get a documented tolerance.
TOLERANCE = {
    torch.float16: (1e-3, 2e-3),
    torch.bfloat16: (1e-2, 1.6e-2),
}
AVG_TOLERANCE = {torch.float32: (1e-6, 1e-6), torch.float64: (1e-12, 1e-12)}


def _index(start: int, count: int, device) -> torch.Tensor:
    return torch.arange(start, start + count, dtype=torch.int64, device=device)


def modulus(dtype: torch.dtype) -> int:
    return _MODULI.get(dtype, _WIDE_MODULUS)


def movement(rank: int, start: int, count: int, device,
             dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (_index(start, count, device) * 5 + rank * 3 + SEED) % modulus(dtype)


def _residue_values(k: torch.Tensor, redop: str, dtype: torch.dtype) -> torch.Tensor:
    if redop == "prod":  # +-1 (1 or 2 for uint8): products stay exact for any rank count
        if dtype == torch.uint8:
            return torch.where(k == 0, 2, 1)
        return torch.where(k % 2 == 1, -1, 1)
    return k if dtype == torch.uint8 else k - 3


def reduction_input(rank: int, start: int, count: int, redop: str, dtype, device) -> torch.Tensor:
    k = (_index(start, count, device) * 5 + SEED + rank) % PERIOD
    return _residue_values(k, redop, dtype)


def reduction_expected(start: int, count: int, n: int, redop: str, dtype, device) -> torch.Tensor:
    """Element-wise reduction over ranks 0..n-1 of reduction_input, in float64 or int64. An
    element's result depends on its index only through (5 index + SEED) mod PERIOD, so it is
    looked up in the PERIOD results worked out once: the check then costs a gather per element,
    not a PERIOD x count table (1.9 s per rank at 128 MiB before, most of a default sweep)."""
    base = (_index(start, count, device) * 5 + SEED) % PERIOD
    return _expected_by_residue(n, redop, dtype, device)[base]


def _expected_by_residue(n: int, redop: str, dtype, device) -> torch.Tensor:
    """Result b: the reduction over ranks 0..n-1 for an element whose (5 index + SEED) mod PERIOD
    is b; rank r holds residue (b + r) mod PERIOD there."""
    base = torch.arange(PERIOD, device=device)
    ks = torch.arange(PERIOD, device=device)
    # ranks r with (base + r) % PERIOD == k: n // PERIOD, plus one for the first n % PERIOD
    mult = n // PERIOD + (((ks[:, None] - base[None, :]) % PERIOD) < n % PERIOD).long()
    vals = _residue_values(ks, redop, dtype)[:, None].expand_as(mult)
    present = mult > 0
    if redop in ("sum", "avg"):
        out = (mult * vals).sum(0)
        return out.double() / n if redop == "avg" else out
    if redop == "prod":
        if dtype == torch.uint8:
            twos = mult[0]
            return torch.where(twos >= 8, 0, 2 ** twos.clamp(max=8))
        negatives = (mult * (vals < 0)).sum(0)
        return torch.where(negatives % 2 == 1, -1, 1)
    big = 1 << 40
    if redop == "max":
        return torch.where(present, vals, -big).amax(0)
    return torch.where(present, vals, big).amin(0)


def fill(buf: torch.Tensor, make) -> None:
    """buf[i] = make(start, count)[i - start], chunk by chunk."""
    for start in range(0, buf.numel(), CHUNK):
        count = min(CHUNK, buf.numel() - start)
        buf[start:start + count].copy_(make(start, count))


def count_wrong(got: torch.Tensor, make, redop: str | None = None) -> int:
    """Elements of got that differ from make(start, count), chunk by chunk."""
    dtype = got.dtype
    if redop == "avg":
        atol, rtol = AVG_TOLERANCE.get(dtype, TOLERANCE.get(dtype, (0.0, 0.0)))
    else:
        atol, rtol = TOLERANCE.get(dtype, (0.0, 0.0))
    wrong = 0
    for start in range(0, got.numel(), CHUNK):
        count = min(CHUNK, got.numel() - start)
        expected = make(start, count)
        part = got[start:start + count]
        if dtype.is_floating_point:
            exp = expected.double()
            ok = (part.double() - exp).abs() <= atol + rtol * exp.abs()
        else:  # integer results wrap like the hardware does: compare after the same cast
            ok = part == expected.to(dtype)
        wrong += int((~ok).sum())
    return wrong


# ---------------------------------------------------------------------------------------------
# What the op builders fill and check, by buffer (offset: the buffer's first element index in
# the pattern, for a slice of a larger logical buffer)

def fill_reduction(buf: torch.Tensor, ctx, offset: int = 0) -> None:
    fill(buf, lambda start, count: reduction_input(ctx.rank, offset + start, count, ctx.redop,
                                                   buf.dtype, buf.device))


def wrong_reduction(buf: torch.Tensor, ctx, offset: int = 0) -> int:
    return count_wrong(buf, lambda start, count: reduction_expected(
        offset + start, count, ctx.n, ctx.redop, buf.dtype, buf.device), ctx.redop)


def _movement_of(rank: int, buf: torch.Tensor, offset: int):
    return lambda start, count: movement(rank, offset + start, count, buf.device, buf.dtype)


def fill_movement(buf: torch.Tensor, rank: int, offset: int = 0) -> None:
    fill(buf, _movement_of(rank, buf, offset))


def wrong_movement(buf: torch.Tensor, rank: int, offset: int = 0) -> int:
    """Elements of buf that are not what `rank` filled its buffer with."""
    return count_wrong(buf, _movement_of(rank, buf, offset))


def blocks(buf: torch.Tensor, n: int) -> list[torch.Tensor]:
    return list(buf.view(n, -1).unbind(0))


def wrong_blocks(out: torch.Tensor, n: int, offset: int = 0) -> int:
    """Block q of `out` should be rank q's movement pattern."""
    return sum(wrong_movement(b, q, offset) for q, b in enumerate(blocks(out, n)))


# ---------------------------------------------------------------------------------------------
# torch.distributed calls by the names the builders use (resolved once, not in timed code)

REDOPS = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "max": dist.ReduceOp.MAX,
          "min": dist.ReduceOp.MIN, "avg": dist.ReduceOp.AVG}

# torch 2.13 renamed these; 2.4 only has the old names.
reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def reduce_op(name: str):
    return REDOPS[name]
