"""Parsing the few values report and compare take beyond paths: one line and exit 2 on bad
input, as for every command."""

from __future__ import annotations

from distbench.core.options import OptionError


def threshold(text: str) -> float:
    """'5%' or '0.05' -> 0.05."""
    raw = str(text).strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise OptionError("--threshold", f"not a percentage: {raw!r}", "--threshold 5%") \
            from None
    if not 0 <= value < 1:
        raise OptionError("--threshold", f"must be from 0% to below 100%, got {raw}",
                          "--threshold 5%")
    return value
