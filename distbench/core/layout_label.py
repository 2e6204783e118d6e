"""A layout's name as every table, plot and message writes it ("tp2 pp1 dp2 zero3 m1 rc-full"):
in core, so report can name a CSV row's layout without the planner. The keys a layout leaves
at their defaults are not written, so a label names what was chosen."""

from __future__ import annotations

from collections.abc import Mapping


def layout_label(tp: int, pp: int, dp: int, zero: int, micro_batches: int,
                 virtual_stages: int = 1, recompute: str = "none", *, sp: bool = True,
                 recompute_layers: int = 0, grad_sync: str = "", tp_overlap: bool = False,
                 dp_overlap: bool = True) -> str:
    text = f"tp{tp} pp{pp} dp{dp} zero{zero} m{micro_batches}"
    if virtual_stages > 1:
        text += f" v{virtual_stages}"
    if recompute != "none":
        text += f" rc-{recompute}" + (f":{recompute_layers}" if recompute_layers else "")
    if not sp:
        text += " sp0"
    if grad_sync:
        text += f" sync-{grad_sync}"
    if tp_overlap:
        text += " tpo"
    if not dp_overlap:
        text += " dpo0"
    return text


# the CSV columns of the keys beyond recompute, with the value a run that predates one implies
EXTRA_COLUMNS = {"sp": 1, "recompute_layers": 0, "grad_sync": "", "tp_overlap": 0,
                 "dp_overlap": 1}


def row_label(row: Mapping) -> str:
    """The label of a CSV row (step.csv, plan.csv, validation.csv); a column an older run
    lacks (virtual_stages, recompute and the rest) reads as its default. A row's grad_sync is
    written only where it is not the wrapper's default (the label's own rule)."""
    def cell(key: str, default):
        value = row.get(key)
        return default if value is None or value != value or value == "" else value

    tp, dp, zero, m = (int(row[k]) for k in ("tp", "dp", "zero", "micro_batches"))
    sync = str(cell("grad_sync", ""))
    if sync == ("micro" if zero >= 2 else "last") or dp == 1 or m == 1:
        sync = ""
    return layout_label(tp, int(row["pp"]), dp, zero, m, int(cell("virtual_stages", 1)),
                        str(cell("recompute", "none")),
                        sp=bool(int(cell("sp", 1))) or tp == 1,
                        recompute_layers=int(cell("recompute_layers", 0)), grad_sync=sync,
                        tp_overlap=bool(int(cell("tp_overlap", 0))) and tp > 1,
                        dp_overlap=bool(int(cell("dp_overlap", 1))) or dp == 1)
