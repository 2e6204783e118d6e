"""The run directory: CSV rows flushed one by one, run.json, topo.txt. Presentation lives
elsewhere (console.py); later tools read these files, so their shape is a contract."""

from __future__ import annotations

import csv
import json
import os
import platform
import sys
from datetime import UTC, datetime
from pathlib import Path

from distbench import __version__, topo

SCHEMA_VERSION = 1
RUN_DIR_ENV = "DISTBENCH_RUN_DIR"

ENV_PREFIXES = ("NCCL_", "GLOO_", "TORCH_", "MASTER_", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS",
                "NVIDIA_VISIBLE_DEVICES", "UCX_", "FI_")


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def new_run_dir(parent: Path, command: str) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    for i in range(1000):
        path = Path(parent) / (f"{stamp}-{command}" + (f"-{i}" if i else ""))
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free run directory name under {parent}")


def write_json(path: Path, data: dict) -> None:
    """Atomic: a reader (or a crash) never sees half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    os.replace(tmp, path)


def comm_environment() -> dict[str, str]:
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}


class CsvSink:
    """Appends one row per measurement and flushes it at once: a crash keeps what was measured."""

    def __init__(self, path: Path, columns: list[str]):
        self.path = path
        self.columns = columns
        self._file = open(path, "w", newline="")  # noqa: SIM115 - lives as long as the run
        self._writer = csv.DictWriter(self._file, fieldnames=columns, extrasaction="raise")
        self._writer.writeheader()
        self._file.flush()

    def append(self, row: dict) -> None:
        unknown = set(row) - set(self.columns)
        if unknown:  # a misspelt key would otherwise leave a silently empty cell
            raise KeyError(f"not columns of {self.path.name}: {sorted(unknown)}")
        self._writer.writerow({k: _cell(row.get(k)) for k in self.columns})
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class NullSink:
    """What ranks other than 0 write to: nothing."""

    def append(self, row: dict) -> None:
        pass

    def close(self) -> None:
        pass


def _cell(value):
    if value is None:
        return ""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float):
        return f"{value:.6g}" if abs(value) < 1e15 else repr(value)
    return value


class RunRecord:
    """run.json: written when the run starts (status "running") and rewritten when it ends, so an
    interrupted run still says what it was and how far it got."""

    def __init__(self, run_dir: Path, command: str, options: dict, argv: list[str]):
        self.path = Path(run_dir) / "run.json"
        self.data: dict = {
            "schema_version": SCHEMA_VERSION,
            "distbench_version": __version__,
            "command": command,
            "argv": argv,
            "options": options,
            "status": "running",
            "exit_code": None,
            "error": None,
            "start_utc": utc_now(),
            "end_utc": None,
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "env": comm_environment(),
        }

    def update(self, **fields) -> None:
        self.data.update(fields)
        write_json(self.path, self.data)

    def finish(self, status: str, exit_code: int, error: str | None = None) -> None:
        self.update(status=status, exit_code=exit_code, error=error, end_utc=utc_now())


def mark_unfinished(run_dir: Path, error: str, exit_code: int) -> bool:
    """Called by the local launcher after its workers ended: a run.json still saying "running"
    means rank 0 died before it could say so itself."""
    path = Path(run_dir) / "run.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    if data.get("status") != "running":
        return False
    data.update(status="failed", exit_code=exit_code, error=error, end_utc=utc_now())
    write_json(path, data)
    return True


def write_topology(run_dir: Path, snapshots: list[dict]) -> None:
    """topo.txt for people, topo.json for tools: the same snapshot in every run directory."""
    (run_dir / "topo.txt").write_text(topo.render_text(snapshots))
    nodes = [{**snap, "gpu_links": topo.parse_topo_matrix(snap.get("nvidia_smi_topo") or "")}
             for snap in snapshots]
    write_json(run_dir / "topo.json", {"schema_version": SCHEMA_VERSION, "nodes": nodes})
