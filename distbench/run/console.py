"""What people see: tables on stdout (streamed line by line, so a long sweep shows its numbers as
they come; the lines come from distbench.core.tables), logs and progress on stderr. Rank 0 only."""

from __future__ import annotations

import os
import sys

from rich.console import Console as RichConsole
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text


class Eta(ProgressColumn):
    """The time left at the pace so far: from the first step done. rich's own estimate waits
    for two updates inside its 30 s window, which a plan's few long stages seldom give."""

    def render(self, task) -> Text:
        if not task.completed or task.elapsed is None or task.total is None:
            return Text("eta -:--:--")
        left = int(task.elapsed * (task.total - task.completed) / task.completed)
        return Text(f"eta {left // 3600}:{left // 60 % 60:02d}:{left % 60:02d}")


class Console:
    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.err = RichConsole(stderr=True, highlight=False, no_color="NO_COLOR" in os.environ)
        self._progress: Progress | None = None
        self._task = None

    def log(self, message: str) -> None:
        if self.enabled:
            self.err.print(f"distbench: {message}", markup=False, soft_wrap=True)

    def lines(self, lines: list[str]) -> None:
        """Table lines on stdout."""
        if not self.enabled:
            return
        for text in lines:
            # Both on one terminal: print above the live bar, or the two would garble each other.
            if self._progress is not None and sys.stdout.isatty():
                self._progress.console.print(text, markup=False, highlight=False, soft_wrap=True)
            else:
                print(text, flush=True)

    def start_progress(self, total: int) -> None:
        """A live bar with the time spent and an estimate of the time left, when stderr is a
        terminal; otherwise stdout's streamed rows are the progress and stderr stays quiet."""
        if not (self.enabled and self.err.is_terminal and total > 1):
            return
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                  MofNCompleteColumn(), TimeElapsedColumn(),
                                  Eta(),
                                  console=self.err, transient=True, redirect_stdout=False)
        self._progress.start()
        self._task = self._progress.add_task("measuring", total=total)

    def working_on(self, label: str) -> None:
        if self._progress is not None:
            self._progress.update(self._task, description=label)
            self._progress.refresh()  # a step or plan stage lasts seconds: say it at once

    def advance(self, steps: int = 1) -> None:
        if self._progress is not None:
            self._progress.update(self._task, advance=steps)

    def stop_progress(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
