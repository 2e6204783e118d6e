"""Comparing a distributed result with its single-rank reference, tensor by tensor: the one
rule tp, pp and dp all check by, and the tolerances they check with. A tensor passes when
max|got - reference| <= rtol x max|reference| (relative to the tensor's own scale, since
gradients of a mean loss are tiny)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# tp: the sharded path sums partial products in another order than one big matmul, so the last
# bits of each dtype may differ; per compared tensor (output, input gradient, each weight
# gradient).
_TP_RTOL = {"float64": 1e-10, "float32": 1e-5, "float16": 1e-2, "bfloat16": 2e-2}

# The relative tolerance of each step kind's check, by dtype.
RTOL: dict[str, dict[str, float]] = {
    "tp": _TP_RTOL,
    # the pipeline sums micro-batch gradients where the reference computes the whole batch at
    # once, so the two differ by rounding only
    "pp": {"float32": 1e-4, "float64": 1e-10, "bfloat16": 5e-2, "float16": 1e-2},
    # tp's: the data-parallel modes sum the ranks' gradients in another order than one rank on
    # the global batch, rounding of the same kind (docs/commands/dp.md says "as tp")
    "dp": _TP_RTOL,
    # step composes them: TP's sharded sums and the pipeline's micro-batches, so pp's
    "step": {"float32": 1e-4, "float64": 1e-10, "bfloat16": 5e-2, "float16": 1e-2},
}

@dataclass
class Reference:
    """The whole model on one rank, from the same seed and batch: what a distributed step's
    gradients and updated parameters are checked against (tp compares its own tensors)."""

    grads: dict[str, torch.Tensor]  # of the last step
    params: dict[str, torch.Tensor]  # after the optimizer's steps
    eps: float  # AdamW's, a share of the largest gradient
    loss: float | None = None  # the 3D step's check compares the loss too


# (what it is, the distributed result, the single-rank reference)
TensorPair = tuple[str, torch.Tensor, torch.Tensor]


@dataclass
class TensorCheck:
    """The verdict on a list of TensorPairs."""

    max_abs_err: float  # over every compared tensor
    worst_ratio: float  # max over tensors of err / (rtol x max|reference|): > 1 is wrong
    worst: str  # which tensor has worst_ratio
    wrong: int  # tensors with a ratio above 1 (non-finite or misshapen ones count)


def check_tensors(pairs: list[TensorPair], rtol: float) -> TensorCheck:
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
    return TensorCheck(max_err, worst_ratio, worst, wrong)
