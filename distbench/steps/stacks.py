"""The toy models tp and pp train, and the shapes that size them, in the command line's own words
(hidden_size, ffn_size, heads, seq_len, micro_batch_size, layers, ...). Plain torch modules
built from a seed: how they are split over ranks is the parallel/ wrappers' business, so
nothing here knows of process groups.

- tp's stack: `layers` residual blocks of one kind, each `x + f(x)` with no bias and no norm,
  so the linear layers and the attention matmuls are all the work and FLOPs and communication
  have closed forms. MLP: x + down(gelu(up(x))). Attention: x + out(attention(qkv(x))) with
  one fused QKV projection whose rows are grouped per head.
- pp's stack: `layers` identical residual MLP blocks x + fc2(gelu(fc1(x))), both linears
  hidden x hidden with bias. Layer i's weights depend only on (seed, i), so any rank can build
  any layer and agree with a single-rank reference built from the same seed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from distbench.core.dtypes import element_bytes
from distbench.ops.torch_dtypes import TORCH_DTYPES

# ---------------------------------------------------------------------------------------------
# Shapes


@dataclass(frozen=True, kw_only=True)
class Shape:
    """What every toy model is sized by."""

    hidden_size: int
    seq_len: int
    micro_batch_size: int
    layers: int

    @classmethod
    def from_options(cls, opts):
        """The shape a command's options ask for: its fields share the options' names, and a
        field the options lack keeps its default."""
        names = [f.name for f in fields(cls) if hasattr(opts, f.name)]
        return cls(**{name: getattr(opts, name) for name in names})

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class StackShape(Shape):
    """tp's stack of MLP or attention blocks; one micro-batch per step."""

    ffn_size: int
    heads: int

    @property
    def tokens(self) -> int:
        return self.micro_batch_size * self.seq_len

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.heads

    def describe(self) -> str:
        return (f"hidden {self.hidden_size} ffn {self.ffn_size} heads {self.heads} "
                f"seq {self.seq_len} batch {self.micro_batch_size} layers {self.layers}")


@dataclass(frozen=True, kw_only=True)
class PipelineShape(Shape):
    """pp's stack of residual blocks, fed `micro_batches` micro-batches per step. The dtype and
    the seed are part of it because every rank rebuilds its own layers from them."""

    micro_batches: int
    dtype: str
    virtual_stages: int = 1
    seed: int = 1234

    @property
    def samples(self) -> int:
        return self.micro_batches * self.micro_batch_size

    @property
    def torch_dtype(self) -> torch.dtype:
        return TORCH_DTYPES[self.dtype]

    @property
    def elt_size(self) -> int:
        return element_bytes(self.dtype)


# ---------------------------------------------------------------------------------------------
# tp's blocks


class MLP(nn.Module):
    """x + down(gelu(up(x))), or gated (SwiGLU, Llama's): x + down(silu(gate(x)) * up(x));
    inner = ffn_size, or a shard of it. `gather` passes x on unchanged: it is where a
    sequence-parallel plan gathers the block's input (PrepareModuleInput, as torchtitan gathers
    its feed-forward's), once for up and the gate, the residual keeping its shard."""

    def __init__(self, hidden_size: int, inner: int, gated: bool = False):
        super().__init__()
        self.gather = nn.Identity()
        self.up = nn.Linear(hidden_size, inner, bias=False)
        self.gate = nn.Linear(hidden_size, inner, bias=False) if gated else None
        self.down = nn.Linear(inner, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.gather(x)
        if self.gate is None:
            return x + self.down(F.gelu(self.up(h)))
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Attention(nn.Module):
    """x + out(attention(qkv(x))); inner = heads x head_dim, or a shard of the heads; kv_inner
    the same for the key/value heads (grouped-query attention: fewer of them, each serving
    heads / kv_heads query heads). The QKV weight rows are grouped per key/value head (the
    queries it serves, its key, its value; then the next), so a contiguous shard of the rows is
    whole groups (Megatron's layout). The number of groups a forward runs on, and the
    sequence, are read from qkv's output, since a shard holds fewer heads than the shape says
    and a sequence-parallel input only a part of the sequence (qkv gathers it). `core` wraps
    the attention itself (selective recomputation checkpoints it)."""

    def __init__(self, hidden_size: int, inner: int, head_dim: int, kv_inner: int | None = None,
                 core=None):
        super().__init__()
        self.head_dim = head_dim
        self.per_group = inner // (kv_inner or inner)  # query heads per key/value head
        self.qkv = nn.Linear(hidden_size, inner + 2 * (kv_inner or inner), bias=False)
        self.out = nn.Linear(inner, hidden_size, bias=False)
        self.core = core or (lambda fn, *args: fn(*args))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r, d = self.per_group, self.head_dim
        qkv = self.qkv(x)
        b, s, _ = qkv.shape
        groups = qkv.shape[-1] // ((r + 2) * d)
        q, k, v = qkv.view(b, s, groups, r + 2, d).split([r, 1, 1], dim=3)
        # (b, heads, s, d); q a copy where a group serves several query heads
        q = q.reshape(b, s, groups * r, d).transpose(1, 2)
        k, v = (t.squeeze(3).transpose(1, 2) for t in (k, v))
        o = self.core(_attend, q, k, v, r > 1)
        return x + self.out(o.transpose(1, 2).reshape(b, s, groups * r * d))


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grouped: bool) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=grouped)


class Stack(nn.Module):
    def __init__(self, blocks: list[nn.Module]):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def make_block(kind: str, shape: StackShape, shards: int = 1) -> nn.Module:
    """One block of `kind` with 1/shards of its inner size (the ffn, or the heads)."""
    if kind == "mlp":
        return MLP(shape.hidden_size, shape.ffn_size // shards)
    return Attention(shape.hidden_size, shape.head_dim * (shape.heads // shards), shape.head_dim)


def make_stack(kind: str, shape: StackShape, shards: int = 1) -> Stack:
    return Stack([make_block(kind, shape, shards) for _ in range(shape.layers)])


def build_stack(kind: str, shape: StackShape, seed: int, device, dtype) -> Stack:
    """The whole stack, identical wherever the same seed is passed: it is initialised on the
    CPU generator, so the device plays no part, and the global RNG is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = make_stack(kind, shape)
    return model.to(device=device, dtype=dtype)


def make_inputs(shape: StackShape, seed: int, device, dtype
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's input (a leaf that needs its gradient, as activations do) and the gradient fed
    to the output: the same wherever the same seed is passed."""
    g = torch.Generator().manual_seed(seed + 1)
    dims = (shape.micro_batch_size, shape.seq_len, shape.hidden_size)
    x = torch.randn(dims, generator=g)
    dy = torch.randn(dims, generator=g)
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


# ---------------------------------------------------------------------------------------------
# pp's blocks


class Block(nn.Module):
    """x + fc2(gelu(fc1(x))), hidden_size -> hidden_size."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.fc1 = nn.Linear(hidden_size, hidden_size)
        self.fc2 = nn.Linear(hidden_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(x)))


def make_layer(index: int, shape: PipelineShape, device: torch.device) -> Block:
    """Layer `index` of the model: its weights depend on (seed, index) only."""
    gen = torch.Generator().manual_seed(shape.seed * 100_003 + index)
    block = Block(shape.hidden_size)
    scale = 1 / math.sqrt(shape.hidden_size)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * scale)
        block.fc2.weight.mul_(0.5)
    return block.to(device=device, dtype=shape.torch_dtype)


def make_stage(layer_indices: range, shape: PipelineShape, device: torch.device
               ) -> nn.Sequential:
    return nn.Sequential(*[make_layer(i, shape, device) for i in layer_indices])


def make_batch(shape: PipelineShape, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole batch (all micro-batches) and its regression target, the same on every rank."""
    gen = torch.Generator().manual_seed(shape.seed)
    dims = (shape.samples, shape.seq_len, shape.hidden_size)
    x = torch.randn(dims, generator=gen)
    target = torch.randn(dims, generator=gen)
    return (x.to(device=device, dtype=shape.torch_dtype),
            target.to(device=device, dtype=shape.torch_dtype))


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error. Per micro-batch with torch's schedules (which divide the gradients by
    the micro-batch count): the mean of equal micro-batch means is the whole batch's mean."""
    return F.mse_loss(output, target)
