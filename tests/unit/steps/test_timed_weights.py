"""The timed steps keep the weights as built (steps.dp_model.hold_still): on an H100 one step at
the check's learning rate sent a 24-layer model to NaN, and the step then timed NaNs, 20% faster
than numbers (docs/plan.md, Measured on a GPU). Each optimizer the commands time is held, with
every kernel still run; the step's own build holds after its checked step."""

from __future__ import annotations

import pytest
import torch
from fake_session import FakeSession

from distbench.parallel.device_mesh import layout_mesh, release_groups
from distbench.planner.layouts import Layout
from distbench.planner.models import parse_model
from distbench.steps import dp_model, mesh_model, recipe, step3d

CPU = torch.device("cpu")


def _params(dtype=torch.float32, n: int = 3) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(8, 4, generator=g).to(dtype).requires_grad_(True) for _ in range(n)]


def _stepped_moves(opt, params) -> bool:
    before = [p.detach().clone() for p in params]
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    return any(not torch.equal(b, p.detach()) for b, p in zip(before, params, strict=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_held_optimizer_steps_without_moving_the_weights(dtype):
    moving, held = _params(dtype), _params(dtype)
    assert _stepped_moves(dp_model.adamw(moving, CPU, dtype), moving)  # the control: it moves
    opt = dp_model.adamw(held, CPU, dtype)
    dp_model.hold_still(opt)
    assert not _stepped_moves(opt, held)


def test_a_held_optimizer_still_does_its_work():
    """The moments still update: a held step costs what a real one does."""
    params = _params()
    opt = dp_model.adamw(params, CPU, torch.float32)
    dp_model.hold_still(opt)
    _stepped_moves(opt, params)
    assert all(opt.state[p]["exp_avg"].abs().sum() > 0 for p in params)


def test_master_adamw_in_chunks_is_held_in_every_chunk(monkeypatch):
    monkeypatch.setattr(dp_model.MasterAdamW, "CHUNK_BYTES", 200)  # one tensor a chunk
    params = _params(torch.bfloat16)
    opt = dp_model.MasterAdamW(params, lr=dp_model.LR)
    assert len(opt.chunks) == len(params)
    dp_model.hold_still(opt)
    assert not _stepped_moves(opt, params)


def test_zero_redundancy_optimizer_is_held_in_its_partition(one_rank_group):
    from torch.distributed.optim import ZeroRedundancyOptimizer

    params = _params(torch.bfloat16)
    opt = ZeroRedundancyOptimizer(params, optimizer_class=dp_model.MasterAdamW, lr=dp_model.LR)
    dp_model.hold_still(opt)
    assert not _stepped_moves(opt, params)


def _session():
    return FakeSession(timeout=60.0)


@pytest.mark.parametrize("checked", [False, True])
def test_the_steps_build_keeps_its_weights_after_the_checked_step(one_rank_group, monkeypatch,
                                                                 checked):
    """`step`'s build, checked or not: the weights the timed steps start from are those after
    the check's one step (or as built), however many untimed and timed steps follow."""
    monkeypatch.setattr(recipe, "agreed", lambda s, label, fn: (fn(), ""))
    model = parse_model("--model", "layers=2,hidden=16,ffn=32,heads=2,seq=4,batch=2")
    layout = Layout(tp=1, pp=1, dp=1, zero=0, micro_batches=1)
    mesh = layout_mesh(layout, CPU)
    try:
        ref = step3d._reference(model, torch.float32) if checked else None
        (mm, pairs), reason = step3d._checked_build(_session(), mesh, model, layout,
                                                   torch.float32, ref, "test")
        assert reason == "" and (pairs is not None) == checked
        if checked:  # the checked step itself trained: the check needs the update
            built = mesh_model.build(model, layout, CPU, torch.float32, ref.eps, mesh)
            assert any(not torch.equal(a, b) for a, b in zip(built.params, mm.params,
                                                             strict=True))
        before = [p.detach().clone() for p in mm.params]
        for _ in range(3):
            mm.step()
        assert all(torch.equal(b, p.detach()) for b, p in zip(before, mm.params, strict=True))
        assert torch.isfinite(mm.loss)
    finally:
        release_groups(mesh)
