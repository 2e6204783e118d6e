"""docs/architecture.md's rules that can be read off the code: one meaning per name (no class
name defined twice, no two modules of one file name outside a kind's folder), every module named
in its box's row of the table, and every command registered in one place. The import rules are
tests/unit/project/test_layers.py's."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

from paths import REPO

from distbench.cli.app import app
from distbench.kinds import KINDS, commands, tools

PACKAGE = REPO / "distbench"
KINDS_DIR = PACKAGE / "kinds"
DOC = REPO / "docs" / "architecture.md"
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
    assert "ranking.py" in by_name and "models.py" in by_name


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


GENERIC = ("core", "platform", "ops", "run", "bench", "results", "planner",
           "parallel")
# Words that are a command's name and something else in a generic box: a layout's dimensions,
# the part of a run that failed (run.json's failed_step), nvidia-smi's own subcommand.
OTHER_MEANINGS = {"tp": "a layout's tensor-parallel degree", "pp": "its pipeline degree",
                  "dp": "its data-parallel degree", "step": "run.json's failed_step",
                  "topo": "nvidia-smi topo -m"}


def _strings(path: Path) -> list[tuple[int, str]]:
    """The string constants of a module that are no docstring."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and n.body and isinstance(n.body[0], ast.Expr)
            and isinstance(n.body[0].value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def test_the_generic_boxes_name_no_command_nor_a_file_of_one():
    """A command is its kind's business: the boxes below the kinds are handed a kind's pieces
    (its contract, its report section) and never name a command or a file one writes, so that
    a new command needs no line in them."""
    files = {o.file for kind in KINDS.values() for o in kind.outputs}
    names = set(KINDS) - set(OTHER_MEANINGS)
    assert "collective.csv" in files and "watch" in names  # the registry is read
    named = [f"{where(path)}:{line}: {text!r}"
             for box in GENERIC for path in sorted((PACKAGE / box).rglob("*.py"))
             for line, text in _strings(path) if text in files or text in names]
    assert not named, "generic boxes naming a command or its file: " + "; ".join(named)


def test_options_classes_check_and_hold_values_only():
    """An options class parses and checks (its fields' checks, validate, check_world,
    check_backend), says what the run needs of this machine (host_bytes, buffer_multiple for
    a sweep's) and serializes itself; what a command does with its values is its kind's
    functions' (a PlanOptions.memory_per_gpu once called from a lower box)."""
    from distbench.core.options import RunOptions

    allowed = {"validate", "check_world", "check_backend", "host_bytes", "buffer_multiple",
               "to_json", "identity"}
    classes = {RunOptions, *RunOptions.__subclasses__()}
    classes |= {c for k in KINDS.values() if k.options for c in k.options.__mro__
                if issubclass(c, RunOptions)}
    extra = {f"{c.__module__}.{c.__name__}.{name}"
             for c in classes for name, value in vars(c).items()
             if not name.startswith("_") and name not in allowed
             and (callable(value) or isinstance(value, property))}
    assert len(classes) >= 12  # every command's, and the shared bases
    assert not extra, f"domain methods on options classes: {sorted(extra)}"
