"""The package's layout holds: every import (at the top of a module or inside a function) goes
down the layers docs/architecture.md draws, and no chain of imports comes back to where it
started. Read from the source with ast, so an import hidden in a function counts too.
The tests that start processes: test_layers_multiproc.py."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import NamedTuple

import pytest
from paths import REPO

PACKAGE = REPO / "distbench"

# A box may import the boxes below it. Boxes on one level don't import each other.
LEVELS = {
    "core": 0, "schemas": 0,
    "platform": 1, "ops": 1,
    "results": 2,
    "run": 3,
    "bench": 4, "planner": 4,
    "parallel": 5,
    "steps": 6,
    "kinds": 7,
    "cli": 8,
    "__main__": 9,
}
# What the lowest boxes must never pull in, even through another module of ours: the command
# line is built and validated, and report and compare run, without them.
BANNED = {
    "core": {"torch", "pandas", "typer", "rich", "matplotlib", "numpy"},
    "schemas": {"torch", "pandas", "typer", "rich", "matplotlib", "numpy"},
    "results": {"torch"},
    # a plan from earlier runs is pure arithmetic, in seconds even for thousands of GPUs
    "planner": {"torch"},
}
# Modules that must stay light in a box that need not be: accept's profiles are read by the
# command line's validation and by accept --dry-run (which plans with accept's itinerary), and
# none of them imports torch.
BANNED_MODULES = {f"distbench.kinds.accept.{name}": {"torch"} for name in (
    "profile_model", "profile_toml", "profile_files", "itinerary", "schedule")}
TOP_LEVEL = {"__init__", "__main__"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


class Imports(NamedTuple):
    """Our modules and other top-level packages a module imports anywhere in its body, and
    those it imports when it is loaded (outside any function)."""

    ours: set[str]
    theirs: set[str]
    ours_at_load: set[str]
    theirs_at_load: set[str]


def imports_of(name: str) -> Imports:
    """`from distbench.x import y` counts as importing distbench.x.y when that is a module."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, bool]] = []  # (target, imported at load)

    def visit(node: ast.AST, at_load: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend((a.name, at_load) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            found.extend((f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base, at_load)
                         for a in node.names)
        inner = at_load and not isinstance(
            node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(ast.parse(path.read_text(encoding="utf-8")), True)
    got = Imports(set(), set(), set(), set())
    for target, at_load in found:
        if target.split(".")[0] == "distbench":
            while target not in MODULES:  # distbench.x.attr -> distbench.x
                target = target.rpartition(".")[0]
            if target == name:
                continue
            anywhere, loaded = got.ours, got.ours_at_load
        else:
            target, anywhere, loaded = target.split(".")[0], got.theirs, got.theirs_at_load
        anywhere.add(target)
        if at_load:
            loaded.add(target)
    return got


class _Graph(dict):
    """Each module's imports, parsed when first asked for: a test run that collects this file
    without running it (the other pytest process) parses nothing."""

    def __missing__(self, name: str) -> Imports:
        self[name] = imports_of(name)
        return self[name]


GRAPH: dict[str, Imports] = _Graph()


def box(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def loaded_with(start: str) -> set[str]:
    """Our modules that loading `start`'s imports loads in turn."""
    seen: set[str] = set(GRAPH[start].ours)
    todo = list(seen)
    while todo:
        for dep in GRAPH[todo.pop()].ours_at_load:
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def test_every_module_sits_in_a_box():
    loose = [n for n in MODULES if box(n) not in LEVELS and n != "distbench"]
    assert not loose, f"modules outside the boxes: {loose}"
    top = [p.stem for p in PACKAGE.glob("*.py")]
    assert set(top) <= TOP_LEVEL and len(top) <= 4, top


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_go_down(name):
    if name == "distbench":
        assert not GRAPH[name].ours, "the package's __init__ imports nothing of ours"
        return
    mine = box(name)
    wrong = []
    for dep in sorted(GRAPH[name].ours):
        theirs = box(dep)
        if dep == "distbench" or theirs == mine:
            continue
        if theirs == "cli" and mine != "__main__":
            wrong.append(f"{dep} (only __main__ imports cli)")
        elif LEVELS[theirs] >= LEVELS[mine]:
            wrong.append(f"{dep} ({theirs} is not below {mine})")
    assert not wrong, f"{name} imports " + "; ".join(wrong)


@pytest.mark.parametrize("name", sorted(n for n in MODULES if box(n) in BANNED))
def test_light_boxes_stay_light(name):
    """Neither the module nor what loading its imports loads brings in a banned package. A
    function-level import of ours that imports torch only inside its own functions (the op
    registry's builders) is fine: results never call those."""
    pulled = set(GRAPH[name].theirs)
    for dep in loaded_with(name):
        pulled |= GRAPH[dep].theirs_at_load
    heavy = sorted(pulled & BANNED[box(name)])
    assert not heavy, f"{name} imports {heavy}, directly or through our modules"


@pytest.mark.parametrize("name", sorted(BANNED_MODULES))
def test_light_modules_stay_light(name):
    pulled = set(GRAPH[name].theirs)
    for dep in loaded_with(name):
        pulled |= GRAPH[dep].theirs_at_load
    heavy = sorted(pulled & BANNED_MODULES[name])
    assert not heavy, f"{name} imports {heavy}, directly or through our modules"


def test_no_import_cycle():
    # Tarjan's strongly connected components over the module graph: any component of more
    # than one module is a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v].ours:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in MODULES:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_the_rules_catch_what_they_forbid(monkeypatch):
    """The checks above fail on a planted upward import, a planted heavy import and a planted
    cycle."""
    planted = {
        "distbench.core.x": Imports({"distbench.run.session"}, set(), set(), set()),
        "distbench.run.session": Imports({"distbench.core.x"}, set(), set(), set()),
        "distbench.results.y": Imports({"distbench.ops.data"}, set(), set(), set()),
        "distbench.ops.data": Imports(set(), {"torch"}, set(), {"torch"}),
    }
    monkeypatch.setitem(globals(), "GRAPH", planted)
    monkeypatch.setitem(globals(), "MODULES", dict.fromkeys(planted))
    with pytest.raises(AssertionError, match="run is not below core"):
        test_imports_go_down("distbench.core.x")
    with pytest.raises(AssertionError, match="torch"):
        test_light_boxes_stay_light("distbench.results.y")
    with pytest.raises(AssertionError, match="cycles"):
        test_no_import_cycle()


# The variables a launcher hands a rank. platform/env.py reads them; slurm_mpi.py derives them
# from Slurm's and Open MPI's own.
LAUNCHER_VARIABLES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                      "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
                      "TORCHELASTIC_USE_AGENT_STORE"}
ENV_READERS = {"distbench.platform.env", "distbench.platform.slurm_mpi"}


def names_launcher_variables(name: str) -> set[str]:
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    return {n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and n.value in LAUNCHER_VARIABLES}


@pytest.mark.parametrize("name", sorted(set(MODULES) - ENV_READERS))
def test_only_platform_env_reads_the_launchers_variables(name):
    assert not names_launcher_variables(name), \
        f"{name} names launcher variables: ask distbench.platform.env instead"


def test_platform_env_is_where_they_are_read():
    """The list above is what env.py reads, so the test before it looks for the right names."""
    assert names_launcher_variables("distbench.platform.env") == LAUNCHER_VARIABLES
