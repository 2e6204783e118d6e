"""A profile file's text validated into a Profile (profile_model.py): every key known, every
value of its kind and in its range, each error one line naming the file and the key
(ProfileError, exit code 2); and a profile's sizes held against the ranks each check will run
on (check_sizes), before any worker starts.

No torch here: the command line's validation and accept --dry-run read profiles.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
import unicodedata
from pathlib import Path

from distbench.core import dtypes
from distbench.core.accounting import min_bytes
from distbench.core.dtypes import element_bytes
from distbench.core.options import MAX_ITERS
from distbench.core.sizes import SizeError, parse_size
from distbench.kinds.accept.profile_model import (
    COMMANDS,
    DEFAULT_DTYPE,
    METRICS,
    P2P_PATTERNS,
    SCOPES,
    VS,
    NodeFloors,
    Profile,
    ProfileCheck,
    ProfileError,
)
from distbench.ops.collectives import OPS as COLLECTIVES
from distbench.ops.collectives import names as collective_names

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_TOP_KEYS = ("name", "description", "match", "settings", "check")
_TOP_REQUIRED = ("name", "description", "settings", "check")
_MATCH_KEYS = ("gpu", "exclude", "gpus_per_node")
_SETTINGS_KEYS = ("iters", "warmup", "baseline_tolerance")
_CHECK_KEYS = ("name", "scope", "command", "op", "pattern", "dtype", "size", "metric", "vs",
               "fail", "warn", "fail_no_nvls", "warn_no_nvls", "floors_by_nodes")
_FLOOR_KEYS = ("fail", "warn", "fail_no_nvls", "warn_no_nvls")
# a row of [[check.floors_by_nodes]]: the floors for a cluster of that many nodes
_ROW_KEYS = ("nodes", *_FLOOR_KEYS)
_CHECK_REQUIRED = ("name", "scope", "command", "size", "metric", "vs")
# what a check names its operation with, per command (as the command-line flags do)
_OP_KEY = {"collective": "op", "p2p": "pattern"}

def shown(path: Path) -> str:
    """A path as messages show it: relative to the current directory when it is under it."""
    try:
        return str(Path(os.path.abspath(path)).relative_to(Path.cwd()))
    except (ValueError, OSError):  # elsewhere, or the current directory is gone
        return str(path)


class _Reader:
    """Validates one profile's values, each error naming the file and the key."""

    def __init__(self, path: Path):
        self.path = path

    def error(self, where: str, message: str) -> ProfileError:
        return ProfileError(f"{shown(self.path)}: {where}: {message}")

    def keys(self, table: dict, where: str, known: tuple[str, ...],
             required: tuple[str, ...]) -> None:
        prefix = f"{where} " if where else ""
        for key in table:
            if key not in known:
                raise self.error(f"{prefix}key {key!r}",
                                 f"unknown key (valid: {', '.join(known)})")
        for key in required:
            if key not in table:
                raise self.error(f"{prefix}key {key!r}", "missing")

    def string(self, value, where: str) -> str:
        if not isinstance(value, str):
            raise self.error(where, f"must be a string, got {_toml(value)}")
        text = value.strip()
        if not text or "\n" in text:
            raise self.error(where, "must be one non-empty line")
        bad = _control(text)
        if bad is not None:
            # names and descriptions reach accept.csv, accept.md and the console: a NUL or an
            # escape sequence there corrupts what a person or a tool reads
            raise self.error(where, f"must be printable text, got {text!r}, with the control "
                             f"character U+{ord(bad):04X}")
        return text

    def choice(self, value, where: str, valid: tuple[str, ...], what: str) -> str:
        text = self.string(value, where).lower()
        if text not in valid:
            raise self.error(where, f"unknown {what} {text!r} (valid: {', '.join(valid)})")
        return text

    def integer(self, value, where: str, low: int, high: int | None = None) -> int:
        # bool is an int in Python; in a profile `true` is never a count
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(where, f"must be a whole number, got {_toml(value)}")
        if value < low or (high is not None and value > high):
            top = f" and at most {high}" if high is not None else ""
            raise self.error(where, f"must be at least {low}{top}, got {value}")
        return value

    def number(self, value, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(where, f"must be a number, got {_toml(value)}")
        if not math.isfinite(value):
            raise self.error(where, f"must be a finite number, got {value}")
        return float(value)

    def table(self, value, where: str) -> dict:
        if not isinstance(value, dict):
            raise self.error(where, f"must be a table, got {_toml(value)}")
        return value


def _control(text: str) -> str | None:
    """The first control character (or line or paragraph separator) in `text`, or None."""
    return next((c for c in text if unicodedata.category(c) in ("Cc", "Zl", "Zp")), None)


def _toml(value) -> str:
    """A value as TOML writes it, for messages: true, "16G", 3."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    return str(value)



def parse(text: str, path: Path) -> Profile:
    """Validate a profile's text, read from `path` (here or on the node that sent it: what
    messages name); raises ProfileError naming the file and the key."""
    r = _Reader(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ProfileError(f"{shown(path)}: not valid TOML: {e}") from None
    _is_a_profile(r, data)
    r.keys(data, "", _TOP_KEYS, _TOP_REQUIRED)
    name = r.string(data["name"], "key 'name'")
    if not _NAME_RE.fullmatch(name):
        raise r.error("key 'name'", f"{name!r} must be letters, digits, '.', '_' or '-' "
                      "(it is typed after --profile)")
    description = r.string(data["description"], "key 'description'")
    match_gpu, exclude, per_node = _match(r, r.table(data.get("match", {}), "key 'match'"))
    settings = r.table(data["settings"], "key 'settings'")
    r.keys(settings, "[settings]", _SETTINGS_KEYS, _SETTINGS_KEYS)
    iters = r.integer(settings["iters"], "[settings] key 'iters'", 1, MAX_ITERS)
    warmup = r.integer(settings["warmup"], "[settings] key 'warmup'", 0, MAX_ITERS)
    tolerance = r.number(settings["baseline_tolerance"], "[settings] key 'baseline_tolerance'")
    if not 0 < tolerance < 1:
        raise r.error("[settings] key 'baseline_tolerance'",
                      f"must be a fraction above 0 and below 1 (0.05: 5% worse fails), "
                      f"got {tolerance:g}")

    raw_checks = data["check"]
    if not isinstance(raw_checks, list) or not all(isinstance(c, dict) for c in raw_checks):
        raise r.error("key 'check'", f"must be [[check]] tables, one per check (keys: "
                      f"{', '.join(_CHECK_KEYS)}), got {_toml(raw_checks)}")
    if not raw_checks:
        raise r.error("key 'check'", "no checks: a profile needs at least one [[check]]")
    checks: list[ProfileCheck] = []
    for i, raw in enumerate(raw_checks, 1):
        check = _check(r, raw, i)
        if any(c.name == check.name for c in checks):
            raise r.error(f"check {check.name!r} key 'name'",
                          "duplicate check name (each check's name must be unique)")
        checks.append(check)
    return Profile(name=name, description=description, path=path, match_gpu=match_gpu,
                   gpus_per_node=per_node, iters=iters, warmup=warmup,
                   baseline_tolerance=tolerance, checks=tuple(checks), match_exclude=exclude)


def _is_a_profile(r: _Reader, data: dict) -> None:
    """Says what a file is when it is no profile at all, before any one key is blamed: an empty
    file (/dev/null), another TOML file (a --config), or top-level keys written after a table,
    where TOML puts them in that table."""
    named = shown(r.path)
    if not data:
        raise ProfileError(f"{named}: empty (no TOML key), not a profile: a profile has name, "
                           "description, [settings] and [[check]] tables (docs/accept-profiles.md)")
    if not any(k in data for k in _TOP_KEYS):
        raise ProfileError(f"{named}: not a profile: none of its keys "
                           f"({', '.join(map(repr, data))}) is a profile's (valid: "
                           f"{', '.join(_TOP_KEYS)})")
    for table, known in (("match", _MATCH_KEYS), ("settings", _SETTINGS_KEYS)):
        inside = data.get(table)
        if not isinstance(inside, dict):
            continue
        for key in inside:
            if key in _TOP_KEYS and key not in known and key not in data:
                raise r.error(f"[{table}] key {key!r}", f"not a key of [{table}] (valid: "
                              f"{', '.join(known)}): a key written after [{table}] belongs to "
                              f"it; {key!r} goes at the top, before the first table"
                              + (", and checks are [[check]] tables" if key == "check" else ""))


def _match(r: _Reader, match: dict) -> tuple[str | None, tuple[str, ...], int | None]:
    r.keys(match, "[match]", _MATCH_KEYS, ())
    gpu = r.string(match["gpu"], "[match] key 'gpu'") if "gpu" in match else None
    exclude = match.get("exclude", [])
    if not isinstance(exclude, list):
        raise r.error("[match] key 'exclude'", f"must be a list of strings, got {_toml(exclude)}")
    exclude = tuple(r.string(x, "[match] key 'exclude'") for x in exclude)
    if exclude and gpu is None:
        raise r.error("[match] key 'exclude'", "only narrows [match] gpu, which is not given")
    per_node = match.get("gpus_per_node")
    if per_node is not None:
        per_node = r.integer(per_node, "[match] key 'gpus_per_node'", 0)
        if per_node == 0 and gpu is not None:
            raise r.error("[match] key 'gpus_per_node'", f"0 (no GPU) contradicts gpu = "
                          f"{_toml(gpu)}")
    return gpu, exclude, per_node


def _check(r: _Reader, raw: dict, index: int) -> ProfileCheck:
    # named by its name once that is known to be good, else by its place in the file
    where = f"check {index}"
    name = raw.get("name")
    if isinstance(name, str) and name.strip() and "\n" not in name and _control(name) is None:
        where = f"check {name.strip()!r}"
    r.keys(raw, where, _CHECK_KEYS, _CHECK_REQUIRED)
    name = r.string(raw["name"], f"{where} key 'name'")
    scope = r.choice(raw["scope"], f"{where} key 'scope'", SCOPES, "scope")
    command = r.choice(raw["command"], f"{where} key 'command'", COMMANDS, "command")

    op_key = _OP_KEY[command]
    other = next(k for k in _OP_KEY.values() if k != op_key)
    if other in raw:
        raise r.error(f"{where} key {other!r}", f"{command} checks name their operation with "
                      f"{op_key!r}, not {other!r}")
    if op_key not in raw:
        raise r.error(f"{where} key {op_key!r}", "missing")
    if command == "collective":
        op = r.choice(raw["op"], f"{where} key 'op'", collective_names(), "op")
    else:
        op = r.choice(raw["pattern"], f"{where} key 'pattern'", P2P_PATTERNS, "pattern")

    dtype = DEFAULT_DTYPE
    if "dtype" in raw:
        text = r.string(raw["dtype"], f"{where} key 'dtype'").lower()
        if text not in dtypes.ALIASES:
            raise r.error(f"{where} key 'dtype'",
                          f"unknown dtype {text!r} (valid: {', '.join(dtypes.NAMES)})")
        dtype = dtypes.ALIASES[text]

    size_raw = raw["size"]
    if isinstance(size_raw, bool) or not isinstance(size_raw, str | int):
        raise r.error(f"{where} key 'size'",
                      f"must be a size such as \"16G\" or a byte count, got {_toml(size_raw)}")
    try:
        size = parse_size(str(size_raw))
    except SizeError as e:
        raise r.error(f"{where} key 'size'", str(e)) from None
    _whole_elements(r, f"{where} key 'size'", size_raw, size, dtype)

    metric = r.choice(raw["metric"], f"{where} key 'metric'", tuple(METRICS), "metric")
    if not _metric_fits(metric, command, op):
        fits = [m for m in METRICS if _metric_fits(m, command, op)]
        raise r.error(f"{where} key 'metric'", f"{metric} is not measured by {command} "
                      f"{op_key} {op} (valid for it: {', '.join(fits)})")

    vs = r.choice(raw["vs"], f"{where} key 'vs'", VS, "vs")
    if vs == "peers" and scope == "cluster":
        raise r.error(f"{where} key 'vs'", "a cluster check is one measurement over every "
                      "rank: it has no peers to be judged against (use vs = \"absolute\", or "
                      "scope \"node\" or \"pair\")")
    if "floors_by_nodes" in raw:
        by_nodes = _by_nodes(r, raw, where, scope, metric, vs)
        return ProfileCheck(name=name, scope=scope, command=command, op=op, dtype=dtype,
                            size=size, metric=metric, vs=vs, fail=None, warn=None,
                            by_nodes=by_nodes)
    fail, warn = _floors(r, raw, where, metric, vs, "")
    if fail is None and warn is None:
        raise r.error(f"{where} key 'fail'", "missing: a check needs fail, warn or both"
                      + (" (or, by node count, [[check.floors_by_nodes]] rows)"
                         if scope == "cluster" and vs == "absolute" else ""))
    if vs == "peers":
        for key in ("fail_no_nvls", "warn_no_nvls"):
            if key in raw:
                raise r.error(f"{where} key {key!r}", "only an absolute check has floors "
                              "without NVLS")
    fail_no_nvls, warn_no_nvls = _floors(r, raw, where, metric, vs, "_no_nvls")
    return ProfileCheck(name=name, scope=scope, command=command, op=op, dtype=dtype, size=size,
                        metric=metric, vs=vs, fail=fail, warn=warn, fail_no_nvls=fail_no_nvls,
                        warn_no_nvls=warn_no_nvls)


def _by_nodes(r: _Reader, raw: dict, where: str, scope: str, metric: str,
              vs: str) -> tuple[NodeFloors, ...]:
    """A cluster check's [[check.floors_by_nodes]] rows: each a node count (a whole number, at
    least 1, ascending and each once) and its floors, checked as a check's own are."""
    key = f"{where} key 'floors_by_nodes'"
    if vs != "absolute":
        raise r.error(key, "only an absolute check has floors by node count (a peers check "
                      "is a fraction of what its peers reach, at any size)")
    if scope != "cluster":
        raise r.error(key, f"only a cluster check runs on a number of nodes that varies (a "
                      f"{scope} check runs on {'one node' if scope == 'node' else 'two'}): "
                      "give it fail and warn")
    beside = next((k for k in _FLOOR_KEYS if k in raw), None)
    if beside is not None:
        raise r.error(f"{where} key {beside!r}", "a check with [[check.floors_by_nodes]] takes "
                      "its floors from those rows only: give them in each row instead")
    rows = raw["floors_by_nodes"]
    if not isinstance(rows, list) or not all(isinstance(x, dict) for x in rows):
        raise r.error(key, f"must be [[check.floors_by_nodes]] tables, one per node count "
                      f"(keys: {', '.join(_ROW_KEYS)}), got {_toml(rows)}")
    if not rows:
        raise r.error(key, "no rows: give at least one [[check.floors_by_nodes]] table")
    out: list[NodeFloors] = []
    for i, row in enumerate(rows, 1):
        at = f"{where} floors_by_nodes row {i}"
        stray = next((k for k in row if k not in _ROW_KEYS and k in _CHECK_KEYS), None)
        if stray is not None:  # TOML puts a key written after a row's header in the row
            raise r.error(f"{at} key {stray!r}", f"not a key of a row (valid: "
                          f"{', '.join(_ROW_KEYS)}): a key written after "
                          "[[check.floors_by_nodes]] belongs to that row; the check's own keys "
                          "go before its first row")
        r.keys(row, at, _ROW_KEYS, ("nodes",))
        nodes = r.integer(row["nodes"], f"{at} key 'nodes'", 1)
        if out and nodes <= out[-1].nodes:
            raise r.error(f"{at} key 'nodes'", f"{nodes} after {out[-1].nodes}: list the rows "
                          "by node count, ascending, each count once")
        fail, warn = _floors(r, row, at, metric, vs, "")
        if fail is None and warn is None:
            raise r.error(f"{at} key 'fail'", "missing: a row needs fail, warn or both")
        fail_no_nvls, warn_no_nvls = _floors(r, row, at, metric, vs, "_no_nvls")
        out.append(NodeFloors(nodes, fail, warn, fail_no_nvls, warn_no_nvls))
    return tuple(out)


def _floors(r: _Reader, raw: dict, where: str, metric: str, vs: str,
            suffix: str) -> tuple[float | None, float | None]:
    """fail and warn (fail_no_nvls and warn_no_nvls with `suffix`), each None when absent."""
    floors = {}
    for key in (f"fail{suffix}", f"warn{suffix}"):
        if key in raw:
            value = r.number(raw[key], f"{where} key {key!r}")
            if vs == "peers" and not 0 < value <= 1:
                raise r.error(f"{where} key {key!r}", f"a peers check's {key} is a fraction "
                              f"of what the healthy peers reach, in (0, 1], got {value:g}")
            if vs == "absolute" and value <= 0:
                raise r.error(f"{where} key {key!r}", f"must be above 0 {METRICS[metric]['unit']}"
                              f", got {value:g}")
            floors[key] = value
        else:
            floors[key] = None
    fail, warn = floors[f"fail{suffix}"], floors[f"warn{suffix}"]
    if fail is not None and warn is not None:
        # peers fractions grow with performance whatever the metric's direction
        higher = vs == "peers" or METRICS[metric]["higher_is_better"]
        if higher and warn < fail:
            raise r.error(f"{where} key 'warn{suffix}'", f"{warn:g} is below fail{suffix} "
                          f"{fail:g}: for {'a fraction of the peers' if vs == 'peers' else metric}"
                          f" higher is better, so warn{suffix} must be at least fail{suffix}")
        if not higher and warn > fail:
            raise r.error(f"{where} key 'warn{suffix}'", f"{warn:g} is above fail{suffix} "
                          f"{fail:g}: for {metric} lower is better, so warn{suffix} must be at "
                          f"most fail{suffix}")
    return fail, warn


def _whole_elements(r: _Reader, where: str, raw, size: int, dtype: str) -> None:
    """A size that is no whole number of elements is rounded down when measured: the row would
    show another size than the profile names, and "3" of float32 measures nothing at all."""
    elt = element_bytes(dtype)
    if size % elt:
        lower, upper = size // elt * elt, (size // elt + 1) * elt
        fits = f"{lower} or {upper}" if lower else str(upper)
        raise r.error(where, f"{_toml(raw)} is {size} B, not a whole number of {dtype} "
                      f"elements ({elt} B each): give a multiple of {elt}, such as {fits}")


def smallest_size(check: ProfileCheck, ranks: int) -> int:
    """The fewest bytes `check` measures anything with on `ranks` ranks: one element, or for
    the ops that split their buffer (all_gather, reduce_scatter, ...) one 16-byte aligned block
    per rank, as nccl-tests rounds it (accounting.buffer_of)."""
    elt = element_bytes(check.dtype)
    if check.command != "collective":
        return elt
    return min_bytes(COLLECTIVES[check.op].accounting, elt, ranks)


def _group_ranks(scope: str, world: int, per_node: int | None) -> int:
    """The most ranks a check of `scope` runs on where that is known; 2 (the fewest that
    measure anything) where the ranks per node are not."""
    if scope == "cluster":
        return world
    if per_node is None:
        return min(world, 2)
    if scope == "node":
        return min(world, per_node)
    return 2 * per_node if world >= 2 * per_node else 0  # one node: no pair runs


def check_sizes(profile: Profile, world: int, per_node: int | None, how: str) -> None:
    """Each check's size against the ranks it will run on, before any worker starts: a size
    too small for them is skipped at run time, and a check skipped on every target judges
    nothing. `per_node`: the ranks of each node where every node's is known (None: not known);
    `how`: where `world` comes from, for the message. Raises ProfileError."""
    r = _Reader(profile.path)
    for check in profile.checks:
        ranks = _group_ranks(check.scope, world, per_node)
        need = smallest_size(check, ranks)
        if ranks >= 2 and check.size < need:
            raise r.error(f"check {check.name!r} key 'size'", f"{check.size} B is too small "
                          f"for {check.op} of {check.dtype} on {ranks} ranks (a {check.scope} "
                          f"check on {how}): it splits the buffer into one 16-byte aligned "
                          f"block per rank, so it needs at least {need} B")


def _metric_fits(metric: str, command: str, op: str) -> bool:
    commands = METRICS[metric]["commands"]
    return command in commands and (commands[command] is None or op in commands[command])
