"""watch's --baseline: what an earlier run measured of each probe, and how noisy it was.

- A **watch run** (watch.jsonl): each probe's median time over the cycles it measured there, and
  how far its cycles ranged (the 90th percentile over the 10th, less 1) as its noise.
- An **accept run** (accept.json; accept.csv holds the same rows): for each probe, the time of
  the collective check that measured the same op, size and dtype on every rank of that run (a
  cluster check, or a node check of a one-node run), and the check's spread as its noise. A
  row that failed, held wrong data, or was a retest is no time to expect, as for accept itself.

Either is keyed by what it measured: op, per-rank size, dtype and world size. A probe measured
in another dtype, or on another number of ranks, has no time to compare, and is refused rather
than read as a slowdown (a 4-rank all_reduce against a 2-rank one reads 7x slower, all healthy).
Torch-free, so it is read while the options are checked, before any worker starts: every
problem is an OptionError, one line."""

from __future__ import annotations

import functools
import json
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from distbench.core.options import OptionError
from distbench.core.sizes import format_size
from distbench.kinds.watch.records import SCHEMA_VERSION, Probe

JSONL = "watch.jsonl"
ACCEPT = "accept.json"
RUN_JSON = "run.json"
EXAMPLE = "--baseline results/<an earlier watch or accept run>"


@dataclass(frozen=True)
class BaselineEntry:
    """One measurement of a baseline: a watch run's probe over all its cycles, or one row of an
    accept run."""

    op: str
    size_bytes: int
    scope: str  # watch: the probe's; accept: the check's (cluster, node or pair)
    dtype: str | None  # None: the baseline does not say
    ranks: int | None  # the ranks it ran on; None: the baseline does not say
    time_us: float
    noise: float | None

    def label(self) -> str:
        return f"{self.op} {format_size(self.size_bytes)}"


@dataclass(frozen=True)
class BaselineRun:
    path: Path
    kind: str  # "watch" or "accept"
    measured: tuple[BaselineEntry, ...]

    def candidates(self, probe: Probe) -> list[BaselineEntry]:
        return [m for m in self.measured
                if m.op == probe.op and m.size_bytes == probe.size_bytes]

    def labels(self) -> str:
        seen = list(dict.fromkeys(m.label() for m in self.measured))
        return ", ".join(seen[:4]) + (f" and {len(seen) - 4} more" if len(seen) > 4 else "")

    def worlds(self) -> list[int]:
        return sorted({m.ranks for m in self.measured if m.ranks is not None})


@dataclass(frozen=True)
class Match:
    """How a baseline serves each probe of a watch: `times` by Probe.key for those it measured
    (the Tracker's baseline), `missing` the probes it never measured at their op and size,
    `other_world` those it measured only on another number of ranks."""

    times: dict[str, tuple[float, float | None]]
    missing: list[Probe]
    other_world: list[Probe]


def read_baseline(run_dir: str | Path, probes: Iterable[Probe] | None = None,
                  world: int | None = None) -> dict[str, tuple[float, float | None]]:
    """Probe.key -> (time_us, noise) for judge.Tracker. With `probes` (and the `world` they run
    on), only theirs: a baseline that measured more serves the probes it has. Without, every
    probe a watch run measured, or every cluster check of an accept run. OptionError (one line)
    when the directory is no usable baseline; a dtype or world size that differs is refused by
    check(), which the options run before any worker starts."""
    base = load(run_dir)
    if probes is None:
        probes = [Probe(m.op, m.size_bytes, m.scope, m.dtype or "float32")
                  for m in base.measured if m.scope == "cluster"]
        probes = list({p.key: p for p in probes}.values())
    return match(base, list(probes), world).times


def match(base: BaselineRun, probes: list[Probe], world: int | None) -> Match:
    """Which of `probes` the baseline measured at the same op, size and dtype, on `world` ranks
    (None: any). Of several, the cluster-scope ones first (the same measurement a cycle makes);
    their median time, and the largest noise as the one to see beyond."""
    times: dict[str, tuple[float, float | None]] = {}
    missing, other_world = [], []
    for probe in probes:
        same = [m for m in base.candidates(probe) if m.dtype in (None, probe.dtype)]
        if not same:
            missing.append(probe)
            continue
        here = [m for m in same if world is None or m.ranks in (None, world)]
        if not here:
            other_world.append(probe)
            continue
        chosen = [m for m in here if m.scope == "cluster"] or here
        noises = [m.noise for m in chosen if m.noise is not None]
        times[probe.key] = (statistics.median(m.time_us for m in chosen),
                            max(noises) if noises else None)
    return Match(times, missing, other_world)


def check(run_dir: str | Path, probes: list[Probe], world: int | None,
          once: bool) -> list[str]:
    """Refuses (OptionError) a baseline this watch cannot be judged against: unreadable, in
    another dtype, on another number of ranks, sharing no probe with it, or, with --once,
    lacking one of its probes (one cycle cannot learn a baseline of its own). The probes it lacks
    otherwise: one warning line each, returned (they learn theirs from their first cycles)."""
    base = load(run_dir)
    shown = repr(str(run_dir))
    for probe in probes:
        found = base.candidates(probe)
        dtypes = sorted({m.dtype for m in found if m.dtype is not None})
        if found and probe.dtype not in dtypes and all(m.dtype is not None for m in found):
            raise OptionError("--baseline", f"{shown} measured {found[0].label()} in "
                              f"{', '.join(dtypes)}, this run probes {probe.dtype}: the times "
                              f"do not compare (--dtype {dtypes[0]})", EXAMPLE)
    got = match(base, probes, world)
    if not got.times:
        if got.other_world:
            worlds = sorted({m.ranks for p in got.other_world for m in base.candidates(p)
                             if m.ranks is not None})
            raise OptionError("--baseline", f"{shown} was measured on "
                              f"{' or '.join(map(str, worlds))} ranks, this run has {world}: "
                              "the times do not compare (run on as many ranks, or make a "
                              "baseline on these)", EXAMPLE)
        raise OptionError("--baseline", f"{shown} measured {base.labels()}; this run probes "
                          f"{_labels(probes)}: no probe in common (probe what it measured, or "
                          "make a baseline of these)", EXAMPLE)
    lacking = got.missing + got.other_world
    if once and lacking:
        ranks = f" on {world} ranks" if got.other_world else ""
        raise OptionError("--once", f"judges one cycle against --baseline, and {shown} has no "
                          f"time for {_labels(lacking)}{ranks}: probe what it measured "
                          f"({base.labels()})", "--once --baseline results/<run>")
    return [f"--baseline {shown} has no time for {_labels([p])}"
            + (f" on {world} ranks" if p in got.other_world else "")
            + ": it learns its baseline from its first --warm cycles" for p in lacking]


def _labels(probes: list[Probe]) -> str:
    return ", ".join(f"{p.op} {format_size(p.size_bytes)}" for p in probes)


def load(run_dir: str | Path) -> BaselineRun:
    """The baseline in `run_dir`: a watch run's watch.jsonl, else an accept run's accept.json.
    Read once per process while the files stay as they were: the options check it, then each
    check_world (flags, the local launcher, the session) and the loop ask again."""
    if not str(run_dir).strip():  # Path("") is ".": the directory watch was started in
        raise OptionError("--baseline", "must name a run directory, got an empty path", EXAMPLE)
    path = Path(run_dir)
    if not path.is_dir():
        raise OptionError("--baseline", f"no directory {str(run_dir)!r}", EXAMPLE)
    for name in (JSONL, ACCEPT):
        if (path / name).exists():
            if not (path / name).is_file():  # a FIFO would hang the read, a directory fail it
                raise OptionError("--baseline", f"{path / name} is not a regular file", EXAMPLE)
            return _load(path, name, _stamp(path / name), _stamp(path / RUN_JSON))
    raise OptionError("--baseline", f"no {JSONL} or {ACCEPT} in {str(run_dir)!r}: neither a "
                      "watch run nor an accept run", EXAMPLE)


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


@functools.lru_cache(maxsize=8)
def _load(path: Path, name: str, stamp, run_stamp) -> BaselineRun:
    if name == JSONL:
        return BaselineRun(path, "watch", tuple(_read_watch(path / JSONL, _run_json(path))))
    return BaselineRun(path, "accept", tuple(_read_accept(path / ACCEPT)))


def _run_json(run_dir: Path) -> dict:
    """The run's world size and options, where its run.json says them: a watch line says its
    world through each probe's rank times, and its dtype itself since schema 1, so a missing
    run.json only leaves less known. One that is there says what the run was: a corrupt one,
    or one of another command, makes the directory no watch run to trust."""
    path = run_dir / RUN_JSON
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise _bad(path, "unreadable", f"{type(e).__name__}: not the run.json of a watch run") \
            from None
    if not isinstance(data, dict):
        raise _bad(path, "not an object", "not the run.json of a watch run")
    if data.get("command", "watch") != "watch":
        raise _bad(path, "command", f"a {data['command']!r} run's, not a watch run's")
    return data


def _bad(path: Path, where: str, message: str) -> OptionError:
    return OptionError("--baseline", f"{path}: {where}: {message}", EXAMPLE)


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _time_ok(value) -> bool:
    # Python's json reads NaN and Infinity, and a NaN baseline passes every comparison
    return _number(value) and math.isfinite(value) and value > 0


def _read_watch(path: Path, run: dict) -> list[BaselineEntry]:
    world = run.get("world_size")
    world = world if isinstance(world, int) and not isinstance(world, bool) and world > 0 \
        else None
    options = run.get("options") if isinstance(run.get("options"), dict) else {}
    run_dtype = options.get("dtype") if isinstance(options.get("dtype"), str) else None
    times: dict[tuple, list[float]] = {}
    torn = False
    try:
        with path.open("rb") as f:
            for number, raw in enumerate(f, 1):
                try:
                    text = raw.decode("utf-8")
                    if not text.strip():
                        continue
                    cycle = json.loads(text)
                except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
                    if not raw.endswith(b"\n"):
                        # the last line, cut short: a watch killed while it wrote it
                        torn = True
                        continue
                    what = "not UTF-8 text (a binary file?)" if isinstance(
                        e, UnicodeDecodeError) else f"not JSON ({e})"
                    raise _bad(path, f"line {number}", f"{what}: not a watch cycle") from None
                for key, t in _cycle(path, number, cycle, run_dtype, world):
                    times.setdefault(key, []).append(t)
    except OSError as e:
        raise OptionError("--baseline", f"cannot read {path}: {e.strerror}", EXAMPLE) from None
    if not times:
        why = " (its last line, cut short, was skipped)" if torn else ""
        raise OptionError("--baseline", f"{path} measured nothing{why}", EXAMPLE)
    return [BaselineEntry(op, size, scope, dtype, ranks, statistics.median(t), _noise(t))
            for (op, size, scope, dtype, ranks), t in times.items()]


def _cycle(path: Path, number: int, cycle, run_dtype: str | None, world: int | None):
    """(key, time) of each probe a watch line measured."""
    where = f"line {number}"
    if not isinstance(cycle, dict) or not isinstance(cycle.get("probes"), list):
        raise _bad(path, where, "not a watch cycle (an object with a list of probes)")
    if cycle.get("schema_version", SCHEMA_VERSION) != SCHEMA_VERSION:
        raise _bad(path, where, f"schema_version {json.dumps(cycle['schema_version'])}: this "
                   f"distbench reads watch lines of version {SCHEMA_VERSION}")
    for i, p in enumerate(cycle["probes"]):
        at = f"{where} probe {i}"
        if not isinstance(p, dict):
            raise _bad(path, at, f"not a probe (an object), got {json.dumps(p)}")
        for key, test, want in (("op", lambda v: isinstance(v, str) and v, "an op's name"),
                                ("size_bytes", lambda v: isinstance(v, int) and not
                                 isinstance(v, bool) and v > 0, "a byte count above 0"),
                                ("scope", lambda v: isinstance(v, str) and v, "a scope")):
            if not test(p.get(key)):
                raise _bad(path, at, f"{key} must be {want}, got {json.dumps(p.get(key))}")
        if p.get("status") != "ok":
            continue  # failed or skipped there: no time to expect
        if not _time_ok(p.get("time_us")):
            raise _bad(path, at, f"time_us must be a finite number above 0, got "
                       f"{json.dumps(p.get('time_us'))}")
        dtype = p.get("dtype") if isinstance(p.get("dtype"), str) else run_dtype
        ranks = p.get("rank_time_us")
        ranks = len(ranks) if isinstance(ranks, list) and ranks else world
        if world is not None and ranks != world:
            raise _bad(path, at, f"{ranks} rank times, where run.json says {world} ranks")
        yield (p["op"], p["size_bytes"], p["scope"], dtype, ranks), float(p["time_us"])


def _noise(times: list[float]) -> float | None:
    if len(times) < 2:
        return None
    q = statistics.quantiles(times, n=10, method="inclusive")
    return q[-1] / q[0] - 1 if q[0] > 0 else None


def _read_accept(path: Path) -> list[BaselineEntry]:
    """The collective rows of accept's first pass that measured every rank of that run, whole
    and not failed (docs/results.md: accept.json)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise OptionError("--baseline", f"cannot read {path}: {e.strerror}", EXAMPLE) from None
    except ValueError as e:
        raise _bad(path, "not JSON", str(e)) from None
    if not isinstance(data, dict) or not isinstance(data.get("verdicts"), list):
        raise _bad(path, "not an accept.json", "an object with a list of verdicts")
    world = data.get("world_size")
    out = []
    for i, v in enumerate(data["verdicts"]):
        at = f"verdicts[{i}]"
        if not isinstance(v, dict):
            raise _bad(path, at, f"not a verdict row (an object), got {json.dumps(v)}")
        missing = [k for k in ("check", "command", "op", "time_us", "verdict") if k not in v]
        if missing:
            raise _bad(path, at, f"no key {missing[0]!r}: not a verdict row")
        for key, strict in (("time_us", True), ("spread", False)):
            value = v.get(key)
            if value is not None and not (_number(value) and math.isfinite(value)
                                          and (value > 0 if strict else value >= 0)):
                raise _bad(path, f"{at} (check {v.get('check')!r}) key {key!r}",
                           f"must be a finite number {'above' if strict else 'at least'} 0, "
                           f"got {json.dumps(value)}")
        size, ranks = v.get("size_bytes"), v.get("ranks")
        if v["command"] != "collective" or v["time_us"] is None or v.get("retest") \
                or v.get("wrong") or v["verdict"] == "FAIL" or not isinstance(size, int) \
                or not isinstance(ranks, int) or not isinstance(v["op"], str):
            continue
        if isinstance(world, int) and ranks != world:
            continue  # a node or pair check on part of the ranks: no cluster probe's time
        dtype = v.get("dtype") if isinstance(v.get("dtype"), str) else None
        out.append(BaselineEntry(v["op"], size, str(v.get("scope", "cluster")), dtype, ranks,
                            float(v["time_us"]),
                            None if v.get("spread") is None else float(v["spread"])))
    if not out:
        raise OptionError("--baseline", f"{path} holds no collective check measured on every "
                          "rank of that run, whole and not failed: nothing a watch probe "
                          "measures", EXAMPLE)
    return out
