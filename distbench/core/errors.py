"""Reading result files back (report, compare): the one error for input that cannot be read.
No torch here: report and compare never start a worker."""

from __future__ import annotations

from pathlib import Path


class ReadError(Exception):
    """A file or directory that does not hold what was expected: one line naming the file and
    what was expected, exit code 2."""

    def __init__(self, path: str | Path, expected: str):
        super().__init__(f"{path}: {expected}")
        self.path = str(path)
