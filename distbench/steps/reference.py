"""Comparing a distributed result with its single-rank reference, tensor by tensor: the one
rule tp and pp both check by. A tensor passes when max|got - reference| <= rtol x max|reference|
(relative to the tensor's own scale, since gradients of a mean loss are tiny)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# (what it is, the distributed result, the single-rank reference)
Pair = tuple[str, torch.Tensor, torch.Tensor]


@dataclass
class Comparison:
    max_abs_err: float  # over every compared tensor
    worst_ratio: float  # max over tensors of err / (rtol x max|reference|): > 1 is wrong
    worst: str  # which tensor has worst_ratio
    wrong: int  # tensors with a ratio above 1 (non-finite or misshapen ones count)


def compare(pairs: list[Pair], rtol: float) -> Comparison:
    max_err, worst_ratio, worst, wrong = 0.0, 0.0, "", 0
    for name, got, ref in pairs:
        got, ref = got.detach().double(), ref.detach().double()
        if got.shape != ref.shape or not torch.isfinite(got).all():
            err = float("inf")
        else:
            err = float((got - ref).abs().max()) if got.numel() else 0.0
        scale = float(ref.abs().max()) if ref.numel() else 0.0
        ratio = err / (rtol * scale) if scale > 0 else (0.0 if err == 0 else float("inf"))
        max_err = max(max_err, err)
        wrong += not ratio <= 1
        if ratio > worst_ratio or not worst:
            worst_ratio, worst = ratio, name
    return Comparison(max_err, worst_ratio, worst, wrong)
