"""errors.one_line: how every message quotes an exception (run.json's error, topo.json, a skip
reason, a usage error), each site choosing the line, the name and the bound."""

from __future__ import annotations

from distbench.core.errors import one_line


def test_the_first_line_or_the_type_when_it_says_nothing():
    assert one_line(RuntimeError("  boom\nTraceback (most recent call last):\n")) == "boom"
    assert one_line(ValueError("")) == "ValueError"
    assert one_line("") == ""  # a text has no type to fall back on


def test_whole_joins_every_line_and_named_puts_the_type_in_front():
    assert one_line(OSError("no\n  such   file"), whole=True, named=True) == "OSError: no such file"
    assert one_line(OSError("no\nsuch file"), named=True) == "OSError: no"
    assert one_line("exited 1:\n  bad", whole=True, named=True) == "exited 1: bad"


def test_cut_at_the_limit_ending_in_the_mark_or_short():
    assert one_line(RuntimeError("x" * 8), 8) == "x" * 8
    assert one_line(RuntimeError("x" * 10), 8) == "xxxxx..."
    assert one_line(RuntimeError("x" * 10), 8, mark="") == "x" * 8
    assert one_line(RuntimeError("x" * 500)) == "x" * 500  # no limit: whole
