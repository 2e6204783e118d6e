"""Reading NVIDIA nccl-tests results as distbench collective.csv rows, so that report and compare
can put an nccl-tests run beside a distbench one.

`read(path)` takes an nccl-tests log or the JSON file nccl-tests writes with `-J`, and returns
one row per size and placement, keyed exactly like collective.csv.

The text table is read in every layout nccl-tests has printed (the column formats are those of
NVIDIA/nccl-tests src/common.cu and, since the JSON writer, src/util.cu):

- the early per-collective headers (`size count type [redop] [root] time algbw busbw error
  ...`: each binary printed only the columns it used, an `error` column of maximum deltas,
  and alltoall an empty redop);
- the one header common.cu later printed for all (`size count type redop root time algbw
  busbw #wrong ...`: redop "none" and root -1 where the collective has none, #wrong "N/A"
  without a check);
- the current one (util.cu), which adds `# nccl-tests version`, `# Collective test starting:
  <binary>`, and optionally per-iteration columns (-I 1: i_min i_max i_p99 i_cv%), CPU time
  (-C 1: a `cputime` column) and a timestamp.

Lines may carry the prefix of `mpirun --tag-output` (`[1,0]<stdout>:`) or `srun --label`
(`0: `); the rows come from rank 0's lines (any untagged lines are read too), so a table
printed by several ranks is read once. A log may hold several runs, mixed with any other
output. The collective of a run is the binary its header names, else the last `*_perf` binary
named before its table (a command line echoed into the log), else the file name.

What the rows hold, beyond what collective.csv means:

- `op`: distbench's name (alltoall -> all_to_all). sendrecv_perf and hypercube_perf have no
  distbench collective; their rows keep nccl-tests' name ("sendrecv", "hypercube") rather than
  being dropped, and a comparison finds no distbench partner for them.
- `count`: size_bytes / element size, as distbench counts (nccl-tests prints the per-rank
  count for all_gather, reduce_scatter, alltoall, gather and scatter).
- `iters`: the collectives the mean time is over: iters x agg iters x graph launches.
- `wrong`: nccl-tests' #wrong; None for "N/A" (no -c) and for the old `error` column, which is
  a maximum delta, not a count (a non-zero one goes in the note).
- `p50_us`, `p99_us`, `cv_pct`: only from a per-iteration report (-I 1; the table has no p50);
  `rank_min_us`, `rank_max_us`, `slowest_rank`, `launch_bound`: always None.
- `world_size`, `nnodes`: from the "Using devices" list, None where the log has none.

No torch here: report and compare never start a worker.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from distbench.core.contracts import COLLECTIVE
from distbench.core.dtypes import ELEMENT_BYTES
from distbench.core.errors import ReadError
from distbench.ops.collectives import OPS

COLUMNS = COLLECTIVE.csv

# An nccl-tests binary, less its "_perf", as distbench names the collective. File names get
# the spellings people use too.
TESTS = {
    "all_reduce": "all_reduce", "allreduce": "all_reduce",
    "all_gather": "all_gather", "allgather": "all_gather",
    "reduce_scatter": "reduce_scatter", "reducescatter": "reduce_scatter",
    "broadcast": "broadcast", "bcast": "broadcast",
    "reduce": "reduce",
    "alltoall": "all_to_all", "all_to_all": "all_to_all",
    "gather": "gather",
    "scatter": "scatter",
    "sendrecv": "sendrecv",
    "hypercube": "hypercube",
}
BINARIES = tuple(f"{name}_perf" for name in (
    "all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "alltoall", "gather",
    "scatter", "sendrecv", "hypercube"))

# nccl-tests' type names (test_typenames; "char" and "int" from NCCL 1) as distbench names them;
# any other (uint32, uint64, f8e4m3, ...) is kept as printed.
DTYPES = {
    "float": "float32", "half": "float16", "bfloat16": "bfloat16", "double": "float64",
    "int8": "int8", "char": "int8", "uint8": "uint8", "int32": "int32", "int": "int32",
    "int64": "int64",
}

EXPECTED = "an nccl-tests log or the JSON file nccl-tests writes with -J"
NO_TABLE = ("no nccl-tests result table (expected lines like '#  size  count  type  redop  "
            "root  time  algbw  busbw  #wrong ...')")
NO_OP = ("cannot tell which collective (no '# Collective test starting:' header, no *_perf "
         "command line before the table, and the file name names none)")

_PREFIX = re.compile(r"^(?:\[[^\]]*?,(?P<tag>\d+)\]<std(?:out|err|diag)>:\s?"
                     r"|\s*(?P<label>\d+): )")
_VERSION = re.compile(r"^#\s*nccl-tests version\b")
_STARTING = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
_CONCLUDED = re.compile(r"^#\s*(?:Collective test concluded:|Out of bounds values|"
                        r"Avg bus bandwidth)")
_NTHREAD = re.compile(r"^#\s*nThread\s+\d+\s+nGpus\s+\d+")
# The nThread line's settings: "step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 ...".
_SETTING = re.compile(r"([a-z]+(?: iters)?):\s*(\d+)")
_DEVICE = re.compile(r"^#\s+Rank\s+(\d+)(?:\s+Group\s+(\d+))?\s+Pid\s+\d+\s+on\s+(\S+)\s+"
                     r"device\s+\d+(?:\s+\[[^\]]*\])?\s*(?P<name>.*)")
_HEADER = re.compile(r"^#\s+size\s+count\s+type\s")
_DATA = re.compile(r"^\s*\d+\s+\d+\s+[A-Za-z]\w*\s")
_PERF = re.compile(r"([A-Za-z0-9_]+?)_perf(?![A-Za-z0-9])")
# util.cu prints a double with "%lf", which writes an infinity as bare inf, not JSON.
_BARE_INF = re.compile(r"(?<=[:,\[])\s*-?inf(?=\s*[,}\]])")
_TIME_COLUMNS = ("time", "cputime")


@dataclass
class _Placement:
    in_place: int
    time: object  # as printed (text) or written (JSON); checked when the row is made
    algbw: object
    busbw: object
    wrong: int | None = None
    p50: object = None
    p99: object = None
    cv: object = None
    notes: list[str] = field(default_factory=list)


@dataclass
class _Result:
    size: int
    count: int
    dtype: str
    redop: str | None
    root: int | None
    placements: list[_Placement]


@dataclass(frozen=True)
class _Layout:
    idents: tuple[str, ...]  # the columns between type and time: redop, root, either or none
    group: tuple[str, ...]  # one placement's columns, from time on
    placements: int


@dataclass
class _Test:
    """One run of one nccl-tests binary."""
    program: str | None = None  # the binary its header names
    mention: str | None = None  # the collective of a *_perf named before its table
    iters: int | None = None
    ranks: dict[int, tuple[int, str]] = field(default_factory=dict)  # rank -> (group, host)
    names: dict[int, str] = field(default_factory=dict)  # rank -> its device's name
    world_size: int | None = None
    nnodes: int | None = None
    layout: _Layout | None = None
    table_open: bool = False
    notes: list[str] = field(default_factory=list)
    results: list[_Result] = field(default_factory=list)

    def begun(self) -> bool:
        return bool(self.program or self.iters or self.ranks or self.layout)


def read(path: Path) -> list[dict]:
    """The rows of an nccl-tests log or -J JSON file, keyed like collective.csv (missing
    values None), run by run as printed (the runs in untagged lines before rank 0's). Raises
    ReadError, naming the file and what was expected, for anything that is not one."""
    return read_log(path)[0]


@dataclass(frozen=True)
class Rank:
    """One rank of a run's "Using devices" list: its host and its device's name ("" where the
    log names none, as the -J file does)."""
    rank: int
    host: str
    device: str = ""


def read_log(path: Path) -> tuple[list[dict], list[Rank]]:
    """`read`'s rows, and the ranks of the first run that lists its devices (none where no run
    does): the hosts tell the nodes, the names the GPU (planner.sources reads both)."""
    path = Path(path)
    text = _load(path)
    if text.lstrip().startswith("{"):
        tests = [_json_test(path, text)]
    else:
        tests = _text_tests(path, text)
    rows = []
    for test in tests:
        rows.extend(_rows(test, _op(path, test)))
    listed = next((t for t in tests if t.ranks), None)
    ranks = [] if listed is None else [
        Rank(r, host, listed.names.get(r, "")) for r, (_, host) in sorted(listed.ranks.items())]
    return rows, ranks


# ---------------------------------------------------------------------------------------------
# Files


def _binary(data: bytes) -> bool:
    head = data[:8192]
    if b"\0" in head:
        return True
    # Logs are text in whatever encoding, but only a handful of control characters.
    controls = sum(1 for b in head if b < 32 and b not in b"\t\n\r\f\v\b\x1b")
    return controls > len(head) // 10


def _load(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except IsADirectoryError:
        raise ReadError(path, f"a directory; expected {EXPECTED}") from None
    except OSError as e:
        raise ReadError(path, f"cannot be read ({e.strerror or e}); expected {EXPECTED}") from None
    if not raw.strip():
        raise ReadError(path, f"empty file; expected {EXPECTED}")
    if _binary(raw):
        raise ReadError(path, f"a binary file; expected {EXPECTED}")
    return raw.decode("utf-8", errors="replace")


def _program_op(program: str) -> str | None:
    base = re.split(r"[/\\]", program)[-1]
    m = _PERF.match(base)
    return TESTS.get((m.group(1) if m else base).lower())


def _file_op(path: Path) -> str | None:
    """The one collective the file name names, if it names exactly one."""
    name = path.name.lower()
    found: list[tuple[int, int, str]] = []
    # Longest first, so that "reduce" inside "all_reduce" is not a second collective.
    for key in sorted(TESTS, key=len, reverse=True):
        for m in re.finditer(rf"(?<![a-z]){re.escape(key)}(?![a-z])", name):
            if not any(s <= m.start() and m.end() <= e for s, e, _ in found):
                found.append((m.start(), m.end(), TESTS[key]))
    ops = {op for _, _, op in found}
    return ops.pop() if len(ops) == 1 else None


def _op(path: Path, test: _Test) -> str:
    if test.program is not None:
        op = _program_op(test.program)
        if op is None:
            raise ReadError(path, f"nccl-tests ran {test.program!r}, not a collective this "
                                  f"reader knows ({', '.join(BINARIES)})")
        return op
    op = test.mention or _file_op(path)
    if op is None:
        raise ReadError(path, NO_OP)
    return op


# ---------------------------------------------------------------------------------------------
# The text table


def _text_tests(path: Path, text: str) -> list[_Test]:
    mentions = _Mentions()
    untagged = _Stream(mentions)
    ranks: dict[int, _Stream] = {}
    for line in text.splitlines():
        m = _PREFIX.match(line)
        if m:
            rank = int(m.group("tag") or m.group("label"))
            ranks.setdefault(rank, _Stream(mentions)).feed(line[m.end():])
        else:
            untagged.feed(line)
    tests = untagged.tests
    # Rank 0 prints the table of an MPI build; under mpirun a build without MPI runs one test
    # per rank and every rank prints its own: the lowest rank's stands for them.
    for rank in sorted(ranks):
        if any(t.layout for t in ranks[rank].tests):
            tests = tests + ranks[rank].tests
            break
    if not any(t.layout for t in tests):
        raise ReadError(path, NO_TABLE)
    tests = [t for t in tests if t.results]
    if not tests:
        raise ReadError(path, "the nccl-tests table has no result lines (did the run stop "
                              "before its first size?)")
    for t in tests:
        t.world_size, t.nnodes = _world(t)
    return tests


class _Mentions:
    """The collective of the last *_perf binary named outside a table, in any rank's lines or
    none: the command line a script echoes before each run."""

    def __init__(self):
        self.op: str | None = None
        self.seq = 0

    def see(self, line: str) -> None:
        for m in _PERF.finditer(line):
            op = TESTS.get(m.group(1).lower())
            if op is not None:
                self.op, self.seq = op, self.seq + 1


class _Stream:
    """The runs in one rank's lines (or in the untagged ones)."""

    def __init__(self, mentions: _Mentions):
        self.mentions = mentions
        self.used = 0  # the last mention a table of this stream took: each names one run
        self.tests = [_Test()]

    def new_test(self) -> _Test:
        self.tests.append(_Test())
        return self.tests[-1]

    def feed(self, line: str) -> None:
        test = self.tests[-1]
        if _VERSION.match(line):
            if test.begun():
                self.new_test()
        elif m := _STARTING.match(line):
            if test.program or test.layout:
                test = self.new_test()
            test.program = m.group(1)
        elif _NTHREAD.match(line):
            if test.iters or test.ranks or test.layout:
                test = self.new_test()
            test.iters = _header_iters(line)
        elif m := _DEVICE.match(line):
            if test.layout:
                test = self.new_test()
            test.ranks[int(m.group(1))] = (int(m.group(2) or 0), m.group(3))
            if m.group("name").strip():
                test.names[int(m.group(1))] = m.group("name").strip()
        elif _HEADER.match(line):
            layout = _layout(line)
            if layout is None:
                return
            if test.results:
                test = self.new_test()
            test.layout, test.table_open = layout, True
            if layout.group[0] == "cputime":
                test.notes.append("time is CPU time (-C 1)")
            if self.mentions.seq > self.used:
                test.mention, self.used = self.mentions.op, self.mentions.seq
        elif _CONCLUDED.match(line):
            test.table_open = False
        elif test.table_open and _DATA.match(line):
            result = _parse_line(line.split(), test.layout)
            if result is not None:
                test.results.append(result)
        elif not line.lstrip().startswith("#"):
            self.mentions.see(line)


def _header_iters(line: str) -> int | None:
    settings = {name: int(n) for name, n in _SETTING.findall(line)}
    if "iters" not in settings:
        return None
    # nccl-tests divides the elapsed time by iters x agg iters, and by the graph launches.
    return settings["iters"] * settings.get("agg iters", 1) * max(settings.get("graph", 0), 1)


def _layout(line: str) -> _Layout | None:
    names = line.lstrip("#").split()
    starts = [i for i, n in enumerate(names) if n in _TIME_COLUMNS]
    if not starts:
        return None
    first = starts[0]
    if len(starts) > 1:
        return _Layout(tuple(names[3:first]), tuple(names[first:starts[1]]), 2)
    return _Layout(tuple(names[3:first]), tuple(names[first:]), 1)


def _parse_line(tokens: list[str], layout: _Layout) -> _Result | None:
    """One size's line, or None for a line cut short (a run that died mid-line)."""
    size, count, dtype = int(tokens[0]), int(tokens[1]), tokens[2]
    p, redop, root = 3, None, None
    for name in layout.idents:
        token = tokens[p] if p < len(tokens) else ""
        if name == "redop":
            # alltoall_perf of 2020 printed an empty redop: the time follows the type.
            if token and _number(token) is None:
                redop, p = token, p + 1
        elif name == "root":
            try:
                root, p = int(token), p + 1
            except ValueError:
                return None
        else:
            p += 1
    width = len(layout.group)
    rest = tokens[p:]
    if len(rest) < width:
        return None
    placements = []
    for in_place in range(min(layout.placements, len(rest) // width)):
        values = dict(zip(layout.group, rest[in_place * width:(in_place + 1) * width],
                          strict=True))
        placements.append(_text_placement(in_place, values))
    return _Result(size, count, dtype, redop, root, placements)


def _text_placement(in_place: int, values: dict[str, str]) -> _Placement:
    pl = _Placement(in_place, values.get("time", values.get("cputime")), values.get("algbw"),
                    values.get("busbw"), p99=values.get("i_p99"), cv=values.get("i_cv%"))
    if "#wrong" in values:
        pl.wrong = _count(values["#wrong"])
    elif "error" in values:
        delta = values["error"]
        if delta != "N/A" and (delta.endswith("*") or _number(delta) != 0):
            pl.notes.append(f"max error {delta}")
    return pl


def _world(test: _Test) -> tuple[int | None, int | None]:
    if test.world_size is not None or not test.ranks:
        return test.world_size, test.nnodes
    # NCCL_TESTS_SPLIT_MASK splits the ranks into groups, one communicator each.
    groups = {g for g, _ in test.ranks.values()}
    group = test.ranks[min(test.ranks)][0]
    members = [host for g, host in test.ranks.values() if g == group]
    if len(groups) > 1:
        test.notes.append(f"ranks split into {len(groups)} communicators")
    return len(members), len(set(members))


# ---------------------------------------------------------------------------------------------
# The -J JSON file (util.cu, JSON_FILE_VERSION 2)


def _json_test(path: Path, text: str) -> _Test:
    def bad(what: str) -> ReadError:
        return ReadError(path, f"{what}; expected the JSON file nccl-tests writes with -J")

    try:
        doc = json.loads(_BARE_INF.sub("null", text))
    except json.JSONDecodeError as e:
        raise bad(f"not valid JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise bad("JSON without a 'results' list")
    test = _Test()
    args = doc.get("args")
    if isinstance(args, list) and args and isinstance(args[0], str):
        test.program = args[0]
    config = doc.get("config") if isinstance(doc.get("config"), dict) else {}
    iters = _whole(config.get("iterations"))
    if iters is not None:
        test.iters = (iters * (_whole(config.get("aggregated_iterations")) or 1)
                      * max(_whole(config.get("graph")) or 0, 1))
    devices = [d for d in config.get("devices") or [] if isinstance(d, dict)]
    if devices:
        # One entry per process: util.cu parses only the first device line each sends.
        group = devices[0].get("group")
        members = [d for d in devices if d.get("group") == group]
        per_process = (_whole(config.get("nthreads")) or 1) * (_whole(config.get("ngpus")) or 1)
        test.world_size = len(members) * per_process
        test.nnodes = len({str(d.get("hostname")) for d in members})
    for i, r in enumerate(doc["results"]):
        if not isinstance(r, dict):
            raise bad(f"results[{i}] is not an object")
        size, count = _whole(r.get("size")), _whole(r.get("count"))
        if size is None or count is None or not isinstance(r.get("type"), str):
            raise bad(f"results[{i}] has no size, count and type")
        root = _whole(r["root"].strip() if isinstance(r.get("root"), str) else r.get("root"))
        redop = r.get("redop") if isinstance(r.get("redop"), str) and r.get("redop") else None
        placements = []
        for in_place, key in enumerate(("out_of_place", "in_place")):
            m = r.get(key)
            if not isinstance(m, dict):
                continue  # null: nccl-tests printed nothing for this placement
            per_iter = r.get(f"{key}_per_iter")
            per_iter = per_iter if isinstance(per_iter, dict) else {}
            pl = _Placement(in_place, m.get("time", m.get("cpu_time")), m.get("alg_bw"),
                            m.get("bus_bw"), _count(m.get("nwrong")), per_iter.get("p50_us"),
                            per_iter.get("p99_us"), per_iter.get("cv_pct"))
            if "cpu_time" in m and "time" not in m:
                pl.notes.append("time is CPU time (-C 1)")
            placements.append(pl)
        test.results.append(_Result(size, count, r["type"], redop, root, placements))
    if not test.results:
        raise bad("JSON with no results (did the run stop before its first size?)")
    return test


# ---------------------------------------------------------------------------------------------
# Rows


def _number(value) -> float | None:
    """A finite number, from a printed token or a JSON value; None for anything else."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _whole(value) -> int | None:
    x = _number(value)
    return int(x) if x is not None and x == int(x) else None


def _count(value) -> int | None:
    """#wrong: "N/A" (no check), and -1 from builds that print it for no check, are None."""
    n = _whole(value)
    return n if n is not None and n >= 0 else None


def _rows(test: _Test, op: str) -> list[dict]:
    known = OPS.get(op)
    rows = []
    for res in test.results:
        dtype = DTYPES.get(res.dtype, res.dtype)
        elt = ELEMENT_BYTES.get(dtype)
        if known is None:
            redop = res.redop or "none"
            root = -1 if res.root is None else res.root
        else:
            redop = res.redop if known.uses_redop else "none"
            root = res.root if known.uses_root else -1
        for pl in res.placements:
            time_us = _number(pl.time)
            notes = ["nccl-tests", *test.notes, *pl.notes]
            ok = time_us is not None and time_us > 0
            if not ok:
                notes.append(f"no valid time (nccl-tests gave {pl.time!r})")
            row = dict.fromkeys(COLUMNS)
            row.update(
                op=op, dtype=dtype, redop=redop, root=root, in_place=pl.in_place,
                world_size=test.world_size, nnodes=test.nnodes, size_bytes=res.size,
                count=res.size // elt if elt else res.count, iters=test.iters,
                time_us=time_us if ok else None,
                algbw_gbps=_number(pl.algbw) if ok else None,
                busbw_gbps=_number(pl.busbw) if ok else None,
                p50_us=_number(pl.p50), p99_us=_number(pl.p99), cv_pct=_number(pl.cv),
                wrong=pl.wrong, backend="nccl", status="ok" if ok else "skipped",
                note="; ".join(notes))
            rows.append(row)
    return rows
