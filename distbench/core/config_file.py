"""`--config FILE`: a command's options from a TOML file, keyed as on the command line, checked
for what the file alone can get wrong (a typo'd key or table, a value of the wrong TOML type)
before the options' own checks see the values. No torch import."""

from __future__ import annotations

import json
import tomllib
import typing
from pathlib import Path
from typing import Any

from distbench.core.option_checks import OptionError


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _toml_type_ok(value, kind) -> bool:
    """A TOML value fits an option of type `kind`: booleans are not numbers and numbers are not
    booleans; text (or a list, joined with commas) goes to text options only. A text option
    takes a number or a boolean too, as its own check reads them (`bucket-cap-mb = 10`,
    `reshard-after-forward = false`)."""
    if _repeatable(kind):
        return isinstance(value, str) or (isinstance(value, list)
                                          and all(isinstance(v, str) for v in value))
    base = {t for t in typing.get_args(kind) if t is not type(None)} or {kind}
    text = bool(base & {str, Path})
    if isinstance(value, bool):
        return bool in base or text
    if isinstance(value, int | float):
        return float in base or (int in base and isinstance(value, int)) or text
    if isinstance(value, str | list):
        return bool(base & {str, Path})
    return False


def _repeatable(kind) -> bool:
    """An option given once per value on the command line (plan's --layout): list[str]."""
    return any(typing.get_origin(t) is list for t in (kind, *typing.get_args(kind)))


def load_config(path: Path, command: str, known: dict[str, Any], commands: set[str],
                paths: frozenset[str] = frozenset()) -> dict:
    """Options from a TOML file: top-level keys, then the [command] table over them (tables of
    other commands are skipped: one file may serve several). Keys as on the command line
    (`min-time` or `min_time`), `known` maps each to its type; list values are joined with
    commas, but for an option the command line repeats (list[str]) each is one value. `paths`:
    the options that name a file or directory (declared Path), which take text alone: `baseline
    = 5` is a mistake, not a directory named "5". A flag (a bool option) takes true or false,
    whether or not the command line has a --no- form of it."""
    example = "--config configs/smoke-gloo.toml"
    try:
        data = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise OptionError("--config", f"no such file {str(path)!r}", example) from None
    except OSError as e:
        raise OptionError("--config", f"cannot read {str(path)!r}: {e.strerror}", example) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise OptionError("--config", f"{path} is not valid TOML: {e}", example) from None
    if not data:  # empty, or comments only: a config that says nothing is a mistake
        raise OptionError("--config", f"{path} holds no options (an empty file?)", example)
    tables = {k for k, v in data.items() if isinstance(v, dict)}
    unknown = sorted(tables - commands)
    if unknown:
        raise OptionError("--config", f"unknown table [{unknown[0]}] in {path} (tables: "
                          f"{', '.join(sorted(commands))})", example)
    top = {k: v for k, v in data.items() if k not in tables}
    table = data.get(command, {})
    if not top and not table and tables:
        raise OptionError("--config", f"{path} has no [{command}] table and no top-level keys "
                          f"(it has {', '.join(f'[{t}]' for t in sorted(tables))})", example)
    out: dict = {}
    for key, value in {**top, **table}.items():
        name = key.replace("-", "_")
        if name not in known:
            valid = ", ".join(sorted(k.replace("_", "-") for k in known))
            raise OptionError("--config", f"unknown key {key!r} in {path} (valid: {valid})",
                              example)
        if not _toml_type_ok(value, known[name]) or (name in paths
                                                      and not isinstance(value, str)):
            raise OptionError("--config", f"{key} = {json.dumps(value)} in {path} is the wrong "
                              f"type for {_flag(name)}", example)
        if _repeatable(known[name]):  # one value per entry, as the option repeated
            value = [value] if isinstance(value, str) else list(value)
        elif isinstance(value, list):
            value = ",".join(str(v) for v in value)
        elif isinstance(value, bool) and bool not in typing.get_args(known[name]) + (
                known[name],):
            value = str(value).lower()
        out[name] = value
    return out
