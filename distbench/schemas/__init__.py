"""The JSON Schema (draft 2020-12) of every JSON file distbench writes, shipped as package data
so a tool can validate a run directory without distbench's code (docs/results.md#schemas).
Imports nothing of ours, nor torch: a schema is a fact about a file, read where it is needed."""

from __future__ import annotations

import fnmatch
import json
from functools import cache
from importlib import resources

# a file's name (a glob for the samples beside every CSV) -> its schema's name; a .jsonl file's
# schema is of one line
SCHEMAS = {
    "run.json": "run",
    "accept.json": "accept",
    "topo.json": "topo",
    "inputs.json": "plan-inputs",
    "model.json": "model",
    "watch.jsonl": "watch-line",
    "*.samples.jsonl": "samples-line",
}


@cache
def _text(name: str) -> str:
    return resources.files(__name__).joinpath(f"{name}.schema.json").read_text(encoding="utf-8")


def schema(name: str) -> dict:
    """The schema `name` ("run", "watch-line", ...) as a fresh dict. KeyError for no such
    schema."""
    if name not in SCHEMAS.values():
        raise KeyError(f"no schema {name!r} (known: {', '.join(sorted(SCHEMAS.values()))})")
    return json.loads(_text(name))


def schema_name_for(file_name: str) -> str | None:
    """The schema of a file distbench writes under this name, or None."""
    return next((s for pattern, s in SCHEMAS.items() if fnmatch.fnmatchcase(file_name, pattern)),
                None)
