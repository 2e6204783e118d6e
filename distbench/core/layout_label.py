"""A layout's name as every table, plot and message writes it ("tp2 pp1 dp2 zero3 m1 rc-full"):
in core, so report can name a CSV row's layout without the planner."""

from __future__ import annotations

from collections.abc import Mapping


def layout_label(tp: int, pp: int, dp: int, zero: int, micro_batches: int,
                 virtual_stages: int = 1, recompute: str = "none") -> str:
    text = f"tp{tp} pp{pp} dp{dp} zero{zero} m{micro_batches}"
    if virtual_stages > 1:
        text += f" v{virtual_stages}"
    return text if recompute == "none" else f"{text} rc-{recompute}"


def row_label(row: Mapping) -> str:
    """The label of a CSV row (step.csv, plan.csv, validation.csv); a column an older run
    lacks (virtual_stages, recompute) reads as its default."""
    def cell(key: str, default):
        value = row.get(key)
        return default if value is None or value != value or value == "" else value

    return layout_label(int(row["tp"]), int(row["pp"]), int(row["dp"]), int(row["zero"]),
                        int(row["micro_batches"]), int(cell("virtual_stages", 1)),
                        str(cell("recompute", "none")))
