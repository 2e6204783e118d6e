"""The table benchmarks/gpu_memory.sh ends with: each step row's measured peak memory beside the
model's figure, and each plan run's validation (plan.md's own section).

    python benchmarks/gpu_memory_table.py RUNS_DIR
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

GIB = 2**30


def num(cell: str | None) -> float | None:
    return float(cell) if cell not in (None, "") else None


def main(runs: Path) -> int:
    steps = sorted(runs.glob("*/step.csv"))
    # csv, not pandas: the GPU machine has torch and little else
    rows = [r for p in steps for r in csv.DictReader(p.open())]
    if rows:
        print("| layout | recompute | m | dtype | model GiB | measured peak GiB | model error "
              "| step ms | note |")
        print("|---|---|---:|---|---:|---:|---:|---:|---|")
        for r in rows:
            peak, model = num(r.get("peak_mem_bytes")), float(r["model_mem_bytes"])
            err = f"{(model - peak) / peak:+.1%}" if peak else "-"
            peak_gib = f"{peak / GIB:.2f}" if peak is not None else "-"
            step = num(r.get("step_us"))
            step_ms = f"{step / 1e3:.1f}" if step is not None else "-"
            note = r.get("note") or ""
            print(f"| tp{r['tp']} pp{r['pp']} dp{r['dp']} zero{r['zero']} | {r['recompute']} "
                  f"| {r['micro_batches']} | {r['dtype']} | {model / GIB:.2f} | {peak_gib} "
                  f"| {err} | {step_ms} | {note[:60]} |")
    for md in sorted(runs.glob("*/plan.md")):
        text = md.read_text()
        start = text.find("## Validation")
        print(f"\n### {md.parent.name}\n")
        print(text[start:] if start >= 0 else text[-3000:])
    if not steps and not list(runs.glob("*/plan.md")):
        print(f"no step or plan runs under {runs}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
