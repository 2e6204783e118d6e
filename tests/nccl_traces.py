"""Synthetic traces for the NCCL-rules checker (nccl_rules.py): what each rank posted, written
as a traced run writes it."""

from __future__ import annotations

import json
from pathlib import Path


def write(where: Path, ranks: dict[int, list[dict]], complete: bool = True,
          groups: dict | None = None, alive: dict | None = None) -> Path:
    world = len(ranks)
    for r, events in ranks.items():
        end = {"end": True, "rank": r, "world": world, "complete": complete,
               "groups": groups or {"0": list(range(world))}, "alive": alive or {}}
        (where / f"rank{r}.jsonl").write_text(
            "\n".join(json.dumps(e) for e in [*events, end]) + "\n")
    return where


def send(peer: int, batch: int | None = None, size: int = 64, group: str = "0") -> dict:
    return {"op": "send", "group": group, "bytes": size, "dtype": "float32", "peer": peer,
            "batch": batch}


def recv(peer: int, batch: int | None = None, size: int = 64, group: str = "0") -> dict:
    return {"op": "recv", "group": group, "bytes": size, "dtype": "float32", "peer": peer,
            "batch": batch}


def allreduce(size: int = 64, group: str = "0") -> dict:
    return {"op": "all_reduce", "group": group, "bytes": size, "dtype": "float32"}
