"""What people see: the results table on stdout in nccl-tests' shape (streamed row by row, so a
long sweep shows its numbers as they come), logs and progress on stderr. Rank 0 only."""

from __future__ import annotations

import os
import sys

from rich.console import Console as RichConsole
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from distbench.sizes import format_size

COLUMNS = [  # (header, unit, width)
    ("size", "(B)", 12), ("count", "(elements)", 13), ("type", "", 9), ("redop", "", 6),
    ("root", "", 5), ("place", "", 6), ("time", "(us)", 11), ("algbw", "(GB/s)", 9),
    ("busbw", "(GB/s)", 9), ("#wrong", "", 7), ("p99", "(us)", 11), ("slowest", "(rank)", 8),
]


def _line(cells: list[str]) -> str:
    return "".join(c.rjust(w) for c, (_, _, w) in zip(cells, COLUMNS, strict=False))


def _fmt_time(us: float) -> str:
    return f"{us:.2f}" if us < 1e6 else f"{us:.4g}"


class Console:
    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.err = RichConsole(stderr=True, highlight=False, no_color="NO_COLOR" in os.environ)
        self._progress: Progress | None = None
        self._task = None

    def log(self, message: str) -> None:
        if self.enabled:
            self.err.print(f"distbench: {message}", markup=False, soft_wrap=True)

    def section(self, title: str) -> None:
        if not self.enabled:
            return
        for text in ("#", f"# {title}", "#" + _line([h for h, _, _ in COLUMNS])[1:],
                     "#" + _line([u for _, u, _ in COLUMNS])[1:]):
            self._print_out(text)

    def row(self, r: dict) -> None:
        if not self.enabled:
            return
        head = [str(r["size_bytes"]), str(r["count"]), r["dtype"], r["redop"], str(r["root"]),
                "in" if r["in_place"] else "out"]
        if r["status"] != "ok":
            text = _line(head) + f"   {r['status']}: {r['note']}"
        else:
            text = _line(head + [_fmt_time(r["time_us"]), f"{r['algbw_gbps']:.2f}",
                                 f"{r['busbw_gbps']:.2f}", str(r["wrong"]),
                                 _fmt_time(r["p99_us"]), str(r["slowest_rank"])])
        self._print_out(text)

    def matrix(self, title: str, names: list[str], grid: dict[tuple[int, int], float]) -> None:
        """An N x N table: row = source rank, column = destination rank."""
        if not self.enabled:
            return
        n = len(names)
        width = max(8, *(len(str(i)) + 2 for i in range(n)))
        self._print_out(f"#\n# {title}")
        self._print_out("#" + " " * 5 + "".join(str(j).rjust(width) for j in range(n)))
        for i in range(n):
            cells = ["-" if i == j else (f"{grid[i, j]:.3g}" if (i, j) in grid else "?")
                     for j in range(n)]
            self._print_out(f"{i:>6}" + "".join(c.rjust(width) for c in cells) + f"   {names[i]}")

    def _print_out(self, text: str) -> None:
        # Both on one terminal: print above the live bar, or the two would garble each other.
        if self._progress is not None and sys.stdout.isatty():
            self._progress.console.print(text, markup=False, highlight=False, soft_wrap=True)
        else:
            print(text, flush=True)

    def start_progress(self, total: int) -> None:
        """A live bar when stderr is a terminal; otherwise stdout's streamed rows are the
        progress and stderr stays quiet."""
        if not (self.enabled and self.err.is_terminal and total > 1):
            return
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                  MofNCompleteColumn(), TimeElapsedColumn(),
                                  console=self.err, transient=True, redirect_stdout=False)
        self._progress.start()
        self._task = self._progress.add_task("measuring", total=total)

    def working_on(self, label: str) -> None:
        if self._progress is not None:
            self._progress.update(self._task, description=label)

    def advance(self) -> None:
        if self._progress is not None:
            self._progress.update(self._task, advance=1)

    def stop_progress(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def describe(op: str, size: int, dtype: str, redop: str, in_place: bool) -> str:
    """How errors and progress name a measurement."""
    extra = f" {redop}" if redop != "none" else ""
    return f"{op} {format_size(size)} {dtype}{extra} {'in-place' if in_place else 'out-of-place'}"
