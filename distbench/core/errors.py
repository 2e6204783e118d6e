"""Errors as people read them: the one error for result files that cannot be read back (report,
compare), and an exception cut to one line for a message. No torch here: report and compare
never start a worker."""

from __future__ import annotations

import re
from pathlib import Path

# What gloo adds to every error it raises, which says nothing of this run: the C++ source line
# ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] ") and, after a
# closed connection, advice to read the remote worker's log that ends "GLHF! 🏖️".
_SOURCE_LINE = re.compile(r"\[[^\]\s]+\.(?:cc|cpp|cu|h|hpp):\d+\]\s*")
_ADVICE = re.compile(r"\s*This is typically caused by .*?GLHF!\S*(?:\s*\S*🏖\S*)?", re.S)


class ReadError(Exception):
    """A file or directory that does not hold what was expected: one line naming the file and
    what was expected, exit code 2."""

    def __init__(self, path: str | Path, expected: str):
        super().__init__(f"{path}: {expected}")
        self.path = str(path)


def one_line(what: BaseException | str, limit: int | None = None, *, whole: bool = False,
             named: bool = False, mark: str = "...") -> str:
    """What an error says, as one line of a message (run.json, a skip reason, stderr): its first
    line, or with `whole` all of it, each run of whitespace one space; "Type: " in front when
    `named`; an exception that says nothing, by its type's name. Past `limit` characters it is
    cut to end in `mark` ("" cuts it short without one). gloo's source line and advice are
    left out: run.json says what happened, not where in gloo."""
    text = _ADVICE.sub("", _SOURCE_LINE.sub("", str(what)))
    if named and isinstance(what, BaseException):
        text = f"{type(what).__name__}: {text}"
    lines = [" ".join(text.split())] if whole else text.strip().splitlines()
    line = lines[0] if lines else ""
    if not line and isinstance(what, BaseException):
        line = type(what).__name__
    if limit is not None and len(line) > limit:
        line = line[:limit - len(mark)] + mark
    return line
