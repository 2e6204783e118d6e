"""A layout's name as every table, plot and message writes it ("tp2 pp1 dp2 zero3 m1 rc-full"):
in core, so report can name a CSV row's layout without the planner. The keys a layout leaves
at their defaults are not written, so a label names what was chosen."""

from __future__ import annotations

from collections.abc import Mapping


def default_grad_sync(zero: int) -> str:
    """When a layout's replicas sync their gradients unless it says otherwise: FSDP2 (ZeRO 2
    and 3) after every micro-batch, DDP (ZeRO 0 and 1) at the last (no_sync)."""
    return "micro" if zero >= 2 else "last"


def shown_extras(tp: int, dp: int, zero: int, micro_batches: int, recompute: str = "none", *,
                 sp: bool = True, recompute_layers: int = 0, grad_sync: str = "",
                 tp_overlap: bool = False, dp_overlap: bool = True) -> dict:
    """The keys beyond tp, pp, dp, zero, m, v and recompute that a label writes: those off
    their defaults where they mean something (sequence parallelism and TP overlap at tp > 1,
    the sync with replicas and micro-batches, the DP overlap with replicas, the recomputed
    layers under full recomputation)."""
    out: dict = {}
    if tp > 1 and not sp:
        out["sp"] = False
    if recompute == "full" and recompute_layers:
        out["recompute_layers"] = recompute_layers
    if dp > 1 and micro_batches > 1 and grad_sync and grad_sync != default_grad_sync(zero):
        out["grad_sync"] = grad_sync
    if tp > 1 and tp_overlap:
        out["tp_overlap"] = True
    if dp > 1 and not dp_overlap:
        out["dp_overlap"] = False
    return out


def layout_label(tp: int, pp: int, dp: int, zero: int, micro_batches: int,
                 virtual_stages: int = 1, recompute: str = "none", **extras) -> str:
    """The label; `extras`, the keys of shown_extras, are written only where it shows them."""
    shown = shown_extras(tp, dp, zero, micro_batches, recompute, **extras)
    text = f"tp{tp} pp{pp} dp{dp} zero{zero} m{micro_batches}"
    if virtual_stages > 1:
        text += f" v{virtual_stages}"
    if recompute != "none":
        text += f" rc-{recompute}" + (f":{shown['recompute_layers']}"
                                      if "recompute_layers" in shown else "")
    if "sp" in shown:
        text += " sp0"
    if "grad_sync" in shown:
        text += f" sync-{shown['grad_sync']}"
    if "tp_overlap" in shown:
        text += " tpo"
    if "dp_overlap" in shown:
        text += " dpo0"
    return text


# the CSV columns of the keys beyond recompute, with the value a run that predates one implies
EXTRA_COLUMNS = {"sp": 1, "recompute_layers": 0, "grad_sync": "", "tp_overlap": 0,
                 "dp_overlap": 1}


def row_cell(row: Mapping, key: str, default):
    """A CSV row's value of `key`, or `default` where the row lacks it (an older run's file) or
    it is empty or NaN (pandas' empty cell)."""
    value = row.get(key)
    return default if value is None or value != value or value == "" else value


def row_label(row: Mapping) -> str:
    """The label of a CSV row (step.csv, plan.csv, validation.csv); a column an older run
    lacks (virtual_stages, recompute and the rest) reads as its default."""
    return layout_label(int(row["tp"]), int(row["pp"]), int(row["dp"]), int(row["zero"]),
                        int(row["micro_batches"]), int(row_cell(row, "virtual_stages", 1)),
                        str(row_cell(row, "recompute", "none")),
                        sp=bool(int(row_cell(row, "sp", 1))),
                        recompute_layers=int(row_cell(row, "recompute_layers", 0)),
                        grad_sync=str(row_cell(row, "grad_sync", "")),
                        tp_overlap=bool(int(row_cell(row, "tp_overlap", 0))),
                        dp_overlap=bool(int(row_cell(row, "dp_overlap", 1))))
