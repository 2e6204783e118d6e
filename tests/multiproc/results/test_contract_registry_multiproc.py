"""The contracts every reader of results needs are registered by distbench.kinds, in a fresh
interpreter as a script would read runs: without it, said; with it, read."""

from __future__ import annotations

import pytest
from helpers import python_c
from paths import REPO


@pytest.mark.multiproc  # a fresh interpreter: what a script that reads results imports
def test_reading_results_before_any_kind_registered_is_said_not_read_as_nothing():
    """A script that reads runs without importing distbench.kinds finds no contract: it is told
    so, where it would have read every run as holding no table."""
    proc = python_c("from distbench.results import reader\nreader.required()\n", REPO)
    assert proc.returncode != 0 and "import distbench.kinds first" in proc.stderr, proc.stderr
    proc = python_c("import distbench.kinds\nfrom distbench.results import reader\n"
                    "print(sorted(reader.required())[0])\n", REPO)
    assert proc.returncode == 0 and proc.stdout.strip() == "accept.csv", proc.stderr
