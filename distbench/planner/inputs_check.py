"""A saved inputs.json checked like any input before a plan reads it: each figure the plan
divides by, multiplies or ranks by must be a finite number in its range, each count a whole
number. One bad field is one line naming the file and the field (OptionError on --from, exit
2): a NaN alpha ranked "nan" steps as fitting, a negative beta printed negative times, a zero
beta or node size divided by zero. Fields this does not know are left to Inputs.from_json.
Torch-free."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from distbench.core.options import OptionError

FLAG = "--from"
EXAMPLE = "--from results/20250101T000000Z-plan"

InputRule = Callable[[object], str | None]  # the value -> why it is bad, or None


def _number(low: float, high: float = math.inf, *, above: bool = False,
            whole: bool = False, optional: bool = False) -> InputRule:
    """A finite number (an int when `whole`) from `low` (excluded when `above`) to `high`."""
    kind = "a whole number" if whole else "a finite number"
    bound = (f"above {low:g}" if above else f"at least {low:g}") + (
        f" and at most {high:g}" if high < math.inf else "")

    def check(value: object) -> str | None:
        if value is None and optional:
            return None
        ok = isinstance(value, int | float) and not isinstance(value, bool) and (
            not whole or isinstance(value, int)) and math.isfinite(value) and (
            value > low if above else value >= low) and value <= high
        return None if ok else f"must be {kind} {bound}"
    return check


def _text(value: object) -> str | None:
    return None if isinstance(value, str) else "must be text"


def _flag(value: object) -> str | None:
    return None if isinstance(value, bool) else "must be true or false"


COUNT = _number(1, whole=True)
TIME = _number(0)  # microseconds: 0 is a measurement (nothing exposed, nothing hidden)
SHARE = _number(0, 1)

FIT = {"ranks": COUNT, "alpha_us": TIME, "beta_gbps": _number(0, above=True), "op": _text}
POINT = {"tp": COUNT, "tokens": COUNT, "layer_us": _number(0, above=True),
         "flops": _number(0, above=True), "with_tp_comm": _flag}
FIGURES = {
    "alone_ratio": _number(0, 1, above=True), "optimizer_us_per_layer": TIME,
    "optimizer_us_per_param": _number(0, optional=True), "pipeline_us_per_microbatch": TIME,
    "bubble_weight": SHARE, "gpus_per_node": _number(1, whole=True, optional=True),
    "memory_per_gpu": _number(0, above=True, optional=True), "device": _text}
# name -> the check of each value in that mapping
MAPPINGS = {"overlap": SHARE, "wrapper_us_per_layer": TIME, "overlap_layouts": _text,
            "compute_model": COUNT}
LISTS = {"fits": FIT, "compute": POINT}
TEXTS = ("sources", "notes")


def check(data: object, path: Path) -> None:
    """Raise OptionError naming `path` and the first bad field of `data` (inputs.json read)."""
    def bad(where: str, why: str, value: object) -> OptionError:
        return OptionError(FLAG, f"{path}: {where} {why}, got {value!r}", EXAMPLE)

    if not isinstance(data, dict):
        raise bad("the file", "must be a JSON object", type(data).__name__)
    for name, rule in FIGURES.items():
        if name in data and (why := rule(data[name])):
            raise bad(name, why, data[name])
    for name, rule in MAPPINGS.items():
        items = data.get(name)
        if items is None and name == "compute_model":
            continue
        if name in data and not isinstance(items, dict):
            raise bad(name, "must be a mapping", items)
        for key, value in (items or {}).items():
            if why := rule(value):
                raise bad(f"{name}.{key}", why, value)
    for name, rules in LISTS.items():
        items = data.get(name, [])
        if not isinstance(items, list):
            raise bad(name, "must be a list", items)
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise bad(f"{name}[{i}]", "must be a JSON object", item)
            for key, rule in rules.items():
                if key in item and (why := rule(item[key])):
                    raise bad(f"{name}[{i}].{key}", why, item[key])
    for name in TEXTS:
        items = data.get(name, [])
        if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
            raise bad(name, "must be a list of text", items)
