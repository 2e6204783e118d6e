"""The most memory a rank's tensors hold in a step off a GPU, where no allocator counts it:
a dispatch mode that sees every op's tensors, counts each storage once from when it is first
seen to when it is freed (a weak reference's callback), and re-reads the sizes it counts after
every op, since FSDP frees and refills its gathered parameters by resizing their storage in
place, not through an op. What the step starts holding (every tensor Python holds: its
modules' parameters, its optimizer's states, its inputs, the pipeline's buffers) is counted
from the start, but for what the caller says is not the step's (the check's reference).

Only the sizes that can have changed are read again: those of the op's own tensors (resize_,
set_ and out= ops) and those resized through UntypedStorage.resize_ since the last op, which
FSDP's free and refill call and which is wrapped while a count runs (reading every storage after
every op was a tenth of a 4-rank step run).

torch's own MemTracker (torch.distributed._tools) refuses a module called more than once in
what it tracks: every micro-batch calls the stage again."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves


class HostPeak(TorchDispatchMode):
    def __init__(self, held: Iterable = (), ignore: Iterable = ()):
        super().__init__()
        self._sizes: dict[int, int] = {}  # a storage's key -> the bytes counted for it
        self._storages: dict[int, weakref.ref] = {}
        self._ignored = {plain.untyped_storage()._cdata for thing in ignore
                         for t in _tensors_of(thing) for plain in _plain(t)}
        self.resized: set[int] = set()  # keys resized in place since the last op
        self.now = 0
        self.peak = 0
        for thing in [*held, *_live_tensors()]:
            for t in _tensors_of(thing):
                self._see(t)
        self.peak = self.now

    def __enter__(self):
        _watch_resizes(self)
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            _unwatch_resizes(self)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        touched = self.resized
        for t in tree_leaves((args, kwargs, out)):
            if isinstance(t, torch.Tensor):
                touched.update(self._see(t))
        self._reread(touched)
        touched.clear()
        self.peak = max(self.peak, self.now)
        return out

    def _see(self, t: torch.Tensor) -> list[int]:
        """Counts `t`'s storages not counted yet; the keys of all of them."""
        keys = []
        for plain in _plain(t):
            st = plain.untyped_storage()
            key = st._cdata
            keys.append(key)
            if key in self._sizes or key in self._ignored:
                continue
            self._sizes[key] = st.nbytes()
            self.now += self._sizes[key]
            self._storages[key] = weakref.ref(st, lambda _, key=key: self._freed(key))
        return keys

    def _freed(self, key: int) -> None:
        self.now -= self._sizes.pop(key, 0)
        self._storages.pop(key, None)

    def _reread(self, keys: Iterable[int]) -> None:
        for key in keys:
            ref = self._storages.get(key)
            st = ref() if ref is not None else None
            if st is not None:
                n = st.nbytes()
                self.now += n - self._sizes[key]
                self._sizes[key] = n


# UntypedStorage.resize_ wrapped while any count runs: the counts note what it resized.
_COUNTING: list[HostPeak] = []
_RESIZE_LOCK = threading.Lock()
_torch_resize = None
_TORCH_OWN = "resize_" in vars(torch.UntypedStorage)  # else inherited from torch._C


def _resize(storage, size):
    result = _torch_resize(storage, size)
    for mode in list(_COUNTING):
        mode.resized.add(storage._cdata)
    return result


def _watch_resizes(mode: HostPeak) -> None:
    global _torch_resize
    with _RESIZE_LOCK:
        if not _COUNTING:
            _torch_resize = torch.UntypedStorage.resize_
            torch.UntypedStorage.resize_ = _resize
        _COUNTING.append(mode)


def _unwatch_resizes(mode: HostPeak) -> None:
    with _RESIZE_LOCK:
        _COUNTING.remove(mode)
        if not _COUNTING:
            if _TORCH_OWN:
                torch.UntypedStorage.resize_ = _torch_resize
            else:
                del torch.UntypedStorage.resize_  # the inherited one again


def _plain(t: torch.Tensor) -> Iterator[torch.Tensor]:
    """The plain tensors holding `t`'s data (a DTensor's local shard)."""
    if is_traceable_wrapper_subclass(t):
        names, _ = t.__tensor_flatten__()
        for name in names:
            inner = getattr(t, name)
            if isinstance(inner, torch.Tensor):
                yield from _plain(inner)
    elif t.device.type != "meta":
        yield t


def _live_tensors() -> list[torch.Tensor]:
    """Every tensor Python holds now (the collector tracks them): what a wrapper holds out of
    sight, an optimizer's states keyed by parameters a wrapper swapped, a schedule's buffers."""
    return [o for o in gc.get_objects() if issubclass(type(o), torch.Tensor)]


def _tensors_of(thing) -> Iterator[torch.Tensor]:
    if thing is None:
        return
    if isinstance(thing, nn.Module):
        for p in thing.parameters():
            yield p
            if p.grad is not None:
                yield p.grad
        yield from thing.buffers()
    elif isinstance(thing, torch.optim.Optimizer):
        for state in thing.state.values():
            yield from (v for v in state.values() if isinstance(v, torch.Tensor))
        inner = getattr(thing, "optim", None)  # ZeroRedundancyOptimizer's local optimizer
        if inner is not None:
            yield from _tensors_of(inner)
    elif isinstance(thing, torch.Tensor):
        yield thing
    elif isinstance(thing, dict):
        for v in thing.values():
            yield from _tensors_of(v)


def peak_bytes(step: Callable[[], object], held: Iterable, ignore: Iterable = ()) -> int:
    """The most bytes the tensors held in one call of `step`, what Python holds at its start
    (`held` too) counted from the start, but for `ignore`'s (modules, optimizers, tensors,
    dicts of them)."""
    with HostPeak(held, ignore) as mode:
        step()
    return mode.peak
