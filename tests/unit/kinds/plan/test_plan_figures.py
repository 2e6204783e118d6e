"""A plan's figures say what a reader needs (issue 31): a CPU toy plan's points on their own
scale, not squashed at 0 GiB beside a usable-memory line 72 GiB away; steps within 1.5% of each
other read in full, not over a shared "1e6" offset; a validation's predictions against what was
measured, on the diagonal with the +-15% band."""

from __future__ import annotations

import pytest

from distbench.results import plots


@pytest.fixture
def drawn(monkeypatch):
    """The figure each call would save, kept open for the test to read."""
    figures = []

    def keep(fig, path):
        fig.canvas.draw()
        figures.append(fig)
        return path

    monkeypatch.setattr(plots, "save", keep)
    yield figures
    for fig in figures:
        plots.plt.close(fig)


def _row(memory: float, step_ms: float, rank: int, fits: bool = True) -> dict:
    return {"memory_per_rank_bytes": memory, "predicted_step_ms": step_ms, "fits": fits,
            "rank": rank, "memory_limit_bytes": 72 * 2**30}


def test_a_cpu_toys_points_are_drawn_on_their_own_scale(drawn, tmp_path):
    rows = [_row(m * 2**20, 40.0 + m, i + 1) for i, m in enumerate((3.0, 5.0, 9.0))]
    plots.plan_figure(rows, tmp_path / "p.png", "toy on 4 CPU ranks", best="tp1 pp1 dp4")
    (ax,) = drawn[0].axes
    assert ax.get_xlabel() == "memory per rank (MiB)"
    low, high = ax.get_xlim()
    assert high < 20  # MiB: the points fill the axis; the 72 GiB line is not on it
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "usable memory (72.0 GiB), off the axis" in legend
    assert "best: tp1 pp1 dp4" in legend


def test_steps_close_together_are_read_in_full_not_over_an_offset(drawn, tmp_path):
    # a 1024-GPU 7b plan: steps of about 1.79e9 ms within 1.5% of each other
    rows = [_row(40 * 2**30, 1_794_386_333.0 * (1 + k / 100), k + 1) for k in range(3)]
    plots.plan_figure(rows, tmp_path / "p.png", "7b on 1024 GPUs")
    (ax,) = drawn[0].axes
    assert ax.get_ylabel() == "predicted step (h)"  # 498 h, not 1.79e9 ms
    assert ax.yaxis.get_major_formatter().get_offset() == ""
    assert ax.get_xlabel() == "memory per rank (GiB)"
    # the limit (72 GiB) is on the scale of 40 GiB points: drawn
    assert any(line.get_xdata()[0] == pytest.approx(72.0) for line in ax.get_lines())


def test_a_validation_is_drawn_against_the_diagonal_and_its_band(drawn, tmp_path):
    rows = [{"predicted_step_ms": 110.0, "measured_step_ms": 100.0, "in_sample": 0},
            {"predicted_step_ms": 200.0, "measured_step_ms": 250.0, "in_sample": 0},
            {"predicted_step_ms": 300.0, "measured_step_ms": 290.0, "in_sample": 1},
            {"predicted_step_ms": 90.0, "measured_step_ms": None, "in_sample": 0}]
    plots.validation_figure(rows, tmp_path / "v.png", "validated")
    (ax,) = drawn[0].axes
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["predicted = measured", "within 15%", "out of sample (2)",
                      "in sample (1)"]
    diagonal = ax.get_lines()[0]
    assert list(diagonal.get_xdata()) == list(diagonal.get_ydata())
    band = ax.collections[0].get_paths()[0].vertices
    # the band's edges at the diagonal's ends: 0.85 and 1.15 of it
    low, high = diagonal.get_xdata()
    assert band[:, 1].min() == pytest.approx(0.85 * low)
    assert band[:, 1].max() == pytest.approx(1.15 * high)


def test_the_layouts_named_with_layout_are_marked_where_they_fall(drawn, tmp_path):
    rows = [_row(m * 2**30, 40.0 + m, i + 1) for i, m in enumerate((3.0, 5.0, 9.0))]
    rows[1]["given"] = 1
    rows.append({**_row(90 * 2**30, 41.0, None, fits=False), "given": 1})
    plots.plan_figure(rows, tmp_path / "p.png", "7b", best="tp1 pp1 dp4")
    (ax,) = drawn[0].axes
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "named with --layout (2)" in legend
    (marks,) = [c for c in ax.collections if c.get_label() == "named with --layout (2)"]
    assert sorted(map(tuple, marks.get_offsets().tolist())) == [(5.0, 45.0), (90.0, 41.0)]
