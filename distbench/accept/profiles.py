"""Acceptance profiles: what `distbench accept` checks on one class of hardware, read from
configs/profiles/*.toml (the layout is in docs/accept.md, "Profiles"). A profile lists checks;
each names a measurement (command, op or pattern, dtype, size), where it runs (each node alone,
pairs of nodes, or every rank), the metric judged and the expectation: absolute floors in the
metric's unit, each citing the public figure it comes from, or a fraction of what the healthy
peers reach.

No torch here: profiles are read and validated with the other options, before any worker
starts, so that a bad profile costs one line and exit code 2.
"""

from __future__ import annotations

import math
import os
import re
import site
import stat
import sys
import tomllib
import unicodedata
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from distbench.core import dtypes
from distbench.core.accounting import min_bytes
from distbench.core.contracts import MEASURES
from distbench.core.dtypes import element_bytes
from distbench.core.options import MAX_ITERS, OptionError
from distbench.core.sizes import SizeError, parse_size
from distbench.ops.collectives import OPS as COLLECTIVES
from distbench.ops.collectives import names as collective_names

EXAMPLE = "--profile h100-sxm-8"
AUTO = "auto"
# What auto picks when the snapshots decide nothing more specific.
CPU_PROFILE = "cpu-gloo"
GENERIC_PROFILE = "generic-gpu"

SCOPES = ("node", "pair", "cluster")
COMMANDS = ("collective", "p2p")
# The p2p patterns a check can measure (distbench p2p's matrix is a separate, per-link
# measurement with its own outlier judging).
P2P_PATTERNS = ("ring", "pingpong")
VS = ("absolute", "peers")

# metric -> the commands (and ops or patterns) that report it; None for a command: every op it
# has. The names are the columns of collective.csv and p2p.csv (core.contracts.MEASURES gives
# each one's unit and direction).
_REPORTED_BY = {
    "busbw_gbps": {"collective": None, "p2p": ("ring",)},
    "algbw_gbps": {"collective": None, "p2p": ("ring",)},
    # pingpong's time is one-way latency, half the round trip
    "time_us": {"collective": None, "p2p": ("ring", "pingpong")},
    "p99_us": {"collective": None, "p2p": ("ring", "pingpong")},
    # The median iteration: a burst of load from a neighbour slows some iterations, a fault
    # slows every one. For judging nodes against each other on shared machines (cpu-gloo);
    # blind to a link that stalls now and then, which the mean and p99 see.
    "p50_us": {"collective": None, "p2p": ("ring", "pingpong")},
    # busbw at the median iteration's time (not a CSV column: derived from p50_us)
    "p50_busbw_gbps": {"collective": None, "p2p": ("ring",)},
}
METRICS: dict[str, dict] = {
    name: {"unit": MEASURES[name].unit, "higher_is_better": MEASURES[name].higher_is_better,
           "commands": commands}
    for name, commands in _REPORTED_BY.items()}

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
DEFAULT_DTYPE = "float32"  # as --dtype


@dataclass(frozen=True)
class NodeFloors:
    """A cluster check's floors for clusters of `nodes` nodes: one row of the check's
    [[check.floors_by_nodes]], each citing the figure published for that many nodes."""

    nodes: int
    fail: float | None
    warn: float | None
    fail_no_nvls: float | None = None
    warn_no_nvls: float | None = None


class ProfileError(OptionError):
    """A profile that cannot be used: one line naming the file and the key, exit code 2."""

    def __init__(self, message: str, example: str = EXAMPLE):
        super().__init__("--profile", message, example)


@dataclass(frozen=True)
class Check:
    """One measurement and what it must reach."""

    name: str  # unique within the profile; how the verdict names the check
    scope: str  # "node" (each node alone), "pair" (pairs of nodes) or "cluster" (all ranks)
    command: str  # "collective" or "p2p"
    op: str  # a registered collective op, or a p2p pattern: "ring" or "pingpong"
    dtype: str  # one of options.DTYPES, aliases resolved
    size: int  # bytes, as --sizes counts them for this command and op
    metric: str  # a key of METRICS valid for this command and op
    vs: str  # "absolute" (floors in the metric's unit) or "peers" (fractions, see fraction())
    # worse than fail: FAIL; worse than warn: WARN. Absolute: in the metric's unit (a bandwidth
    # below, a time above); peers: a fraction of the peers' value. None: no such line
    fail: float | None
    warn: float | None
    # an absolute check's floors where NCCL cannot use NVLink SHARP (NVLS): the 8 x H100
    # all_reduce figure is NVLS's, and a healthy node without it reaches the ring's. None: the
    # check's figure holds either way
    fail_no_nvls: float | None = None
    warn_no_nvls: float | None = None
    # a cluster check's floors by node count, ascending (then fail, warn and the floors without
    # NVLS above are None until for_nodes() picks a row): what a healthy cluster reaches across
    # its network changes with its size. (): the floors above hold at any size
    by_nodes: tuple[NodeFloors, ...] = ()

    @property
    def unit(self) -> str:
        return METRICS[self.metric]["unit"]

    def for_nodes(self, nodes: int) -> tuple[Check, str, str]:
        """The check with the floors for a target of `nodes` nodes, with which row that is and
        any caveat, as a verdict's note says them (" for 4 nodes", "; extrapolated ...";
        both "" for a check without floors by node count). The row of that count, else of the
        nearest count above it (past two nodes a cluster's busbw does not grow as nodes are
        added, so a healthy cluster reaches at least the larger count's figure), else, beyond
        the table, its last row, which the caveat calls extrapolated."""
        if not self.by_nodes:
            return self, "", ""
        row = next((r for r in self.by_nodes if r.nodes >= nodes), None)
        caveat = ""
        if row is None:
            row = self.by_nodes[-1]
            caveat = f"; extrapolated to {_nodes(nodes)}: none is given beyond {row.nodes}"
        elif row.nodes != nodes:
            caveat = f"; none is given for {_nodes(nodes)}: the nearest count above"
        return (replace(self, fail=row.fail, warn=row.warn, fail_no_nvls=row.fail_no_nvls,
                        warn_no_nvls=row.warn_no_nvls, by_nodes=()),
                f" for {_nodes(row.nodes)}", caveat)

    def floors(self, nvls: bool | None) -> Check:
        """The check with the floors for NVLS in use (True), or not or unknown: where unknown
        it is judged by the figure without, so no healthy node fails for want of evidence."""
        if nvls or (self.fail_no_nvls is None and self.warn_no_nvls is None):
            return self
        return replace(self, fail=self.fail_no_nvls, warn=self.warn_no_nvls)

    @property
    def higher_is_better(self) -> bool:
        return METRICS[self.metric]["higher_is_better"]

    def fraction(self, value: float, reference: float) -> float:
        """How well `value` does against `reference` (the healthy peers' value, or a baseline
        run's), as a fraction where 1 is as good and below 1 is worse, whatever the metric's
        direction: a latency twice the peers' is 0.5. A peers check's fail and warn are such
        fractions."""
        if self.higher_is_better:
            return value / reference if reference > 0 else math.inf
        return reference / value if value > 0 else math.inf

    def grade(self, value: float, reference: float | None = None) -> str:
        """One of "fail", "warn" or "ok". `reference`: what the healthy peers reach, for a
        peers check (an absolute one ignores it)."""
        if self.vs == "peers":
            if reference is None:
                raise ValueError(f"check {self.name!r} is judged against its peers: "
                                 "give their value")
            value, better = self.fraction(value, reference), True
        else:
            better = self.higher_is_better
        for grade, floor in (("fail", self.fail), ("warn", self.warn)):
            if floor is not None and (value < floor if better else value > floor):
                return grade
        return "ok"


@dataclass(frozen=True)
class NodeFacts:
    """What is known of one node before anything is measured: --profile auto picks by it, and
    the verdicts judge by it (accept_profile.agree sends it to every rank with the profile)."""

    name: str  # as reports name the node (runtime.node_names)
    # (model, count), sorted: the GPUs of the models its ranks run on, as many as NVML lists
    # (it also sees those hidden from the run) or, where NVML lists fewer, as its ranks use;
    # without ranks to go by (profiles.pick_for_nodes on snapshots alone), NVML's list
    gpus: tuple[tuple[str, int], ...]
    # the counts are NVML's; False: NVML did not list them, so they are the ranks' (at least)
    counted: bool = True
    nvml_error: str | None = None
    nvls: bool | None = None  # whether NCCL can use NVLink SHARP there (topo's snapshot)
    nvls_why: str = "unknown"

    @property
    def count(self) -> int:
        return sum(n for _, n in self.gpus)


@dataclass(frozen=True)
class Profile:
    """One class of hardware and the checks its nodes must pass."""

    name: str  # what --profile takes; a built-in's is its file name without .toml
    description: str  # one line: the hardware, and any assumption the figures rest on
    path: Path  # the file it was read from
    match_gpu: str | None  # substring of the NVML GPU name (any case); None: no GPU or generic
    gpus_per_node: int | None  # None: any count; 0: nodes without a GPU
    iters: int  # timed iterations of every check, the same on every run so runs compare
    warmup: int  # untimed iterations before each check
    baseline_tolerance: float  # 0.05: a check worse than -5% against a --baseline run fails
    checks: tuple[Check, ...]  # in the file's order, names unique
    # substrings of the NVML name that rule a GPU out although match_gpu is in it: "H200" is
    # also in "NVIDIA H200 NVL" (PCIe cards) and "NVIDIA GH200 480GB"
    match_exclude: tuple[str, ...] = ()
    # the nodes it runs on, by node index, once accept_profile.agree has learnt them; () when
    # only read from a file
    nodes: tuple[NodeFacts, ...] = ()

    def matches(self, gpu_name: str, count: int) -> bool:
        """Whether nodes of `count` GPUs named `gpu_name` are this profile's hardware."""
        name = gpu_name.lower()
        return (self.match_gpu is not None and self.match_gpu.lower() in name
                and not any(x.lower() in name for x in self.match_exclude)
                and self.gpus_per_node in (None, count))


# ---------------------------------------------------------------------------------------------
# Where the built-in profiles are

def _checkout_dir() -> Path | None:
    """configs/profiles of the repository this module runs from (a checkout, or an editable
    install of one); None when installed from a wheel. pyproject.toml beside it tells a
    repository from a site-packages that happens to hold a configs/ folder."""
    root = Path(__file__).resolve().parents[2]
    found = root / "configs" / "profiles"
    return found if (root / "pyproject.toml").is_file() and found.is_dir() else None


def profile_dirs() -> list[Path]:
    """Where the built-in profiles are, first found first: the repository's configs/profiles
    when running from a checkout, then the copy a wheel installs (pyproject.toml's data-files:
    share/distbench/profiles under the environment's prefix, or under the user base after
    `pip install --user`)."""
    candidates = [_checkout_dir()]
    for base in (sys.prefix, site.getuserbase()):
        candidates.append(Path(base) / "share" / "distbench" / "profiles")
    out: list[Path] = []
    for d in candidates:
        if d is not None and d.is_dir() and d.resolve() not in {o.resolve() for o in out}:
            out.append(d)
    return out


def _builtin_paths() -> dict[str, Path]:
    """Built-in profile name -> its file; a name in two folders is the first folder's."""
    found: dict[str, Path] = {}
    for d in profile_dirs():
        for path in sorted(d.glob("*.toml")):
            found.setdefault(path.stem, path)
    return found


def available() -> list[str]:
    return sorted(_builtin_paths())


def _shown(path: Path) -> str:
    """A path as messages show it: relative to the current directory when it is under it."""
    try:
        return str(Path(os.path.abspath(path)).relative_to(Path.cwd()))
    except (ValueError, OSError):  # elsewhere, or the current directory is gone
        return str(path)


def _nodes(count: int) -> str:
    return f"{count} node" if count == 1 else f"{count} nodes"


# ---------------------------------------------------------------------------------------------
# Reading and validating one file

class _Reader:
    """Validates one profile's values, each error naming the file and the key."""

    def __init__(self, path: Path):
        self.path = path

    def error(self, where: str, message: str) -> ProfileError:
        return ProfileError(f"{_shown(self.path)}: {where}: {message}")

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


def load(path: Path) -> Profile:
    """Read and validate a profile file; raises ProfileError naming the file and the key."""
    path = Path(path)
    try:
        return parse(path.read_text(encoding="utf-8"), path)
    except FileNotFoundError:
        raise ProfileError(f"no such file {_shown(path)!r}") from None
    except IsADirectoryError:
        raise ProfileError(f"{_shown(path)!r} is a directory, not a profile file") from None
    except OSError as e:
        raise ProfileError(f"cannot read {_shown(path)!r}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ProfileError(f"{_shown(path)}: not UTF-8 text") from None


def parse(text: str, path: Path) -> Profile:
    """Validate a profile's text, read from `path` (here or on the node that sent it: what
    messages name); raises ProfileError naming the file and the key."""
    r = _Reader(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ProfileError(f"{_shown(path)}: not valid TOML: {e}") from None
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
    checks: list[Check] = []
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
    shown = _shown(r.path)
    if not data:
        raise ProfileError(f"{shown}: empty (no TOML key), not a profile: a profile has name, "
                           "description, [settings] and [[check]] tables (docs/accept.md)")
    if not any(k in data for k in _TOP_KEYS):
        raise ProfileError(f"{shown}: not a profile: none of its keys "
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


def _check(r: _Reader, raw: dict, index: int) -> Check:
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
        return Check(name=name, scope=scope, command=command, op=op, dtype=dtype, size=size,
                     metric=metric, vs=vs, fail=None, warn=None, by_nodes=by_nodes)
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
    return Check(name=name, scope=scope, command=command, op=op, dtype=dtype, size=size,
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


def smallest_size(check: Check, ranks: int) -> int:
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


# ---------------------------------------------------------------------------------------------
# Choosing a profile

def resolve(spec: str) -> Profile | None:
    """--profile's value: "auto" -> None (pick_for_nodes() decides once the topology is known);
    a file that exists -> that file; a built-in's name -> the built-in. Raises ProfileError."""
    text = str(spec).strip()
    if text.lower() == AUTO:
        return None
    if not text:
        raise ProfileError("empty value (give auto, a built-in profile's name or a TOML file)")
    path = Path(text)
    builtin = _builtin_paths()
    if path.is_file():
        return _own(load(path), builtin)
    if text in builtin:
        return load(builtin[text])
    kind = _not_a_file(path)
    if kind is not None:
        raise ProfileError(f"{text!r} is {kind}, not a profile file")
    if path.suffix == ".toml" or os.sep in text or "/" in text:
        raise ProfileError(f"no such file {text!r}")
    names = ", ".join(builtin) or "none found"
    raise ProfileError(f"unknown profile {text!r} (available: {names}; or auto, or a TOML "
                       f"file)")


def _not_a_file(path: Path) -> str | None:
    """What is at `path` when it is there but no regular file (/dev/null, a folder, a pipe):
    "no such file" would send the operator looking for a file that is there."""
    try:
        mode = path.lstat().st_mode
    except OSError:
        return None
    if stat.S_ISLNK(mode):
        return "a broken symbolic link" if not path.exists() else _not_a_file(path.resolve())
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a named pipe"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return None if stat.S_ISREG(mode) else "not a regular file"


def _own(profile: Profile, builtin: dict[str, Path]) -> Profile:
    """A profile file of the user's, refused where its name is a built-in's (or auto): the
    verdict line, accept.json and accept.md name a profile by its name, and would present this
    file's checks and floors as the built-in's."""
    name = profile.name.lower()
    if name == AUTO:
        raise ProfileError(f"{_shown(profile.path)}: key 'name': {profile.name!r} is what "
                           "--profile auto means: give this profile a name of its own")
    taken = next((b for b in builtin if b.lower() == name), None)
    if taken is None or _is_builtin_file(profile.path, taken):
        return profile
    raise ProfileError(f"{_shown(profile.path)}: key 'name': {profile.name!r} is the name of "
                       f"a built-in profile ({_shown(builtin[taken])}), and reports would take "
                       f"this file for it: give it a name of its own (such as "
                       f"\"{profile.name}-site\")")


def _is_builtin_file(path: Path, name: str) -> bool:
    """`path` is the built-in `name` itself, in any of the folders built-ins are read from."""
    real = path.resolve()
    return any((d / f"{name}.toml").resolve() == real for d in profile_dirs())


def _gpu_name(gpu: dict) -> str:
    name = gpu.get("name")
    return str(name).strip() if name else "unknown GPU"


def node_facts(snapshots: list[dict], ranks: list[dict] | None = None
               ) -> tuple[NodeFacts, ...]:
    """Each node's facts, by node index: the GPUs its ranks run on (rt.ranks: host, node and
    torch's device name), counted by NVML in its host's topo snapshot. Without ranks, one node
    per snapshot, on NVML's word alone."""
    if not ranks:
        return tuple(_facts(str(s.get("host") or "?"), s, []) for s in snapshots)
    by_host = {str(s.get("host")): s for s in snapshots}
    on: dict[int, list[dict]] = {}
    for r in ranks:
        on.setdefault(r["node"], []).append(r)
    hosts = {i: str(rs[0]["host"]) for i, rs in on.items()}
    # several launcher agents on one host share its snapshot: host#index, as runtime.node_names
    repeated = len(set(hosts.values())) < len(hosts)
    return tuple(_facts(f"{hosts[i]}#{i}" if repeated else hosts[i], by_host.get(hosts[i]), on[i])
                 for i in sorted(on))


def _facts(name: str, snap: dict | None, ranks: list[dict]) -> NodeFacts:
    listed = Counter(_gpu_name(g) for g in (snap or {}).get("gpus") or [])
    used = Counter(str(r["device"]) for r in ranks if r.get("device") not in (None, "cpu"))
    # NVML can fail (driver mismatch, no libnvidia-ml in a container) while the ranks run on
    # their GPUs: those name the model, and count at least as many as NVML lists
    gpus = {m: max(listed[m], n) for m, n in used.items()} if used else dict(listed)
    return NodeFacts(name, tuple(sorted(gpus.items())),
                     counted=all(listed[m] >= n for m, n in used.items()),
                     nvml_error=(snap.get("nvml_error") if snap is not None
                                 else "no topology snapshot from this node"),
                     nvls=(snap or {}).get("nvls"),
                     nvls_why=(snap or {}).get("nvls_why") or "unknown")


def _describe(hardware: tuple[tuple[str, int], ...]) -> str:
    if not hardware:
        return "no GPU"
    return ", ".join(f"{count} x {name}" for name, count in hardware)


def _listed(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _generic(why: str) -> tuple[Profile, str]:
    return (_builtin(GENERIC_PROFILE),
            f"{why}: {GENERIC_PROFILE} (judges nodes against their peers, no absolute figures)")


def _builtin(name: str) -> Profile:
    path = _builtin_paths().get(name)
    if path is None:
        raise ProfileError(f"built-in profile {name!r} not found in "
                           f"{', '.join(map(str, profile_dirs())) or 'any profile folder'}")
    return load(path)


def pick_for_nodes(snapshots: list[dict], ranks: list[dict] | None = None,
                   backend: str | None = None) -> tuple[Profile, str]:
    """--profile auto: the built-in profile for the GPUs the ranks run on and how many each
    node has (node_facts), and one line saying why; the nodes' facts come with it. Backend
    nccl never gets cpu-gloo, whose millisecond floors any GPU passes."""
    if not snapshots and not ranks:
        raise ProfileError("auto: no node's topology snapshot to pick a profile from",
                           EXAMPLE)
    nodes = node_facts(snapshots, ranks)
    profile, why = _choose(nodes, bool(ranks) and all(
        r.get("device") in (None, "cpu") for r in ranks), backend)
    return replace(profile, nodes=nodes), why


def _choose(nodes: tuple[NodeFacts, ...], on_cpu: bool, backend: str | None
            ) -> tuple[Profile, str]:
    every = "every node has" if len(nodes) > 1 else "the node has"
    errors = [n.nvml_error for n in nodes if n.nvml_error]
    if on_cpu and backend != "nccl":
        seen = [n for n in nodes if n.gpus]
        if seen:  # gloo on GPU nodes measures the CPU: the GPU floors would fail it
            return _builtin(CPU_PROFILE), (
                f"the ranks run on the CPU (backend {backend}; NVML sees "
                f"{_describe(seen[0].gpus)} on {_listed([n.name for n in seen])}; --backend "
                f"nccl measures them): {CPU_PROFILE}")
    models = {tuple(m for m, _ in n.gpus) for n in nodes}
    if len(models) > 1:
        groups: dict[tuple, list[str]] = {}
        for n in nodes:
            groups.setdefault(n.gpus, []).append(n.name)
        parts = [f"{_describe(hardware)} on {_listed(names)}" for hardware, names in
                 sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1]))]
        return _generic(f"nodes differ ({'; '.join(parts)})")

    (model,) = models
    nvml = f" (NVML: {errors[0]})" if errors else ""
    if not model:
        if backend == "nccl":
            return _generic(f"the ranks report no GPU under nccl{nvml}")
        reason = "no node has a GPU" if len(nodes) > 1 else "the node has no GPU"
        return _builtin(CPU_PROFILE), f"{reason}{nvml}: {CPU_PROFILE}"
    if len(model) > 1:
        return _generic(f"{every} {_describe(nodes[0].gpus)}: more than one GPU model in a "
                        "node")

    gpu, count = model[0], max(n.count for n in nodes)
    # a node short of GPUs is no other kind of node: the others' profile, which names it
    short = [f"{n.name} has {n.count}" for n in nodes if n.count < count]
    have = (f"the nodes have {count} x {gpu}, but {_listed(short)}" if short
            else f"{every} {count} x {gpu}")
    counted = all(n.counted for n in nodes)
    if not counted:
        err = next((n.nvml_error for n in nodes if not n.counted and n.nvml_error), None)
        have += f" (counted from its ranks; NVML: {err})" if err else \
            " (counted from its ranks: NVML lists fewer)"
    profiles = [load(p) for n, p in _builtin_paths().items()
                if n not in (CPU_PROFILE, GENERIC_PROFILE)]
    # counted from the ranks, a node has at least that many: a profile for more may fit
    fits = [p for p in profiles
            if p.matches(gpu, count if counted else max(count, p.gpus_per_node or 0))]
    if fits:
        # the most specific: a fixed GPU count, then the longest name matched
        best = max(fits, key=lambda p: (p.gpus_per_node is not None, len(p.match_gpu or ""),
                                        p.name))
        return best, f"{have}: {best.name}"
    model_only = [p for p in profiles if p.matches(gpu, p.gpus_per_node or count)]
    if model_only:
        wants = ", ".join(f"{p.name} is for {p.gpus_per_node} per node" for p in model_only)
        return _generic(f"{have} ({wants})")
    return _generic(f"{have}, which no profile matches")
