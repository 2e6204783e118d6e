"""nccl-tests' text log read into runs (nccltests_runs.py): every table layout nccl-tests has
printed, the lines of `mpirun --tag-output` and `srun --label` (rank 0's table read once), and
the collective of each run, from its header or a *_perf command line echoed before its table
(nccltests.py's docstring says what each layout holds). No torch here.
"""

from __future__ import annotations

import re
from pathlib import Path

from distbench.core.errors import ReadError
from distbench.results.nccltests_runs import (
    PERF,
    TESTS,
    NcclPlacement,
    NcclRun,
    NcclSize,
    NcclTable,
    as_number,
    as_wrong_count,
)

NO_TABLE = ("no nccl-tests result table (expected lines like '#  size  count  type  redop  "
            "root  time  algbw  busbw  #wrong ...')")

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
_TIME_COLUMNS = ("time", "cputime")


def text_runs(path: Path, text: str) -> list[NcclRun]:
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
        for m in PERF.finditer(line):
            op = TESTS.get(m.group(1).lower())
            if op is not None:
                self.op, self.seq = op, self.seq + 1


class _Stream:
    """The runs in one rank's lines (or in the untagged ones)."""

    def __init__(self, mentions: _Mentions):
        self.mentions = mentions
        self.used = 0  # the last mention a table of this stream took: each names one run
        self.tests = [NcclRun()]

    def new_test(self) -> NcclRun:
        self.tests.append(NcclRun())
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


def _layout(line: str) -> NcclTable | None:
    names = line.lstrip("#").split()
    starts = [i for i, n in enumerate(names) if n in _TIME_COLUMNS]
    if not starts:
        return None
    first = starts[0]
    if len(starts) > 1:
        return NcclTable(tuple(names[3:first]), tuple(names[first:starts[1]]), 2)
    return NcclTable(tuple(names[3:first]), tuple(names[first:]), 1)


def _parse_line(tokens: list[str], layout: NcclTable) -> NcclSize | None:
    """One size's line, or None for a line cut short (a run that died mid-line)."""
    size, count, dtype = int(tokens[0]), int(tokens[1]), tokens[2]
    p, redop, root = 3, None, None
    for name in layout.idents:
        token = tokens[p] if p < len(tokens) else ""
        if name == "redop":
            # alltoall_perf of 2020 printed an empty redop: the time follows the type.
            if token and as_number(token) is None:
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
    return NcclSize(size, count, dtype, redop, root, placements)


def _text_placement(in_place: int, values: dict[str, str]) -> NcclPlacement:
    pl = NcclPlacement(in_place, values.get("time", values.get("cputime")), values.get("algbw"),
                    values.get("busbw"), p99=values.get("i_p99"), cv=values.get("i_cv%"))
    if "#wrong" in values:
        pl.wrong = as_wrong_count(values["#wrong"])
    elif "error" in values:
        delta = values["error"]
        if delta != "N/A" and (delta.endswith("*") or as_number(delta) != 0):
            pl.notes.append(f"max error {delta}")
    return pl


def _world(test: NcclRun) -> tuple[int | None, int | None]:
    if test.world_size is not None or not test.ranks:
        return test.world_size, test.nnodes
    # NCCL_TESTS_SPLIT_MASK splits the ranks into groups, one communicator each.
    groups = {g for g, _ in test.ranks.values()}
    group = test.ranks[min(test.ranks)][0]
    members = [host for g, host in test.ranks.values() if g == group]
    if len(groups) > 1:
        test.notes.append(f"ranks split into {len(groups)} communicators")
    return len(members), len(set(members))
