"""Every JSON file a run writes, held to its schema (distbench/schemas/): helpers.distbench, cli
and torchrun_nodes wrap each run in `held`, so every test that runs distbench validates what
that run wrote, whatever the test asserts itself. A file written in the run with no schema
fails too: each file distbench writes has one."""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterable, Iterator
from functools import cache
from pathlib import Path

from distbench import schemas

# A run directory sits under --out (or the directory a run starts in), report's files one level
# further (<run>/report/): deeper trees (a checkout, a virtual environment) are not run output.
DEPTH = 3
SUFFIXES = (".json", ".jsonl")


@cache
def validator(name: str):
    import jsonschema

    schema = schemas.schema(name)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _no_constant(word: str):
    # Python's json writes and reads NaN and Infinity; JSON has neither, and a schema's bounds
    # let a NaN through (every comparison with it is false)
    raise ValueError(f"{word} is not JSON")


def documents(path: Path) -> list[tuple[str, object]]:
    """(where, value) for the file's one document, or each line of a .jsonl file."""
    text = path.read_text()
    if path.suffix == ".jsonl":
        return [(f"{path}:{i}", json.loads(line, parse_constant=_no_constant))
                for i, line in enumerate(text.splitlines(), 1) if line.strip()]
    return [(str(path), json.loads(text, parse_constant=_no_constant))]


def problems(path: Path) -> list[str]:
    """What is wrong with one file against its schema: one line each; [] when it holds."""
    if re.fullmatch(r"rank\d+\.jsonl", path.name):
        return []  # the suite's own record (run/comm_trace under DISTBENCH_TEST_COMM_TRACE)
    name = schemas.schema_name_for(path.name)
    if name is None:
        return [f"{path}: no schema in distbench/schemas for a file named {path.name!r}"]
    try:
        docs = documents(path)
    except ValueError as e:
        return [f"{path}: not JSON: {e}"]
    out = []
    for where, doc in docs:
        for e in sorted(validator(name).iter_errors(doc), key=lambda e: list(e.path)):
            at = "/".join(str(p) for p in e.absolute_path) or "(top)"
            out.append(f"{where}: {at}: {e.message} ({name}.schema.json)")
    return out


def _files(roots: Iterable[Path]) -> dict[Path, int]:
    """Each JSON file under the roots, DEPTH deep at most, with its modification time."""
    found: dict[Path, int] = {}
    for root in roots:
        root = Path(root)
        if not root.is_dir():
            continue
        for here, dirs, names in os.walk(root):
            depth = len(Path(here).relative_to(root).parts)
            dirs[:] = [] if depth >= DEPTH else [d for d in dirs if not d.startswith(".")]
            for n in names:
                if n.endswith(SUFFIXES):
                    path = Path(here) / n
                    with contextlib.suppress(OSError):
                        found[path] = path.stat().st_mtime_ns
    return found


@contextlib.contextmanager
def held(*roots: Path | None) -> Iterator[list[Path]]:
    """Around a run writing under `roots`: every JSON file it wrote or rewrote there, validated
    once it has ended (the list it yields names them, filled then)."""
    where = [r for r in roots if r is not None]
    before = _files(where)
    written: list[Path] = []
    yield written
    after = _files(where)
    written += sorted(p for p, t in after.items() if before.get(p) != t)
    bad = [line for p in written for line in problems(p)]
    assert not bad, "distbench wrote JSON its schema does not allow:\n" + "\n".join(bad)
