"""Layouts the user names (`plan --layout`), beside the enumeration: "what does the layout we
run today cost, and what would beat it?". Written as Megatron-LM and DeepSpeed users write
them: tp, pp, dp, the ZeRO stage, the micro-batch size (Megatron's --micro-batch-size,
DeepSpeed's train_micro_batch_size_per_gpu) or the micro-batch count (gradient accumulation
steps), recomputation, the virtual stages of an interleaved pipeline (v: Megatron's
--virtual-pipeline-model-parallel-size); the global batch is the model's (`--model
...,batch=`). A named layout is checked like any input (OptionError naming the key), predicted
even where it does not fit memory, and placed against the ranked list. Torch-free."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from distbench.core.options import OptionError
from distbench.planner import trainers
from distbench.planner.layouts import (
    GRAD_SYNC,
    RECOMPUTE,
    ZERO_STAGES,
    Layout,
    default_micro_batches,
    micro_batch_counts,
    problems,
)
from distbench.planner.models import ModelSpec

OPTION = "--layout"
EXAMPLE = "--layout tp=8,pp=2,dp=4,zero=1,mbs=2,recompute=full"
# the keys, in the order a layout is written back; mbs: samples per micro-batch, m: their count
KEYS = ("tp", "pp", "dp", "zero", "mbs", "m", "recompute", "v", "sp", "recompute_layers",
        "grad_sync", "tp_overlap", "dp_overlap")
WHOLE = ("tp", "pp", "dp", "zero", "mbs", "m", "v", "recompute_layers")
# the keys that are on or off, written 1 or 0
SWITCHES = ("sp", "tp_overlap", "dp_overlap")
# the keys that name a choice, and their choices
WORDS = {"recompute": RECOMPUTE, "grad_sync": GRAD_SYNC}


@dataclass(frozen=True)
class Given:
    """One --layout as written, its keys checked but not yet held against a model and a
    cluster (resolve)."""

    text: str
    values: dict

    def get(self, key: str, default=None):
        return self.values.get(key, default)


def _one(option: str, text: str) -> Given:
    values: dict = {}
    for item in text.split(","):
        item = item.strip()
        key, eq, value = item.partition("=")
        key, value = key.strip().lower(), value.strip()
        if not item or not eq or not value:
            raise OptionError(option, f"{item or 'an empty item'!r} in {text!r} is not "
                              "key=value", EXAMPLE)
        if key not in KEYS:
            raise OptionError(option, f"unknown key {key!r} in {text!r} (keys: "
                              f"{', '.join(KEYS)}; the global batch is --model's batch=)",
                              EXAMPLE)
        if key in values:
            raise OptionError(option, f"{key} is given twice in {text!r} (separate layouts "
                              "with ';' or give --layout again)", EXAMPLE)
        if key in WORDS:
            if value.lower() not in WORDS[key]:
                raise OptionError(option, f"{key}={value} in {text!r} is not one of "
                                  f"{', '.join(WORDS[key])}", EXAMPLE)
            values[key] = value.lower()
            continue
        if key in SWITCHES:
            if value not in ("0", "1"):
                raise OptionError(option, f"{key}={value} in {text!r} must be 1 (on) or 0 "
                                  "(off)", EXAMPLE)
            values[key] = int(value)
            continue
        try:
            number = int(value) if value.isascii() else None  # not int("８")
        except ValueError:
            number = None
        if number is None or number < (0 if key in ("zero", "recompute_layers") else 1):
            low = "0 or more" if key in ("zero", "recompute_layers") else "at least 1"
            raise OptionError(option, f"{key}={value} in {text!r} must be a whole number, "
                              f"{low}", EXAMPLE)
        if key == "zero" and number not in ZERO_STAGES:
            raise OptionError(option, f"zero={number} in {text!r} is not a ZeRO stage "
                              f"({', '.join(map(str, ZERO_STAGES))})", EXAMPLE)
        values[key] = number
    canonical = ",".join(f"{k}={values[k]}" for k in KEYS if k in values)
    return Given(canonical, values)


def parse(option: str, raw) -> list[Given]:
    """--layout as typed: one text or several (the option repeated), each holding layouts
    separated by ';'. Raises OptionError."""
    texts = [raw] if isinstance(raw, str) else list(raw or [])
    specs = [s.strip() for t in texts for s in str(t).split(";")]
    if any(not s for s in specs) or not specs:
        raise OptionError(option, "an empty layout (two ';' in a row, or a trailing one?)",
                          EXAMPLE)
    return [_one(option, s) for s in specs]


def canonical(option: str, raw) -> str | None:
    """The option's stored form: its layouts, keys checked, written back in KEYS' order and
    joined by ';' (what the workers are handed); None when none was given."""
    if raw is None or (not isinstance(raw, str) and not list(raw)):
        return None
    return ";".join(g.text for g in parse(option, raw))


def resolve(given: Given, model: ModelSpec, gpus: int, per_node: int,
            option: str = OPTION, trainer: str = trainers.TORCH) -> Layout:
    """The layout `given` names on `gpus` GPUs of `per_node` a node: dp from the GPUs where it
    is left out, the micro-batch count from the global batch / (dp x mbs) where mbs is given,
    step's default count where neither is. Raises OptionError naming what is wrong."""
    where = f"in {given.text!r}"
    tp, pp = given.get("tp", 1), given.get("pp", 1)
    if per_node % tp:
        raise OptionError(option, f"tp={tp} {where} must divide the {per_node} GPUs per node "
                          "(a TP group stays inside one node)", EXAMPLE)
    if "dp" in given.values:
        dp = given.get("dp")
        if tp * pp * dp != gpus:
            raise OptionError(option, f"tp x pp x dp = {tp} x {pp} x {dp} = {tp * pp * dp} "
                              f"{where}, but the plan is for {gpus} GPUs (--gpus)", EXAMPLE)
    else:
        if gpus % (tp * pp):
            raise OptionError(option, f"tp x pp = {tp * pp} {where} does not divide the "
                              f"{gpus} GPUs (--gpus), so no dp fills them", EXAMPLE)
        dp = gpus // (tp * pp)
    mbs, m = given.get("mbs"), given.get("m")
    if mbs is not None:
        if model.batch % (dp * mbs):
            raise OptionError(option, f"dp x mbs = {dp} x {mbs} {where} does not divide the "
                              f"global batch of {model.batch} samples (--model's batch=)",
                              EXAMPLE)
        if m is not None and dp * mbs * m != model.batch:
            raise OptionError(option, f"m={m} and mbs={mbs} {where} disagree: dp x mbs x m = "
                              f"{dp} x {mbs} x {m} = {dp * mbs * m}, not the global batch of "
                              f"{model.batch} samples (--model's batch=); give one of them",
                              EXAMPLE)
        m = model.batch // (dp * mbs)
    elif m is None:
        m = default_micro_batches(model, pp, dp, given.get("v", 1))
    layout = Layout(tp=tp, pp=pp, dp=dp, zero=given.get("zero", 0), micro_batches=m,
                    recompute=given.get("recompute", "none"), virtual_stages=given.get("v", 1),
                    sp=bool(given.get("sp", 1)), recompute_layers=given.get("recompute_layers", 0),
                    grad_sync=given.get("grad_sync", ""),
                    tp_overlap=bool(given.get("tp_overlap", 0)),
                    dp_overlap=bool(given.get("dp_overlap", 1)))
    wrong = problems(layout, model, per_node) + trainers.problems(trainer, layout, model)
    if wrong:
        raise OptionError(option, f"{given.text!r} cannot train {model.name}: "
                          + "; ".join(wrong), EXAMPLE)
    return layout


def resolve_all(text: str | None, model: ModelSpec, gpus: int, per_node: int,
                option: str = OPTION, trainer: str = trainers.TORCH) -> list[Layout]:
    """Every --layout resolved, each once, in the order given."""
    out: list[Layout] = []
    for g in parse(option, text) if text else []:
        layout = resolve(g, model, gpus, per_node, option, trainer)
        if layout not in out:
            out.append(layout)
    return out


def outside(layout: Layout, model: ModelSpec, zero: Sequence[int],
            recompute: Sequence[str]) -> list[str]:
    """Why the enumeration did not produce `layout` (a valid one): the ZeRO stages and
    recomputations asked for, the micro-batch ladder (layouts.micro_batch_counts), and an
    interleaved schedule (the enumeration weighs plain 1F1B only)."""
    why = []
    if layout.virtual_stages > 1:
        why.append(f"{layout.virtual_stages} virtual stages: the enumeration weighs plain 1F1B")
    if layout.dp > 1 and layout.zero not in zero:
        why.append(f"ZeRO {layout.zero} is not in --zero {','.join(map(str, zero))}")
    if layout.recompute not in recompute:
        why.append(f"recompute {layout.recompute} is not in --recompute {','.join(recompute)}")
    ladder = micro_batch_counts(model, layout.pp, layout.dp)
    if layout.micro_batches not in ladder:
        why.append(f"{layout.micro_batches} micro-batches are not on the ladder the plan "
                   f"weighs at pp {layout.pp}, dp {layout.dp} ({', '.join(map(str, ladder))})")
    return why


SYNC_TEXT = {"micro": "every micro-batch", "last": "at the last micro-batch"}


def megatron_text(row: dict) -> str:
    """A row's layout as a Megatron or DeepSpeed user says it."""
    from distbench.planner.ranking import layout_of

    lay = layout_of(row)
    rc = lay.recompute
    if rc == "full" and lay.recompute_layers:
        rc = f"full, {lay.recompute_layers} layers a stage"
    extra = lay.extras()
    return (f"tp {row['tp']}, pp {row['pp']}, dp {row['dp']}, ZeRO {row['zero']}, "
            f"micro-batch size {row['micro_batch_size']} x {row['micro_batches']} "
            f"micro-batch{'es' if int(row['micro_batches']) != 1 else ''}"
            + ("" if rc == "none" else f", recompute {rc}")
            + (", no sequence parallelism" if "sp" in extra else "")
            + (f", gradients synced {SYNC_TEXT[lay.grad_sync]}" if "grad_sync" in extra else "")
            + (", TP overlapped" if "tp_overlap" in extra else "")
            + (", DP not overlapped" if "dp_overlap" in extra else ""))


def standing(row: dict, rows: Sequence[dict]) -> dict:
    """Where a named row stands against the ranked list: its place (its rank, or where it
    would rank among the enumerated layouts that fit), the best layout and the best's gain
    (its step's speed-up over this one's: 0.23 is 23% faster)."""
    from distbench.planner.ranking import label

    ranked = [r for r in rows if r.get("rank") is not None]
    best = ranked[0] if ranked else None
    step = row["predicted_step_ms"]
    place = row.get("rank") if row.get("rank") is not None else (
        1 + sum(1 for r in ranked if r["predicted_step_ms"] < step))
    gain = (step / best["predicted_step_ms"] - 1) if best and best["predicted_step_ms"] > 0 \
        else None
    return {"place": place, "ranked": len(ranked), "best": best,
            "best_label": label(best) if best else None, "gain": gain}


def verdict(row: dict, rows: Sequence[dict]) -> str:
    """One line on a named row: its predicted step and memory, its rank and what beats it."""
    from distbench.planner.ranking import label

    st = standing(row, rows)
    gib = row["memory_per_rank_bytes"] / 2**30
    limit = row["memory_limit_bytes"] / 2**30
    text = (f"{label(row)} ({megatron_text(row)}): predicted {row['predicted_step_ms']:.2f} "
            f"ms a step, {gib:.1f} GiB per rank")
    if not row["fits"]:
        text += f", which does not fit the {limit:.1f} GiB usable (predicted anyway)"
    if not int(row.get("enumerated", 1)):
        why = row.get("outside") or []
        text += "; not in the enumeration" + (f" ({'; '.join(why)})" if why else "")
        if row["fits"] and st["ranked"]:
            text += f"; it would rank {st['place']} of {st['ranked'] + 1} that fit"
    elif row["fits"]:
        text += f"; rank {st['place']} of {st['ranked']} that fit"
    best, gain = st["best"], st["gain"]
    if best is None:
        return text + "; no enumerated layout fits to compare it with"
    if best is row:
        return text + "; it is the best predicted"
    if gain is not None and abs(gain) < 5e-4:
        return (text + f"; as fast as the best predicted, {st['best_label']} "
                f"({best['predicted_step_ms']:.2f} ms)")
    if gain is not None and gain < 0:
        than = "the best enumerated" if row["fits"] else "the best that fits"
        return (text + f"; {_percent(-gain / (1 + gain))} faster than {than}, "
                f"{st['best_label']} ({best['predicted_step_ms']:.2f} ms)")
    return (text + f"; the best predicted is {_percent(gain)} faster: {st['best_label']} "
            f"({megatron_text(best)}), {best['predicted_step_ms']:.2f} ms")


def _percent(x: float) -> str:
    """A gain as a percentage, to a tenth below 1% (a gain of 0.3% is no "0%")."""
    return f"{x:.0%}" if abs(x) >= 0.01 else f"{x:.1%}"


def lines(rows: Sequence[dict]) -> list[str]:
    """The console's and plan.md's line on each layout the user named, in the plan's order."""
    return [verdict(r, rows) for r in rows if r.get("given")]
