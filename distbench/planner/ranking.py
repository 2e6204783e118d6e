"""A plan: every layout of a model on a number of GPUs, its step time predicted from measured
inputs (planner.predict), its memory per rank judged (planner.memory), ranked; and what
plan.md's text of it (planner.assemble writes the files). Pure and torch-free: with `--from`
a plan of thousands of GPUs is arithmetic done in seconds.

Also what `plan --validate K` needs around its real runs: which layouts to run
(`pick_validation`) and how far the predictions were (`validation_summary`)."""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence

from distbench.core.layout_label import row_cell
from distbench.core.tables import Column, markdown_table, plural
from distbench.core.validation_table import validation_table
from distbench.planner import memory as mem
from distbench.planner import trainers
from distbench.planner.inputs import Inputs
from distbench.planner.layouts import RECOMPUTE, ZERO_STAGES, Layout, enumerate_layouts
from distbench.planner.models import ModelSpec
from distbench.planner.predict import predict

PLAN_MD = "plan.md"
PLAN_PNG = "plan.png"
# the step's parts, as plan.csv names them, and as plan.md says them
TERMS = {"compute_ms": "compute", "tp_exposed_ms": "exposed TP communication",
         "pp_comm_ms": "pipeline hops",
         "bubble_ms": "pipeline bubble", "dp_exposed_ms": "exposed data-parallel communication",
         "optimizer_ms": "optimizer step"}
TRAINER_TEXT = {"torch": "the trainer: torch (its pipelining, DDP and FSDP2, as `distbench "
                         "step` runs them)",
                "megatron": "the trainer: Megatron-LM (its schedule, buffers and distributed "
                            "optimizer)"}
MEMORY_PARTS = ("params", "grads", "optimizer", "buffers", "activations")


def layouts_for(model: ModelSpec, gpus: int, gpus_per_node: int,
                zero_stages: Sequence[int] = ZERO_STAGES,
                recompute: Sequence[str] = ("none",)) -> list[Layout]:
    return list(enumerate_layouts(model, gpus, gpus_per_node, tuple(zero_stages),
                                  tuple(recompute)))


def compute_shapes(model: ModelSpec, layouts: Iterable[Layout]) -> set[tuple[int, int]]:
    """The (tp, tokens per micro-batch) each layout times a layer at."""
    return {(lay.tp, lay.micro_batch_size(model) * model.seq_len) for lay in layouts}


def make_plan(model: ModelSpec, inputs: Inputs, gpus: int, gpus_per_node: int,
              memory_per_gpu: float, dtype: str, zero_stages: Sequence[int] = ZERO_STAGES,
              layouts: Sequence[Layout] | None = None, given: Sequence[Layout] = (),
              trainer: str = "torch") -> list[dict]:
    """One row per layout (plan.csv's columns), fastest first among those that fit (rank 1),
    then those that do not (no rank). `given`: the layouts the user named (plan --layout),
    marked `given`; one the enumeration lacks is a row too, `enumerated` 0, placed by its step
    but never ranked, so that naming a layout moves no other's rank. `trainer`: whose step
    is priced and held in memory (planner.trainers). Raises LookupError when
    the inputs lack a measurement a layout needs (an op never measured, no compute)."""
    from distbench.core.dtypes import element_bytes

    elt = element_bytes(dtype)
    chosen = layouts_for(model, gpus, gpus_per_node, zero_stages) if layouts is None else layouts
    known = set(chosen)
    rows = [_row(model, lay, inputs, elt, dtype, gpus_per_node, memory_per_gpu, trainer)
            | {"given": int(lay in given), "enumerated": int(lay in known)}
            for lay in [*chosen, *(g for g in dict.fromkeys(given) if g not in known)]]
    rows.sort(key=lambda r: (not r["fits"], r["predicted_step_ms"], r["memory_per_rank_bytes"],
                             r["tp"], r["pp"], r["zero"], r["micro_batches"],
                             RECOMPUTE.index(r["recompute"])))
    for i, r in enumerate(x for x in rows if x["fits"] and x["enumerated"]):
        r["rank"] = i + 1
    return rows


def ranked(rows: Iterable[dict]) -> list[dict]:
    """The rows of the enumeration that fit, best first: the ranked list."""
    return [r for r in rows if r["rank"] is not None]


def enumerated(rows: Iterable[dict]) -> list[dict]:
    return [r for r in rows if r.get("enumerated", 1)]


def _row(model: ModelSpec, lay: Layout, inputs: Inputs, elt: int, dtype: str,
         gpus_per_node: int, memory_per_gpu: float, trainer: str = "torch") -> dict:
    try:
        p = predict(model, lay, inputs, elt, gpus_per_node, trainer)
    except LookupError as e:
        raise LookupError(f"{e} (needed by {lay.label()})") from None
    m = trainers.memory_of(model, lay, elt, trainer)
    ms = 1e-3
    step_ms = p.step_us * ms
    return {
        "model": model.name, "tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "zero": lay.zero,
        "micro_batches": lay.micro_batches, "micro_batch_size": lay.micro_batch_size(model),
        "dtype": dtype, "world_size": lay.world, "gpus_per_node": gpus_per_node,
        "predicted_step_ms": step_ms, "compute_ms": p.compute_us * ms,
        "tp_comm_ms": p.tp_comm_us * ms, "pp_comm_ms": p.pp_comm_us * ms,
        "bubble_ms": p.bubble_us * ms, "dp_comm_ms": p.dp_comm_us * ms,
        "dp_exposed_ms": p.dp_exposed_us * ms, "optimizer_ms": p.optimizer_us * ms,
        "bubble_fraction": (lay.pp - 1) / (lay.virtual_stages * lay.micro_batches + lay.pp - 1),
        "tokens_per_s": model.batch * model.seq_len / (step_ms / 1e3) if step_ms > 0 else None,
        "memory_per_rank_bytes": m.total,
        **{f"{k}_bytes": v for k, v in m.parts().items()},
        "memory_limit_bytes": mem.usable_bytes(memory_per_gpu),
        "fits": mem.fits(m.total, memory_per_gpu), "rank": None,
        "recompute": lay.recompute, "virtual_stages": lay.virtual_stages,
        **layout_columns(lay), "tp_exposed_ms": p.tp_exposed_us * ms, "trainer": trainer,
    }


def layout_columns(lay: Layout) -> dict:
    """The CSV columns of a layout's keys beyond tp, pp, dp, zero, m, v and recompute."""
    return {"sp": int(lay.sp), "recompute_layers": lay.recompute_layers,
            "grad_sync": lay.grad_sync, "tp_overlap": int(lay.tp_overlap),
            "dp_overlap": int(lay.dp_overlap)}


def layout_of(row: dict) -> Layout:
    """The layout a CSV row (plan.csv, step.csv, validation.csv) names; a column an older run
    lacks reads as its default."""
    return Layout(tp=int(row["tp"]), pp=int(row["pp"]), dp=int(row["dp"]), zero=int(row["zero"]),
                  micro_batches=int(row["micro_batches"]),
                  recompute=row_cell(row, "recompute", "none"),
                  virtual_stages=int(row_cell(row, "virtual_stages", 1)),
                  sp=bool(int(row_cell(row, "sp", 1))),
                  recompute_layers=int(row_cell(row, "recompute_layers", 0)),
                  grad_sync=str(row_cell(row, "grad_sync", "")),
                  tp_overlap=bool(int(row_cell(row, "tp_overlap", 0))),
                  dp_overlap=bool(int(row_cell(row, "dp_overlap", 1))))


def label(row: dict) -> str:
    return layout_of(row).label()


# ---------------------------------------------------------------------------------------------
# Validation: which layouts to run for real, and how far the predictions were

def pick_validation(rows: Sequence[dict], k: int, world: int,
                    in_sample: Collection[str] = ()) -> list[dict]:
    """K layouts on `world` ranks that fit, to run for real: the layouts the user named
    (`given`) first, in the plan's order, whatever their sample; then the ranked list's, out
    of sample first (`in_sample`: the labels an input was measured on, whose validation would
    check the measurement against itself): the predicted best half (at least one), then, one
    at a time, the layout that differs from those chosen in the most of tp, pp, dp and zero
    (the better ranked first among equals), so the real runs span the space. In-sample layouts
    come last, the better ranked first, only once no other is left. At most as many as fit;
    deterministic."""
    named = [r for r in rows if r.get("given") and r["fits"] and r["world_size"] == world]
    named = named[:max(0, k)]
    pool = sorted((r for r in rows if r["rank"] is not None and r["world_size"] == world
                   and r not in named),
                  key=lambda r: (r["rank"], r["tp"], r["pp"], r["zero"], r["micro_batches"]))
    return named + _spread(pool, k - len(named), in_sample)


def _spread(pool: list[dict], k: int, in_sample: Collection[str]) -> list[dict]:
    """pick_validation's choice among the ranked `pool`."""
    if k <= 0 or not pool:
        return []
    outside = [r for r in pool if label(r) not in in_sample]
    chosen = outside[:max(1, (k + 1) // 2)][:k]
    dims = ("tp", "pp", "dp", "zero")
    while len(chosen) < min(k, len(outside)):
        seen = {d: {r[d] for r in chosen} for d in dims}
        left = [r for r in outside if r not in chosen]
        chosen.append(max(left, key=lambda r: (sum(r[d] not in seen[d] for d in dims),
                                               -outside.index(r))))
    return chosen + [r for r in pool if label(r) in in_sample][:k - len(chosen)]


def validation_notes(asked: int, chosen: Sequence[dict], in_sample: Collection[str], *,
                     world: int, fitting: int) -> list[str]:
    """What a validation did not run as asked: fewer layouts than --validate K (all that fit
    on the workers), and the layouts in sample it had to take."""
    notes = []
    if len(chosen) < asked:
        notes.append(f"--validate {asked}: only {plural(fitting, 'layout')} of the plan for the "
                     f"{world} workers fit here; {len(chosen)} validated")
    inside = [label(r) for r in chosen if label(r) in in_sample]
    if inside:
        notes.append(f"{plural(len(inside), 'layout')} in sample, as too few others fit (an "
                     f"input was measured on each: its error is the machine's noise, not the "
                     f"model's): {', '.join(inside)}")
    return notes

def _average_ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties given the average of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for m in range(i, j + 1):
            ranks[order[m]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def validation_summary(pairs: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(MAPE in percent, Spearman's rank correlation) of (predicted, measured) pairs: the mean
    of |predicted - measured| / measured, and the Pearson correlation of the two's ranks
    (ties as average ranks). NaN where it is undefined (no pair; fewer than two, or a side
    all equal, for Spearman)."""
    pairs = [(float(p), float(m)) for p, m in pairs if m and m > 0]
    if not pairs:
        return math.nan, math.nan
    mape = sum(abs(p - m) / m for p, m in pairs) / len(pairs) * 100
    if len(pairs) < 2:
        return mape, math.nan
    a, b = (_average_ranks([x[i] for x in pairs]) for i in (0, 1))
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b, strict=True))
    va = sum((x - ma) ** 2 for x in a)
    vb = sum((y - mb) ** 2 for y in b)
    return mape, (cov / math.sqrt(va * vb) if va and vb else math.nan)


# a rank correlation over fewer layouts takes so few values that even a perfect one comes by
# chance (over 2 it is +1 or -1, over 3 it is 1 one time in 6; over 4 one time in 24)
MIN_RANKED = 4


def validation_lines(pairs: Sequence[tuple[float, float]],
                     unseen: Sequence[tuple[float, float]]) -> list[str]:
    """The prediction error of a validation, (predicted, measured) pairs of every layout that
    ran and of those out of sample: MAPE over those out of sample (over all too when some were
    in sample), and Spearman's rank correlation over all of them from MIN_RANKED layouts up
    (below, why not)."""
    if not pairs:
        return ["no layout ran: no prediction error"]
    mape, rho = validation_summary(pairs)
    lines = []
    if unseen:
        lines.append(f"prediction error over {plural(len(unseen), 'layout')} out of sample: "
                     f"MAPE {validation_summary(unseen)[0]:.1f}%")
    if len(unseen) < len(pairs):
        lines.append(f"over all {plural(len(pairs), 'layout')}, "
                     f"{len(pairs) - len(unseen)} in sample: MAPE {mape:.1f}%")
    if len(pairs) < MIN_RANKED:
        lines.append(f"no rank correlation: over fewer than {MIN_RANKED} layouts it takes so "
                     f"few values that even a perfect one comes by chance (over "
                     f"{len(pairs)}: validate more)")
    elif math.isnan(rho):
        lines.append("no rank correlation: the predictions or the measurements are all equal")
    else:
        lines.append(f"Spearman {rho:.2f} over {plural(len(pairs), 'layout')}")
    return lines


def validation_md(found: dict, notes: Sequence[str], lines: Sequence[str]) -> str:
    """plan.md's section on a validation: each layout run against its prediction, what was
    capped or in sample, and the error."""
    out = ["", "## Validation", ""]
    if found.get("layouts"):
        out += validation_table(found["layouts"])
        out.append("")
    out += [f"- {n}" for n in [*notes, *lines]]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# Writing

def top_lines(rows: Sequence[dict], top: int, columns: Sequence[Column],
              title: str | None = None) -> list[str]:
    """The console's table of the `top` fastest layouts that fit, in plan.csv's console
    `columns`."""
    from distbench.core.tables import format_table

    fitting = ranked(rows)[:top]
    return format_table(columns, fitting, title=title or (
        f"plan: the {len(fitting)} fastest of {len(enumerated(rows))} layouts that fit in "
        "memory"))



def _gib(b: float) -> str:
    return f"{b / 2**30:.1f} GiB"


def dominant(row: dict) -> tuple[str, float]:
    """The step's largest part and its share of the step."""
    key = max(TERMS, key=lambda k: row[k] or 0.0)
    step = row["predicted_step_ms"]
    return TERMS[key], (row[key] / step if step else 0.0)


def _why_top(best: dict, runner: dict | None) -> list[str]:
    term, share = dominant(best)
    lines = [f"- **{label(best)}** is predicted fastest at {best['predicted_step_ms']:.2f} ms per "
             f"step; its largest part is {term} ({share:.0%} of the step)."]
    if runner is not None:
        loss = runner["predicted_step_ms"] - best["predicted_step_ms"]
        worse = max(TERMS, key=lambda k: (runner[k] or 0.0) - (best[k] or 0.0))
        lines.append(f"- The runner-up, **{label(runner)}**, loses {loss:.2f} ms "
                     f"({loss / best['predicted_step_ms']:.1%}), most of it in {TERMS[worse]} "
                     f"(+{(runner[worse] or 0.0) - (best[worse] or 0.0):.2f} ms).")
    return lines


def _hidden(row: dict) -> list[str]:
    """What of the best layout's TP and DP communication hides behind compute, and what is
    left exposed (the step counts the exposed part)."""
    out = []
    for name, alone, exposed in (("TP", "tp_comm_ms", "tp_exposed_ms"),
                                 ("data-parallel", "dp_comm_ms", "dp_exposed_ms")):
        total, shown = row.get(alone) or 0.0, row.get(exposed)
        if total > 0 and shown is not None:
            hidden = max(0.0, total - shown)
            out.append(f"- Its {name} collectives take {total:.2f} ms alone: {hidden:.2f} ms "
                       f"hidden behind compute, {shown:.2f} ms exposed.")
    return out


def _pruned(rows: list[dict]) -> list[str]:
    rows = enumerated(rows)
    out = [r for r in rows if not r["fits"]]
    if not rows:
        return ["No layout to prune."]
    if not out:
        return ["Every layout fits in memory."]
    by_zero: dict[int, int] = {}
    for r in out:
        by_zero[r["zero"]] = by_zero.get(r["zero"], 0) + 1
    least = min(out, key=lambda r: r["memory_per_rank_bytes"])
    parts = ", ".join(f"{n} with ZeRO {z}" for z, n in sorted(by_zero.items()))
    part = max(MEMORY_PARTS, key=lambda k: least[f"{k}_bytes"])
    return [f"{plural(len(out), 'layout')} pruned for memory ({parts}). The smallest of them, "
            f"{label(least)}, needs {_gib(least['memory_per_rank_bytes'])} per rank against "
            f"{_gib(least['memory_limit_bytes'])} usable, most of it {part}."]


def summary_md(rows: list[dict], model: ModelSpec, inputs: Inputs, *, gpus: int,
               gpus_per_node: int, memory_per_gpu: float, memory_from: str, dtype: str,
               top: int = 5, per_node_from: str = "", recompute: Sequence[str] = (),
               named: Sequence[str] = (), trainer: str = "torch") -> str:
    """plan.md. `named`: a line on each layout the user named (planner.given.lines)."""
    fitting = ranked(rows)
    listed = enumerated(rows)
    lines = [f"# Plan: {model.name} on {gpus} GPUs", "",
             f"- model: {model.describe()}",
             f"- cluster: {gpus} GPUs, {gpus_per_node} per node"
             + (f" ({per_node_from})" if per_node_from else "") + ", "
             f"{_gib(memory_per_gpu)} per GPU" + (f" ({memory_from})" if memory_from else ""),
             f"- dtype: {dtype}; AdamW; the 1F1B schedule; "
             f"{TRAINER_TEXT[trainer]}",
             f"- memory model: parameters, gradients and AdamW states by ZeRO stage, ZeRO-3's "
             f"gathered layer, activations kept for backward (docs/plan.md); reserve: "
             f"{mem.reserve_text()}",
             f"- {plural(len(listed), 'layout')} on {gpus} GPUs, {len(fitting)} fit"
             + (f"; recomputation weighed: {', '.join(recompute)}" if recompute else ""), ""]
    if named:
        lines += ["## Your layouts", "", *[f"- {n}" for n in named], ""]
    lines += ["## Top layouts", ""]
    if fitting:
        lines += markdown_table(
            ["rank", "layout", "step (ms)", *[TERMS[k] + " (ms)" for k in TERMS],
             "memory/rank"],
            [[r["rank"], label(r), f"{r['predicted_step_ms']:.2f}",
              *[f"{r[k]:.2f}" for k in TERMS], _gib(r["memory_per_rank_bytes"])]
             for r in fitting[:top]], align="rl" + "r" * (len(TERMS) + 2))
        lines += ["", "## Why", "", *_why_top(fitting[0], fitting[1] if len(fitting) > 1 else
                                              None), *_hidden(fitting[0])]
    elif listed:
        lines += ["No layout fits in memory."]
    else:
        lines += ["No layout uses exactly these GPUs."]
    lines += ["", "## Pruned", "", *_pruned(rows), "", "## Inputs", ""]
    lines += [f"- {s}" for s in inputs.sources] or ["- none recorded"]
    if inputs.notes:
        lines += ["", "Scalings and assumptions:", "", *[f"- {n}" for n in inputs.notes]]
    return "\n".join(lines) + "\n"
