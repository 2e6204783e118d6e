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

The reading is split by concern: nccltests_text.py reads the text log, nccltests_json.py the -J
file, both into the runs of nccltests_runs.py; this module makes them rows.

No torch here: report and compare never start a worker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from distbench.core import contracts
from distbench.core.dtypes import ELEMENT_BYTES
from distbench.core.errors import ReadError
from distbench.core.tables import Output
from distbench.ops.collectives import OPS
from distbench.results.nccltests_json import json_run
from distbench.results.nccltests_runs import PERF, TESTS, NcclRun, as_number
from distbench.results.nccltests_text import text_runs


def contract() -> Output:
    """The contract an nccl-tests log's rows are read into (a registered Output that says so:
    collective's), so that report, compare and plan read both alike."""
    return next(o for o in contracts.outputs() if o.nccl_tests)


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
NO_OP = ("cannot tell which collective (no '# Collective test starting:' header, no *_perf "
         "command line before the table, and the file name names none)")


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
    does): the hosts tell the nodes, the names the GPU (plan's --from reads both:
    kinds/plan/sources.py)."""
    path = Path(path)
    text = _load(path)
    if text.lstrip().startswith("{"):
        tests = [json_run(path, text)]
    else:
        tests = text_runs(path, text)
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
    m = PERF.match(base)
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


def _op(path: Path, test: NcclRun) -> str:
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



def _rows(test: NcclRun, op: str) -> list[dict]:
    known = OPS.get(op)
    columns = contract().csv
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
            time_us = as_number(pl.time)
            notes = ["nccl-tests", *test.notes, *pl.notes]
            ok = time_us is not None and time_us > 0
            if not ok:
                notes.append(f"no valid time (nccl-tests gave {pl.time!r})")
            row = dict.fromkeys(columns)
            row.update(
                op=op, dtype=dtype, redop=redop, root=root, in_place=pl.in_place,
                world_size=test.world_size, nnodes=test.nnodes, size_bytes=res.size,
                count=res.size // elt if elt else res.count, iters=test.iters,
                time_us=time_us if ok else None,
                algbw_gbps=as_number(pl.algbw) if ok else None,
                busbw_gbps=as_number(pl.busbw) if ok else None,
                p50_us=as_number(pl.p50), p99_us=as_number(pl.p99), cv_pct=as_number(pl.cv),
                wrong=pl.wrong, backend="nccl", status="ok" if ok else "skipped",
                note="; ".join(notes))
            rows.append(row)
    return rows
