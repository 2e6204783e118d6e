"""The checks an option declares (`option(check=...)`, core/options.py): each takes the flag and
the raw value (as typed, or from a config file) and returns the value to store, or raises
OptionError with a valid example. Those that take a fixed set of words say which (`choices_of`):
the command line lists them under --help and the shell completes them. No torch import."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from distbench.core.dtypes import ALIASES as DTYPE_ALIASES
from distbench.core.dtypes import FLOATS as FLOAT_DTYPES
from distbench.core.sizes import SizeError, parse_size, parse_sizes

# A timed loop keeps one sample per iteration on every rank (and all-reduces them once).
MAX_ITERS = 10_000_000


class OptionError(Exception):
    """One bad option: printed as a single line with a valid example, exit code 2."""

    def __init__(self, option: str, message: str, example: str):
        super().__init__(f"{option}: {message} (example: {example})")


Validator = Callable[[str, Any], Any]  # (--flag, raw value) -> value; raises OptionError


def with_example(check: Validator, example: str) -> Validator:
    """The valid example a check quotes, kept on it for errors found before it runs (a value
    the command line could not even parse)."""
    check.example = example
    return check


def with_choices(check: Validator, choices: tuple[str, ...] | Callable[[], tuple[str, ...]],
                 many: bool = False) -> Validator:
    """`check` takes one of `choices` (a function giving them, for a registry read late), or with
    `many` a comma list of them: what --help lists and the shell completes. The check itself
    still refuses a bad value, in its own words."""
    check.choices = choices
    check.many = many
    return check


def choices_of(check: Validator | None) -> tuple[tuple[str, ...], bool] | None:
    """The words `check` takes and whether it takes a comma list of them; None for a check of
    no fixed set (a size, a number, a path)."""
    choices = getattr(check, "choices", None)
    if choices is None:
        return None
    return tuple(choices() if callable(choices) else choices), bool(getattr(check, "many", False))


def completer(choices: Callable[[], tuple[str, ...]], many: bool = False):
    """What the shell offers for an option of fixed choices: those that start as typed; for a
    comma list, the last item completed after those already typed (`all` only alone)."""
    def complete(incomplete: str) -> list[str]:
        head, comma, last = incomplete.rpartition(",") if many else ("", "", incomplete)
        given = {n.strip().lower() for n in head.split(",")} if comma else set()
        return [head + comma + c for c in choices() if c.startswith(last.lower())
                and c not in given and not (comma and c == "all")]
    return complete


def optional(check: Validator) -> Validator:
    """`check`, letting None (left out) through; its example and choices kept."""
    wrapped = with_example(lambda option, value: None if value is None else check(option, value),
                           getattr(check, "example", ""))
    if getattr(check, "choices", None) is not None:
        with_choices(wrapped, check.choices, check.many)
    return wrapped


def require(test: Callable[[Any], bool], message: str, example: str,
            convert: Callable[[Any], Any] = lambda v: v, optional: bool = False) -> Validator:
    """`message` may name the value as {value}."""
    def check(option: str, value):
        if optional and value is None:
            return None
        if not test(value):
            raise OptionError(option, message.format(value=value), example)
        return convert(value)
    return with_example(check, example)


def at_least(low: int, example: str, optional: bool = False) -> Validator:
    text = f"must be at least {low}, got {{value}}" if low else "must be 0 or more, got {value}"
    return require(lambda v: v >= low, text, example, optional=optional)


def iterations(example: str, optional: bool = False) -> Validator:
    """At least 1, and at most what a timed loop can keep a sample of."""
    low = at_least(1, example, optional)
    high = require(lambda v: v <= MAX_ITERS, f"must be at most {MAX_ITERS} (one sample is kept "
                   "per iteration), got {value}", example, optional=optional)
    return with_example(lambda option, value: high(option, low(option, value)), example)


def fraction(example: str, optional: bool = False) -> Validator:
    return require(lambda v: 0 < v <= 1, "must be a fraction in (0, 1], got {value}", example,
                   float, optional)


def one_of(valid: tuple[str, ...], example: str) -> Validator:
    def check(option: str, value) -> str:
        value = str(value).strip().lower()
        if value not in valid:
            raise OptionError(option, f"unknown value {value!r} (valid: {', '.join(valid)})",
                              example)
        return value
    return with_choices(with_example(check, example), valid)


def pick(valid: tuple[str, ...] | Callable[[], tuple[str, ...]], example: str,
         aliases: dict[str, str] | None = None) -> Validator:
    """A comma list of names from `valid` (or 'all'), order kept, duplicates dropped."""
    def names_ok() -> tuple[str, ...]:
        return valid() if callable(valid) else valid

    def check(option: str, text) -> list[str]:
        known = names_ok()
        names = [t.strip().lower() for t in str(text).split(",")]
        if names == ["all"]:
            return list(known)
        out: list[str] = []
        for name in names:
            canon = (aliases or {}).get(name, name)
            if canon not in known:
                raise OptionError(option, f"unknown value {name!r} (valid: "
                                  f"{', '.join(known)}, all)", example)
            if canon not in out:
                out.append(canon)
        return out
    return with_choices(with_example(check, example), lambda: (*names_ok(), "all"), many=True)


def parse_headroom(text: str) -> tuple[int, float]:
    """--headroom as (bytes, fraction of the device), one of them 0: "512M" or "0.05"; "0" for
    none. Raises SizeError."""
    s = str(text).strip()
    try:
        value = float(s)
    except ValueError:
        return parse_size(s), 0.0
    if 0 < value < 1:
        return 0, value
    if value == 0:
        return 0, 0.0
    return parse_size(s), 0.0


def headroom(example: str) -> Validator:
    def check(option: str, text) -> str:
        try:
            parse_headroom(text)
        except SizeError as e:
            raise OptionError(option, f"{e}; or a fraction of the device below 1", example) \
                from None
        return str(text).strip()
    return with_example(check, example)


def sizes(example: str) -> Validator:
    def check(option: str, text) -> list[int]:
        try:
            return parse_sizes(str(text))
        except SizeError as e:
            raise OptionError(option, str(e), example) from None
    return with_example(check, example)


def one_float_dtype(option: str, text) -> str:
    """One floating-point dtype (an alias such as bf16 allowed): not a list, nor "all", and
    the refusal lists only what it takes."""
    names = [t.strip().lower() for t in str(text).split(",")]
    if len(names) != 1 or names == ["all"]:
        raise OptionError(option, f"takes one floating-point dtype ({', '.join(FLOAT_DTYPES)}),"
                          f" got {str(text)!r}", "--dtype bfloat16")
    return one_of(FLOAT_DTYPES, "--dtype bfloat16")(option, DTYPE_ALIASES.get(names[0],
                                                                              names[0]))


with_choices(with_example(one_float_dtype, "--dtype bfloat16"), FLOAT_DTYPES)


def check_writable_dir(option: str, path: Path, example: str) -> Path:
    """Prove the directory could be created and written, before any work starts, without
    creating anything: a run refused later (a root outside the world) leaves nothing behind."""
    probe = Path(os.path.abspath(path))
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        why = "Not a directory"
    elif not os.access(probe, os.W_OK | os.X_OK):
        why = "Read-only file system" if _read_only(probe) else "Permission denied"
    else:
        why = _cannot_make_in(probe)
        if why is None:
            return path
    raise OptionError(option, f"cannot write to {str(path)!r}: {why}", example)


def _cannot_make_in(directory: Path) -> str | None:
    """Why no directory can be made in `directory`, found by making one and removing it at
    once: root passes every access() test, and /proc or /sys refuse whatever the mode bits
    say. None when it can."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".distbench-probe-", dir=directory))
    except OSError as e:
        return e.strerror or str(e)
    return None


def _read_only(path: Path) -> bool:
    return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
