"""Megatron-style tensor-parallel blocks, built the way production code builds them: one module
with the full shapes on every rank (same seed), then torch.distributed.tensor.parallel's
parallelize_module shards it over a 1-D DeviceMesh.

- MLP: up-projection ColwiseParallel (h -> f/n on each rank), GELU, down-projection
  RowwiseParallel (f/n -> h, outputs summed by one all-reduce). Backward: one all-reduce of the
  input gradient of the column-parallel layer (DTensor's from_local backward turns the partial
  input gradient into a replicated one).
- Attention: one fused QKV projection ColwiseParallel (h -> 3h/n: its output rows are laid out
  head by head, [q_h, k_h, v_h] for each head h, so a contiguous row shard holds whole heads),
  scaled_dot_product_attention on the rank's heads, output projection RowwiseParallel.
  Separate q/k/v projections would cost three backward all-reduces instead of one.

Every block is `x + f(x)` (residual), no bias, no norm: the linear layers and the attention
matmuls are all the work, so FLOPs and communication have closed forms (below).

The same module classes with per-rank shard shapes and no DTensor make the compute-only
baseline; with full shapes on one rank, the single-rank reference and the scaling view's t1.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from distbench.reference import Comparison, compare  # noqa: F401 - strat.compare for callers

BLOCKS = ("mlp", "attention")

# Relative tolerance of the correctness check: |tp - reference| <= rtol * max|reference|, per
# compared tensor (output, input gradient, each weight gradient). The sharded path sums partial
# products in another order than one big matmul, so the last bits of each dtype may differ.
RTOL = {"float64": 1e-10, "float32": 1e-5, "float16": 1e-2, "bfloat16": 2e-2}

# One reference forward+backward (and the TP one) on the configured shapes costs this much at
# most; larger configurations are checked on small_shape() instead.
CHECK_MAX_FLOPS = 2e9


@dataclass(frozen=True)
class Shape:
    hidden: int
    ffn: int
    heads: int
    seq: int
    batch: int
    layers: int

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    def describe(self) -> str:
        return (f"hidden {self.hidden} ffn {self.ffn} heads {self.heads} seq {self.seq} "
                f"batch {self.batch} layers {self.layers}")

    def to_json(self) -> dict:
        return asdict(self)


def shape_of(opts) -> Shape:
    return Shape(opts.hidden_size, opts.ffn_size, opts.heads, opts.seq_len,
                 opts.micro_batch_size, opts.layers)


def small_shape(world: int) -> Shape:
    """A configuration that every world size can split: 2 heads of 16 per rank, ffn 64/rank."""
    heads = 2 * world
    return Shape(hidden=16 * heads, ffn=64 * world, heads=heads, seq=8, batch=2, layers=2)


# ------------------------------------------------------------------------------------------
# Formulas (pure arithmetic: unit-tested)
# ------------------------------------------------------------------------------------------

def params_per_rank(kind: str, shape: Shape, world: int) -> int:
    """Weights of this rank's shard of the `layers` blocks (no bias)."""
    h, f = shape.hidden, shape.ffn
    per_layer = 2 * h * f if kind == "mlp" else 4 * h * h  # up+down, or qkv (3h^2) + out (h^2)
    return per_layer * shape.layers // world


def flops_per_rank(kind: str, shape: Shape, world: int) -> float:
    """Forward+backward FLOPs of this rank's shard per step: 3 x 2 x params x tokens for the
    linear layers (backward is twice the forward), plus, for attention, the score (QK^T) and
    value (PV) matmuls on the rank's heads: 2 x 2 x b x s^2 x h/n forward, times 3."""
    linear = 3 * 2 * params_per_rank(kind, shape, world) * shape.tokens
    if kind == "mlp":
        return float(linear)
    attn = 3 * 2 * 2 * shape.batch * shape.seq * shape.seq * (shape.hidden // world)
    return float(linear + attn * shape.layers)


def allreduce_bytes(kind: str, shape: Shape, elt: int, world: int) -> int:
    """Bytes all-reduced per step per rank: forward, one (b, s, h) per row-parallel projection;
    backward, one (b, s, h) per column-parallel input gradient. Two per layer, the same for
    both block kinds (the fused QKV projection is one column-parallel layer). None on 1 rank."""
    if world == 1:
        return 0
    return 2 * shape.layers * shape.tokens * shape.hidden * elt


def comm_fraction(step_s: float, compute_s: float) -> tuple[float, bool]:
    """1 - compute_only/step, clamped at 0 (and whether it was clamped)."""
    if step_s <= 0:
        return 0.0, True
    frac = 1.0 - compute_s / step_s
    return (0.0, True) if frac < 0 else (frac, False)


def implied_busbw_gbps(ar_bytes: int, world: int, step_s: float, compute_s: float
                       ) -> float | None:
    """All-reduce bus bandwidth if all of (step - compute_only) were the all-reduces, in decimal
    GB/s with nccl-tests' all_reduce factor 2(n-1)/n. None when step <= compute_only."""
    exposed = step_s - compute_s
    if exposed <= 0 or ar_bytes <= 0:
        return None
    return ar_bytes * 2 * (world - 1) / world / exposed / 1e9


def scaling(t1_s: float, tn_s: float, world: int) -> tuple[float, float]:
    """speedup = t1 / tn, efficiency = t1 / (n x tn)."""
    speedup = t1_s / tn_s
    return speedup, speedup / world


def check_shape(shape: Shape, world: int) -> tuple[Shape, bool]:
    """The configured shapes when one full forward+backward of both blocks is cheap, else the
    small configuration. Second value: whether the configured shapes are used."""
    cost = sum(flops_per_rank(kind, shape, 1) for kind in BLOCKS)
    if cost <= CHECK_MAX_FLOPS:
        return shape, True
    return small_shape(world), False


# ------------------------------------------------------------------------------------------
# Modules
# ------------------------------------------------------------------------------------------

class MLP(nn.Module):
    """x + down(gelu(up(x))); inner = ffn (full) or ffn / n (one rank's shard)."""

    def __init__(self, hidden: int, inner: int):
        super().__init__()
        self.up = nn.Linear(hidden, inner, bias=False)
        self.down = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(x)))


class Attention(nn.Module):
    """x + out(attention(qkv(x))); inner = heads x head_dim (full) or the rank's heads x head_dim.
    The QKV weight rows are grouped per head ([q, k, v] of head 0, then of head 1, ...), so a
    column-parallel shard of the rows is whole heads. The number of heads a forward runs on is
    read from the tensor (it is the local count under TP)."""

    def __init__(self, hidden: int, inner: int, head_dim: int):
        super().__init__()
        self.head_dim = head_dim
        self.qkv = nn.Linear(hidden, 3 * inner, bias=False)
        self.out = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        qkv = self.qkv(x)
        heads = qkv.shape[-1] // (3 * self.head_dim)
        q, k, v = qkv.view(b, s, heads, 3, self.head_dim).permute(3, 0, 2, 1, 4).unbind(0)
        o = F.scaled_dot_product_attention(q, k, v)  # (b, heads, s, d)
        return x + self.out(o.transpose(1, 2).reshape(b, s, heads * self.head_dim))


class Stack(nn.Module):
    def __init__(self, blocks: list[nn.Module]):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def _block(kind: str, shape: Shape, world: int) -> nn.Module:
    if kind == "mlp":
        return MLP(shape.hidden, shape.ffn // world)
    head_dim = shape.hidden // shape.heads
    return Attention(shape.hidden, head_dim * (shape.heads // world), head_dim)


def build_full(kind: str, shape: Shape, seed: int, device, dtype) -> Stack:
    """The unsharded stack, identical on every rank that passes the same seed (built on the CPU
    generator, so the same on any device)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Stack([_block(kind, shape, 1) for _ in range(shape.layers)])
    return model.to(device=device, dtype=dtype)


def local_shard(full: Stack, kind: str, shape: Shape, rank: int, world: int) -> Stack:
    """Plain modules with this rank's shard shapes and weights (the rows/columns
    ColwiseParallel/RowwiseParallel give it): the same computation as TP minus communication."""
    p = next(full.parameters())
    local = Stack([_block(kind, shape, world) for _ in range(shape.layers)]).to(
        device=p.device, dtype=p.dtype)
    with torch.no_grad():
        for src, dst in zip(full.blocks, local.blocks, strict=True):
            col, row = ("up", "down") if kind == "mlp" else ("qkv", "out")
            getattr(dst, col).weight.copy_(getattr(src, col).weight.chunk(world, 0)[rank])
            getattr(dst, row).weight.copy_(getattr(src, row).weight.chunk(world, 1)[rank])
    return local


def tp_plan(kind: str, layers: int) -> dict:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    col, row = ("up", "down") if kind == "mlp" else ("qkv", "out")
    plan = {}
    for i in range(layers):
        plan[f"blocks.{i}.{col}"] = ColwiseParallel()
        plan[f"blocks.{i}.{row}"] = RowwiseParallel()
    return plan


def device_mesh(device: torch.device, world: int):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, (world,))


def parallelize(full: Stack, kind: str, shape: Shape, mesh) -> Stack:
    """A deep copy of `full`, sharded by parallelize_module (full stays the reference)."""
    from torch.distributed.tensor.parallel import parallelize_module

    return parallelize_module(copy.deepcopy(full), mesh, tp_plan(kind, shape.layers))


def inputs(shape: Shape, seed: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's input (a leaf that needs its gradient, as activations do) and the gradient fed
    to the output: the same on every rank."""
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(shape.batch, shape.seq, shape.hidden, generator=g)
    dy = torch.randn(shape.batch, shape.seq, shape.hidden, generator=g)
    return (x.to(device=device, dtype=dtype).requires_grad_(True),
            dy.to(device=device, dtype=dtype))


def make_step(model: nn.Module, x: torch.Tensor, dy: torch.Tensor):
    """One training step's forward and backward (gradients reset, not accumulated)."""
    params = list(model.parameters())

    def step() -> torch.Tensor:
        for p in params:
            p.grad = None
        x.grad = None
        y = model(x)
        y.backward(dy)
        return y

    return step


# ------------------------------------------------------------------------------------------
# Communication actually issued, counted from the dispatcher
# ------------------------------------------------------------------------------------------

_COMM_NAMESPACES = ("_c10d_functional", "c10d_functional", "c10d")


class CommCounter(TorchDispatchMode):
    """Counts the collectives (and their input bytes) that run inside it: what DTensor really
    issued, to hold against allreduce_bytes(). Waits are not collectives."""

    def __init__(self):
        super().__init__()
        self.counts: dict[str, int] = {}
        self.bytes: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.distributed.tensor import DTensor

        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented  # let DTensor turn itself into plain ops and collectives
        out = func(*args, **(kwargs or {}))
        namespace = getattr(func, "namespace", "")
        name = func._overloadpacket.__name__ if hasattr(func, "_overloadpacket") else str(func)
        # waits and autograd wrappers (`_wrap_tensor_autograd`) are not collectives
        collective = namespace in _COMM_NAMESPACES and not name.startswith(("wait", "_"))
        if collective or name == "shard_dim_alltoall":
            first = args[0] if args else None
            if isinstance(first, list | tuple):
                first = first[0] if first else None
            nbytes = first.numel() * first.element_size() if isinstance(first, torch.Tensor) else 0
            key = name.rstrip("_")
            self.counts[key] = self.counts.get(key, 0) + 1
            self.bytes[key] = self.bytes.get(key, 0) + nbytes
        return out

    def allreduce_bytes(self) -> int:
        return sum(v for k, v in self.bytes.items() if k in ("all_reduce", "allreduce"))

    def other_collectives(self) -> dict[str, int]:
        return {k: v for k, v in self.counts.items() if k not in ("all_reduce", "allreduce")}


# ------------------------------------------------------------------------------------------
# Correctness: TP against the single-rank reference from the same seed
# ------------------------------------------------------------------------------------------

def tp_vs_reference(kind: str, shape: Shape, seed: int, device, dtype, mesh,
                    corrupt=None) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """One forward+backward of the sharded stack and of the unsharded reference (deep copy of the
    same seeded module), on the same input: (name, tp, reference) for the output, the input
    gradient and every weight gradient (the sharded ones gathered whole). `corrupt(tensor)` is
    applied to a copy of the TP output before comparison (the test hook)."""
    from torch.distributed.tensor import DTensor

    ref = build_full(kind, shape, seed, device, dtype)
    tp = parallelize(ref, kind, shape, mesh)
    x, dy = inputs(shape, seed, device, dtype)
    x_ref = x.detach().clone().requires_grad_(True)
    y = make_step(tp, x, dy)().detach().clone()
    y_ref = make_step(ref, x_ref, dy)().detach()
    if corrupt is not None:
        corrupt(y)
    pairs = [("output", y, y_ref), ("input gradient", x.grad, x_ref.grad)]
    for (name, p), (_, p_ref) in zip(tp.named_parameters(), ref.named_parameters(), strict=True):
        grad = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        pairs.append((f"{name} gradient", grad, p_ref.grad))
    return pairs
