"""A plan validation's table, each layout run against its prediction: the one builder behind
plan.md's section and report's, so the two never read differently. Pure: plan passes its
records, report validation.csv's rows."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from distbench.core.layout_label import row_label
from distbench.core.tables import markdown_table, missing

HEADER = ["layout", "predicted (ms)", "measured (ms)", "error", "in sample", "status"]


def validation_table(records: Iterable[Mapping]) -> list[str]:
    """Markdown lines; each record has a layout's columns (tp, pp, dp, zero, micro_batches and
    optionally virtual_stages, recompute), predicted_step_ms, measured_step_ms, error_pct,
    in_sample and status, as validation.csv holds them. The whole layout label: two layouts
    that differ only in recomputation must not read alike."""
    def ms(v) -> str:
        return "-" if missing(v) else f"{float(v):.2f}"

    rows = [[row_label(r), ms(r["predicted_step_ms"]), ms(r.get("measured_step_ms")),
             "-" if missing(r.get("error_pct")) else f"{float(r['error_pct']):+.1f}%",
             "no" if missing(r.get("in_sample")) or not int(r["in_sample"]) else "yes",
             str(r.get("status"))]
            for r in records]
    return markdown_table(HEADER, rows, align="lrrrll")
