"""Shared by the planner's tests of benchmarks/megatron_sc21.py: the script, loaded as a
module, and its fit over every published row (a module-scoped fixture)."""

from __future__ import annotations

import importlib.util
import sys

import helpers
from paths import REPO

PATH = REPO / "benchmarks" / "megatron_sc21.py"
_spec = importlib.util.spec_from_file_location("megatron_sc21", PATH)
sc21 = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("megatron_sc21", sc21)  # dataclasses look their module up there
_spec.loader.exec_module(sc21)


def fit(cwd) -> tuple[float, list[dict]]:
    """(the fitted fraction, one result per row), for a module's `fitted` fixture: the script's
    fit and every row, through the CLI run in `cwd`. About 15 command lines, each a plan of up
    to 3,072 GPUs (4 to 5 s)."""

    def run(argv):
        res = helpers.cli(cwd, *argv, dispatch=True)
        assert res.code == 0, res.stdout + res.stderr

    mfu, rows = sc21.evaluate(run=run, jobs=1)
    assert 0 < mfu < 1
    return mfu, rows
