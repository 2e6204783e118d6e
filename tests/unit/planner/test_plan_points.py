"""What plan measures on its workers, bounded by the memory a rank may hold (planner.points),
and the refusal of a run this machine cannot hold before any worker or file exists: on 80 GB
GPUs `plan --workers 8 --model 7b` measured a 137 GB all-reduce and layers at micro-batches no
fitting layout runs; on this machine `plan --workers 2 --model 70b` was OOM-killed."""

from __future__ import annotations

import helpers
import pytest
from helpers import assert_one_line_error

from distbench.planner import points
from distbench.planner.layouts import enumerate_layouts
from distbench.planner.memory import held_by_step, usable_bytes
from distbench.planner.models import PRESETS
from distbench.platform import limits

GIB = 2**30
ZERO = (0, 1, 2, 3)
H100 = usable_bytes(80 * GIB)  # what a layout may use of an 80 GB GPU


def test_7b_on_8_gpus_measures_only_what_an_80gb_gpu_holds():
    model = PRESETS["7b"]
    fitting = points.fitting_layouts(model, 8, 8, ZERO, 2, H100)
    every = list(enumerate_layouts(model, 8, 8, ZERO))
    assert 0 < len(fitting) < len(every)
    assert all(held_by_step(model, lay, 2) <= H100 for lay in fitting)
    sizes, skipped = points.sweep_sizes(model, fitting, 2, H100)
    largest = max(model.params / (lay.tp * lay.pp) * 2 for lay in fitting)
    # the sweep reaches the largest collective a fitting layout issues, and no further than one
    # 4x step past it (it went to 8x: a 137 GB float32 all-reduce for 7b)
    assert largest <= max(sizes) < 4 * largest and skipped == []
    assert points.need(model, 8, 8, ZERO, 2, H100) <= H100


def test_the_compute_points_are_those_of_the_fitting_layouts():
    model = PRESETS["7b"]
    fitting = points.fitting_layouts(model, 8, 8, ZERO, 2, H100)
    kept, skipped = points.compute_points(model, fitting, 2, H100)
    assert set(kept) == {(lay.tp, lay.micro_batch_size(model)) for lay in fitting}
    every = {(lay.tp, lay.micro_batch_size(model)) for lay in enumerate_layouts(model, 8, 8, ZERO)}
    assert max(m for _, m in every) > max(m for _, m in kept)  # 128 samples a micro-batch: never
    assert skipped == []


def test_a_point_past_the_budget_is_skipped_and_named():
    model = PRESETS["toy"]
    layouts = list(enumerate_layouts(model, 4, 4, ZERO))
    sizes, _ = points.sweep_sizes(model, layouts, 4, float("inf"))
    budget = sizes[-2] * points.BUFFERS_PER_POINT
    kept, skipped = points.sweep_sizes(model, layouts, 4, budget)
    assert kept == sizes[:-1]
    assert [(x.what, x.need) for x in skipped] == [
        (f"collectives of {sizes[-1]} bytes", 2 * sizes[-1])]
    shapes, _ = points.compute_points(model, layouts, 4, float("inf"))
    big = max(shapes, key=lambda p: points.compute_point_bytes(model, *p, 4))
    budget = points.compute_point_bytes(model, *big, 4) - 1
    kept, skipped = points.compute_points(model, layouts, 4, budget)
    assert big not in kept and [x.need for x in skipped] == [budget + 1]
    assert skipped[0].what == f"one layer at tp {big[0]}, micro-batch {big[1]}"


@pytest.mark.parametrize("name, world", [("7b", 2), ("70b", 2)])
def test_a_model_no_layout_of_fits_needs_its_smallest_layout(name, world):
    model = PRESETS[name]
    budget = 8 * GIB
    assert points.fitting_layouts(model, world, world, ZERO, 4, budget) == []
    smallest, need = points.smallest_layout(model, world, world, ZERO, 4)
    assert need == min(held_by_step(model, lay, 4)
                       for lay in enumerate_layouts(model, world, world, ZERO))
    assert points.need(model, world, world, ZERO, 4, budget) == need > budget


def test_toy_on_4_workers_fits_easily():
    need = points.need(PRESETS["toy"], 4, 4, ZERO, 4, 4 * GIB)
    assert 0 < need < 64 * 2**20


# ---- refused before any worker, before torch, nothing on disk ---------------------------------

@pytest.mark.parametrize("argv", [
    ("plan", "--workers", "2", "--model", "70b"),
    ("plan", "--workers", "2", "--model", "7b"),
    ("step", "--workers", "4", "--model", "7b"),
])
def test_a_model_this_machine_cannot_hold_is_refused_at_once(tmp_path, monkeypatch, argv):
    """In this process, with the real dispatch: a worker it started would fail the test (not
    multiproc). Each needs hundreds of GiB a worker, against the 24 GiB planted as this
    machine's; gloo named, so that a GPU machine checks the host's memory too."""
    monkeypatch.setattr(limits, "available_memory", lambda: 24 * GIB)
    out = tmp_path / "results"
    with helpers.within(5):
        proc = helpers.cli(tmp_path, *argv, "--backend", "gloo", "--out", str(out),
                           dispatch=True)
    line = assert_one_line_error(proc, None, "--model", ours=True)
    assert "workers and their launcher need about" in line and "a worker" in line
    assert not out.exists()
