"""Message-size sweeps in the style of nccl-tests (``-b 8 -e 128M -f 2``).

Sizes use binary suffixes (K = 1024, M = 2**20, G = 2**30, T = 2**40), case-insensitive,
optionally followed by ``B`` or ``iB``; a plain integer is a byte count.

This module is imported by the CLI before torch is loaded, so it must stay dependency-free.
"""

from __future__ import annotations

import re

__all__ = [
    "MAX_SIZE",
    "MAX_SIZES",
    "SizeError",
    "format_size",
    "parse_size",
    "parse_sizes",
]

MAX_SIZE = 2**40
MAX_SIZES = 1000

_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_FORMAT_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")

# ASCII-only on purpose: int() would happily accept Arabic-Indic digits or "1_000".
_SIZE_RE = re.compile(r"(-?)([0-9]+)(\.[0-9]*)?\s*([A-Za-z]*)", re.ASCII)

# Anything with more digits than this is over MAX_SIZE whatever the suffix, and checking
# the length first keeps int() away from absurdly long strings (it refuses > 4300 digits).
_MAX_DIGITS = len(str(MAX_SIZE))


class SizeError(ValueError):
    """A size or size sweep could not be parsed; the message is one short line."""


def _unit(suffix: str, text: str) -> int:
    upper = suffix.upper()
    if upper.endswith("IB") and len(upper) == 3:
        upper = upper[0]
    elif upper.endswith("B"):
        upper = upper[:-1]
    if upper not in _UNITS:
        raise SizeError(f"unknown suffix '{suffix}' in '{text}' (use K, M, G or T)")
    return _UNITS[upper]


def parse_size(text: str) -> int:
    """Parse one size such as ``"8"``, ``"1K"``, ``"4KiB"`` or ``"128M"`` into bytes."""
    s = text.strip()
    if not s:
        raise SizeError("empty size")
    m = _SIZE_RE.fullmatch(s)
    if m is None:
        raise SizeError(f"'{s}' is not a size (expected a whole number such as 8, 1K or 128M)")
    sign, digits, fraction, suffix = m.groups()
    unit = _unit(suffix, s)
    if fraction is not None:
        raise SizeError(f"'{s}' has a fraction; sizes must be whole numbers (e.g. 1536, not 1.5K)")
    digits = digits.lstrip("0")
    if sign or not digits:
        raise SizeError(f"size must be at least 1 byte, got '{s}'")
    if len(digits) > _MAX_DIGITS or int(digits) * unit > MAX_SIZE:
        raise SizeError(f"'{s}' is larger than the 1 TiB limit")
    return int(digits) * unit


def format_size(n: int) -> str:
    """Render a byte count with binary units: 8 -> "8 B", 1536 -> "1.5 KiB"."""
    if n < 0:
        return "-" + format_size(-n)
    idx = 0
    while idx < len(_FORMAT_UNITS) - 1 and n >= 1024 ** (idx + 1):
        idx += 1
    if idx == 0:
        return f"{n} B"
    text = f"{n / 1024**idx:.2f}"
    # 1048575 B would otherwise print as "1024 KiB"; move it up a unit instead.
    if float(text) >= 1024 and idx < len(_FORMAT_UNITS) - 1:
        idx += 1
        text = f"{n / 1024**idx:.2f}"
    text = text.rstrip("0").rstrip(".")
    return f"{text} {_FORMAT_UNITS[idx]}"


def _too_many(count: int) -> SizeError:
    return SizeError(f"sweep has {count} sizes, more than the {MAX_SIZES} limit")


def _range_part(token: str, what: str, text: str) -> int:
    if not token.strip():
        raise SizeError(f"missing {what} in range '{text}'")
    return parse_size(token)


def _parse_factor(token: str) -> int:
    digits = token[1:].strip()
    # Only plain ASCII digits: "x1.5", "x-2" and "x 2e1" are all refused the same way.
    if not (digits.isascii() and digits.isdigit()):
        raise SizeError(f"factor must be an integer of at least 2, got '{token}'")
    digits = digits.lstrip("0")
    # Any factor above MAX_SIZE yields just START; clamping keeps int() off absurd inputs.
    if len(digits) > _MAX_DIGITS:
        return MAX_SIZE + 1
    if not digits or int(digits) < 2:
        raise SizeError(f"factor must be an integer of at least 2, got '{token}'")
    return int(digits)


def _parse_range(text: str) -> list[int]:
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise SizeError(f"'{text}' is not a range (use START:END[:xF] or START:END:+STEP)")
    start = _range_part(parts[0], "start", text)
    end = _range_part(parts[1], "end", text)
    if end < start:
        raise SizeError(f"end {format_size(end)} is smaller than start {format_size(start)}")
    how = parts[2].strip() if len(parts) == 3 else "x2"
    if not how:
        raise SizeError(f"missing factor or step in range '{text}' (use xF or +STEP)")

    if how[0] in "xX":
        factor = _parse_factor(how)
        sizes = []
        value = start
        while value <= end:
            sizes.append(value)
            # Unreachable with MAX_SIZE = 2**40 and factor >= 2, but cheap insurance if
            # either limit is ever raised.
            if len(sizes) > MAX_SIZES:
                raise _too_many(len(sizes))
            value *= factor
        return sizes

    if how[0] == "+":
        if not how[1:].strip():
            raise SizeError(f"missing step after '+' in range '{text}'")
        step = parse_size(how[1:])
        # Count before building: "1:1T:+1" would otherwise allocate a trillion ints.
        count = (end - start) // step + 1
        if count > MAX_SIZES:
            raise _too_many(count)
        return list(range(start, end + 1, step))

    raise SizeError(f"range step '{how}' must be xF (multiply) or +STEP (add)")


def _parse_list(text: str) -> list[int]:
    seen: dict[int, None] = {}
    for token in text.split(","):
        if not token.strip():
            raise SizeError(f"empty entry in size list '{text}'")
        if ":" in token:
            raise SizeError(f"'{text}' mixes a range with a list; use one or the other")
        seen.setdefault(parse_size(token), None)
        if len(seen) > MAX_SIZES:
            raise SizeError(f"size list has more than the {MAX_SIZES} limit of distinct sizes")
    return list(seen)


def parse_sizes(text: str) -> list[int]:
    """Parse a sweep: ``"8:128M:x2"``, ``"8:128M"``, ``"1K:64K:+4K"``, ``"1K,4K"`` or ``"64M"``.

    Ranges come back ascending; lists keep the user's order with duplicates dropped.
    """
    s = text.strip()
    if not s:
        raise SizeError("empty size list")
    if "," in s:
        return _parse_list(s)
    if ":" in s:
        return _parse_range(s)
    return [parse_size(s)]
