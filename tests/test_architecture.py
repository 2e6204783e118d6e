"""docs/architecture.md's rules that can be read off the code: one meaning per name (no class
name defined twice, no two modules of one file name outside a kind's folder), every module named
in its box's row of the table, and every command registered in one place. The import rules are
tests/test_layers.py's."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

from distbench.cli.app import app
from distbench.kinds import KINDS, commands, tools

PACKAGE = Path(__file__).resolve().parents[1] / "distbench"
KINDS_DIR = PACKAGE / "kinds"
DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
SOURCES = sorted(PACKAGE.rglob("*.py"))


def where(path: Path) -> str:
    return str(path.relative_to(PACKAGE.parent))


def test_no_class_name_is_defined_twice():
    """A grep for `class X` lands on one concept: two classes of one name in one package are two
    meanings of one word (issue 33 found Layout, Reference and Plan three times each)."""
    defined: dict[str, list[str]] = defaultdict(list)
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                defined[node.name].append(f"{where(path)}:{node.lineno}")
    twice = {name: at for name, at in defined.items() if len(at) > 1}
    assert not twice, f"class names defined more than once: {twice}"
    assert len(defined) > 100  # the walk sees the package's classes


def test_no_two_modules_share_a_file_name_outside_the_kinds_folders():
    """A kind's folder names its modules by role (kinds/plan/options.py is `distbench plan`'s
    options); everywhere else a module's file name is its own."""
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in SOURCES:
        if path.name != "__init__.py" and path.parent.parent != KINDS_DIR:
            by_name[path.name].append(where(path))
    shared = {name: at for name, at in by_name.items() if len(at) > 1}
    assert not shared, f"modules sharing a file name: {shared}"
    assert "plan.py" in by_name and "models.py" in by_name


def _rows() -> dict[str, str]:
    """The box table's rows: box name -> the row's text."""
    text = DOC.read_text(encoding="utf-8")
    return {m.group(1): m.group(0) for m in re.finditer(r"^\| `(\w+)/` \|.*$", text, re.M)}


def test_every_module_is_named_in_its_box_row():
    """The table says what each box holds; a module it does not name is a module a reader of
    the table cannot find, or one whose box the table no longer describes."""
    rows = _rows()
    boxes = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
    assert set(boxes) == set(rows), "a box without a row in docs/architecture.md, or a row " \
                                    "without a box"
    missing = []
    for box in boxes:
        named = set(re.findall(r"`(\w+)`", rows[box]))
        missing += [f"{box}/{p.name}" for p in sorted((PACKAGE / box).glob("*.py"))
                    if p.stem != "__init__" and p.stem not in named]
    assert not missing, f"modules docs/architecture.md's table does not name: {missing}"


def test_every_command_is_registered_once_in_the_kinds():
    """A new command is its folder in distbench/kinds/ and one line in kinds/__init__.py; the
    application has exactly the registered commands, each from its kind's folder: its options,
    its bodies and its output there, and a tool's own function."""
    registered = [c.name for c in app.registered_commands]
    assert len(registered) == len(set(registered)), registered
    assert sorted(registered) == sorted(KINDS)
    assert not set(tools()) & set(commands()) and {*tools(), *commands()} == set(KINDS)
    for name, kind in KINDS.items():
        home = f"distbench.kinds.{name}."
        parts = [kind.options, kind.run, kind.run_local, kind.dry_run, kind.exit_code,
                 kind.command, kind.section, kind.plots, kind.fits, kind.world_note]
        assert all(p.__module__.startswith(home) for p in parts if p is not None), name
        folder = PACKAGE / "kinds" / name
        assert (folder / "options.py").is_file(), name
