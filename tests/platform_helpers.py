"""Shared by the platform box's tests: runs sized past this machine, and what a refused run
must leave behind (nothing)."""

from __future__ import annotations

from pathlib import Path


def _nothing_created(tmp_path: Path, out: Path) -> None:
    assert not out.exists(), f"a refused run created {out}"
    assert list(tmp_path.iterdir()) == [], list(tmp_path.iterdir())


TOO_BIG = [
    (["collective", "--workers", "2", "--sizes", "1K,64G"], "--sizes"),
    (["p2p", "--workers", "2", "--sizes", "64G"], "--sizes"),
    (["tp", "--workers", "2", "--hidden-size", "200000", "--heads", "2", "--ffn-size", "2"],
     "--hidden-size"),
    (["pp", "--workers", "2", "--hidden-size", "100000"], "--hidden-size"),
    (["dp", "--workers", "2", "--hidden-size", "100000"], "--hidden-size"),
]
