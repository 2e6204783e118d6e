"""Tables on stdout in nccl-tests' shape: a command declares its columns once (beside its CSV
contract) and these pure formatters turn rows into lines; the caller prints them."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass


def fmt_us(us: float) -> str:
    """Microseconds: two decimals, or four significant digits past a second."""
    return f"{us:.2f}" if us < 1e6 else f"{us:.4g}"


def us_as_ms(spec: str) -> Callable[[float], str]:
    return lambda us: format(us / 1e3, spec)


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """A count and its noun, singular for 1: "1 row", "3 rows"; `nouns` where "s" is wrong."""
    return f"{count} {noun if count == 1 else nouns or noun + 's'}"


def percent(share: float, places: int = 4) -> str:
    """A share as a percentage, to at most `places` decimals and no trailing zeros: 0.05 is 5%,
    0.005 is 0.5%, so a threshold finer than a whole percent is echoed as given, not as 0%."""
    text = f"{share * 100:.{places}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return f"{text}%"


@dataclass(frozen=True)
class Column:
    """One console column: the row key it shows, its two header lines and its width."""

    key: str
    header: str
    unit: str = ""
    width: int = 10
    fmt: str | Callable[[object], str] = ""  # a format spec, or a function of the value
    ident: bool = False  # names the row: still shown when the row was skipped

    def cell(self, row: dict) -> str:
        value = row.get(self.key)
        if value is None or value == "":
            return "-"
        if callable(self.fmt):
            return self.fmt(value)
        if isinstance(value, bool):
            return str(int(value))
        return format(value, self.fmt)


@dataclass(frozen=True)
class Output:
    """A CSV contract (columns are added at the end, never renamed), how its rows show on the
    console, and what reading it back (report, compare) relies on."""

    file: str
    csv: tuple[str, ...]
    console: tuple[Column, ...] = ()
    # what tells two rows apart: compare pairs two runs' rows on these
    identity: tuple[str, ...] = ()
    # what report and compare read besides the identity; a run without one is refused
    read: tuple[str, ...] = ()
    # identity columns added after runs were written without them: compare matches on them
    # where both runs record them, and a run without them is still read
    identity_since: tuple[str, ...] = ()
    # How compare reads it: the column each metric reads (--metric busbw, time, p99; auto is
    # busbw where there is one, else time); none of them, and `not_compared` says why not.
    busbw: str | None = None
    time: str | None = None
    p99: str | None = None
    not_compared: str = ""
    # a row's own metric column, where each row is judged in its own unit and direction (an
    # accept check's), instead of the metric asked for
    row_metric: str | None = None
    # what a row is grouped under in compare's table (the op), and what names it within the
    # group; None: the file's name, and the identity cells compare does not group on
    group: Callable[[dict], str] | None = None
    label: Callable[[dict], str] | None = None
    grouped_by: str = "op"  # what a group is, as compare's header names it
    nccl_tests: bool = False  # nccl-tests logs are read into its rows (collective.csv's)

    def __post_init__(self):
        for what, keys in (("console", [c.key for c in self.console]),
                           ("identity", self.identity), ("read", self.read),
                           ("identity_since", self.identity_since),
                           ("metrics", [c for c in (self.busbw, self.time, self.p99,
                                                    self.row_metric) if c])):
            unknown = [k for k in keys if k not in self.csv]
            if unknown:
                raise ValueError(f"{self.file}: {what} columns not in the CSV: {unknown}")

    # what compare's --metric names: each reads the field of that name (auto: busbw, else time)
    METRICS = ("auto", "busbw", "time", "p99")

    def metric(self, name: str) -> str | None:
        """The column --metric `name` reads here (None: not compared by it)."""
        if self.not_compared:
            return None
        return (self.busbw or self.time) if name == "auto" else getattr(self, name)

    @property
    def required(self) -> tuple[str, ...]:
        """The columns a run read back must have (its identity and what is read), in CSV
        order; a run's other columns may be missing (an older run lacks those added since,
        identity_since among them)."""
        return tuple(c for c in self.csv if (c in self.identity or c in self.read)
                     and c not in self.identity_since)


def _line(columns: Sequence[Column], cells: Iterable[str]) -> str:
    """The cells right-aligned in their columns; one that fills its column or overflows it (a
    plan's step of a 7b model scaled from a CPU: 169573627.81 ms) keeps a space before it, so
    it never runs into its neighbour."""
    return "".join(cell.rjust(col.width) if len(cell) < col.width or i == 0 else " " + cell
                   for i, (col, cell) in enumerate(zip(columns, cells, strict=False)))


def format_header(columns: Sequence[Column], title: str) -> list[str]:
    """The title and the column headers, then their units where any column has one (a line of
    blanks says nothing)."""
    lines = ["#", f"# {title}", "#" + _line(columns, [c.header for c in columns])[1:]]
    if any(c.unit for c in columns):
        lines.append("#" + _line(columns, [c.unit for c in columns])[1:])
    return lines


def format_row(columns: Sequence[Column], row: dict) -> str:
    """A skipped row shows the columns that name it, then why it was skipped."""
    if row.get("status") == "skipped":
        named = [c for c in columns if c.ident]
        return _line(named, [c.cell(row) for c in named]) + f"   skipped: {row.get('note')}"
    return _line(columns, [c.cell(row) for c in columns])


def format_table(columns: Sequence[Column], rows: Iterable[dict],
                 title: str | None = None) -> list[str]:
    """The header block (when a title is given) and one line per row."""
    lines = format_header(columns, title) if title is not None else []
    return lines + [format_row(columns, r) for r in rows]


def markdown_row(cells: Iterable[object]) -> str:
    """A Markdown table row; a | in a cell (a check's name comes from a profile file) is
    escaped, or it would split the cell."""
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def markdown_table(header: Sequence[str], rows: Iterable[Iterable[object]],
                   align: str = "") -> list[str]:
    """A Markdown table, one line per row. `align`: "r" per column to right-align (figures),
    anything else left; an empty header cell (a column its cells explain) is one space."""
    head = "|" + "|".join(f" {h} " if h else " " for h in header) + "|"
    rule = "|" + "".join("---:|" if a == "r" else "---|"
                         for a in align.ljust(len(header)))
    return [head, rule] + [markdown_row(r) for r in rows]


def format_matrix(title: str, names: list[str], grid: dict[tuple[int, int], float]) -> list[str]:
    """An N x N table: row = source rank, column = destination rank."""
    n = len(names)
    width = max(8, *(len(str(i)) + 2 for i in range(n)))
    lines = ["#", f"# {title}", "#" + " " * 5 + "".join(str(j).rjust(width) for j in range(n))]
    for i in range(n):
        cells = ["-" if i == j else (f"{grid[i, j]:.3g}" if (i, j) in grid else "?")
                 for j in range(n)]
        lines.append(f"{i:>6}" + "".join(c.rjust(width) for c in cells) + f"   {names[i]}")
    return lines


def missing(v) -> bool:
    """A cell with no figure: None, or NaN (pandas' empty cell)."""
    return v is None or (isinstance(v, float) and math.isnan(v))


def number(v, digits: int = 4) -> str:
    """`digits` significant digits, always written out in full (1080 beside 966, never 1.08e+03
    beside 966), trailing zeros dropped; "-" for none."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    v = float(v)
    if v == 0 or not math.isfinite(v):
        return f"{v:g}"
    rounded = float(f"{v:.{digits - 1}e}")  # 999.96 to 4 digits is 1000: its own magnitude
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(rounded))))
    text = f"{rounded:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text
