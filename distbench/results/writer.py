"""The run directory: CSV rows flushed one by one, run.json, topo.txt. Presentation lives
elsewhere (console.py); later tools read these files, so their shape is a contract."""

from __future__ import annotations

import contextlib
import csv
import errno
import io
import json
import math
import os
import platform
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from distbench import __version__
from distbench.platform import topo_parse, topo_render
from distbench.results import samples

SCHEMA_VERSION = 1

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


# What run.json always holds, a full disk or not: what the run was and how it ended. A command's
# own sections (step's layouts, accept's summary) are what a full disk may cost.
RUN_KEYS = ("schema_version", "distbench_version", "command", "argv", "options", "status",
            "exit_code", "error", "start_utc", "end_utc", "python", "platform", "env",
            "backend", "versions", "world_size", "nnodes", "lost_ranks", "failed_step")


def write_json(path: Path, data: dict, keep: tuple[str, ...] | None = None) -> None:
    """Atomic: a reader (or a crash) never sees half a file, and a failed write (a full disk)
    leaves the previous file as it was, with no temporary beside it.

    On a full disk a file that exists is rewritten in place, which frees its old blocks first:
    the only way left to say how a run ended. That rewrite never leaves the file cut (a JSON
    no reader takes): indented, else compact, else, with `keep` (the fields that must stay),
    only those. The last one is no larger than what any earlier version held, so it fits
    the blocks the truncation freed."""
    data = _finite(data)
    text = json.dumps(data, indent=2, sort_keys=False, default=str) + "\n"
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        if e.errno != errno.ENOSPC or not path.exists():
            raise OSError(e.errno, e.strerror, str(path)) from None
        forms = [text, json.dumps(data, separators=(",", ":"), default=str)]
        if keep is not None:
            forms.append(json.dumps({k: data[k] for k in keep if k in data},
                                    separators=(",", ":"), default=str))
        for i, form in enumerate(forms):
            try:
                path.write_text(form)
            except OSError:
                continue
            if i < 2:
                return
            raise PartlyWritten(e.errno, e.strerror, str(path)) from None
        with contextlib.suppress(OSError):  # not even that: no file beats a cut one
            path.unlink()
        raise OSError(e.errno, e.strerror, str(path)) from None


def _finite(value):
    """NaN and infinity as null: json.dumps writes them as NaN and Infinity, which are not JSON
    (jq, JavaScript and Go refuse the file), and a figure that is not a number is unknown."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


class PartlyWritten(OSError):
    """A full disk let write_json keep only the fields it was told to keep."""


def comm_environment() -> dict[str, str]:
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}


class Appender:
    """A file written a whole record at a time and flushed at once: a crash keeps what was
    measured, and a failed write (a full disk mid-record) cuts the file back to its last whole
    record and raises an OSError naming the file."""

    def __init__(self, path: Path):
        self.path = path
        self._file = open(path, "w", newline="")  # noqa: SIM115 - lives as long as the run
        self._complete = 0  # bytes on disk that end with a whole record

    def write(self, text: str) -> None:
        try:
            self._file.write(text)
            self._file.flush()
            self._complete = self._file.tell()
        except OSError as e:
            self.close()
            with contextlib.suppress(OSError):
                os.truncate(self.path, self._complete)
            raise OSError(e.errno, e.strerror, str(self.path)) from None

    def close(self) -> None:
        with contextlib.suppress(OSError):  # a failed flush was reported when it failed
            self._file.close()


class CsvSink:
    """Appends one row per measurement and flushes it at once, and the row's per-iteration
    samples to the file beside it (samples.py) when it has them."""

    def __init__(self, path: Path, columns: list[str]):
        self.path = path
        self.columns = columns
        self._out = Appender(path)
        self._samples: Appender | None = None
        self._rows = 0
        self._out.write(self._line(dict(zip(columns, columns, strict=True))))

    def _line(self, cells: dict) -> str:
        buf = io.StringIO()
        csv.DictWriter(buf, fieldnames=self.columns, extrasaction="raise").writerow(cells)
        return buf.getvalue()

    def append(self, row: dict, samples_us: Sequence[float] = (),
               reps_us: Sequence[float] = ()) -> None:
        unknown = set(row) - set(self.columns)
        if unknown:  # a misspelt key would otherwise leave a silently empty cell
            raise KeyError(f"not columns of {self.path.name}: {sorted(unknown)}")
        self._out.write(self._line({k: csv_cell(row.get(k)) for k in self.columns}))
        index, self._rows = self._rows, self._rows + 1
        if samples_us:
            if self._samples is None:
                self._samples = Appender(samples.path_for(self.path))
            self._samples.write(samples.encode(index, samples_us, reps_us))

    def close(self) -> None:
        self._out.close()
        if self._samples is not None:
            self._samples.close()


class NullSink:
    """What ranks other than 0 write to: nothing."""

    def append(self, row: dict, samples_us: Sequence[float] = (),
               reps_us: Sequence[float] = ()) -> None:
        pass

    def close(self) -> None:
        pass


def csv_cell(value):
    """A value as every CSV of distbench writes it: none empty, a bool 0/1, a float to 6
    significant digits (in full where those would lose its integer part)."""
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

    @classmethod
    def in_new_dir(cls, parent: Path, command: str, options: dict,
                   argv: list[str]) -> RunRecord:
        """The record of a run whose directory is made now, under `parent` (record.path.parent):
        what run.json holds is gathered before the directory exists (the platform's name reads
        the interpreter's file, tens of milliseconds), so that the caller's first update()
        follows the directory at once, and a launcher killed at any moment (SIGKILL cannot
        wait) leaves no run directory without its run.json, but for that write's own instant."""
        record = cls(Path(parent), command, options, argv)
        record.path = new_run_dir(parent, command) / "run.json"
        return record

    def update(self, **fields) -> None:
        self.data.update(fields)
        write_json(self.path, self.data, keep=RUN_KEYS)

    def finish(self, status: str, exit_code: int, error: str | None = None, **fields) -> None:
        """`fields`: what the ending adds (lost_ranks and failed_step when ranks were lost)."""
        self.update(status=status, exit_code=exit_code, error=error, end_utc=utc_now(), **fields)


def read_run_json(run_dir: Path) -> dict | None:
    try:
        return json.loads((Path(run_dir) / "run.json").read_text())
    except (OSError, ValueError):
        return None


def mark_unfinished(run_dir: Path, error: str, exit_code: int, status: str = "failed",
                    **fields) -> bool:
    """For a run whose rank 0 died (or was stopped) before it could say how the run ended: the
    local launcher after its workers ended, or the lowest rank left. Only a run.json still
    saying "running" is changed."""
    path = Path(run_dir) / "run.json"
    data = read_run_json(run_dir)
    if data is None or data.get("status") != "running":
        return False
    data.update(status=status, exit_code=exit_code, error=error, end_utc=utc_now(), **fields)
    try:
        write_json(path, data, keep=RUN_KEYS)
    except PartlyWritten:
        pass  # how the run ended is said, which is all this adds
    except OSError as e:
        print(f"distbench: error: cannot finish {path}: {e.strerror}; it may still say "
              "\"running\"", file=sys.stderr)
    return True


def write_topology(run_dir: Path, snapshots: list[dict], ranks: list[dict] | None = None
                   ) -> None:
    """topo.txt for people, topo.json for tools: the same snapshot in every run directory, and
    in topo.json which physical GPU each rank ran on."""
    (run_dir / "topo.txt").write_text(topo_render.render_text(snapshots))
    nodes = [{**snap, "gpu_links": topo_parse.parse_topo_matrix(snap.get("nvidia_smi_topo") or "")}
             for snap in snapshots]
    placed = [{k: r.get(k) for k in ("rank", "host", "node", "local_rank", "gpu_uuid",
                                     "gpu_bus_id")} for r in ranks or []]
    write_json(run_dir / "topo.json", {"schema_version": SCHEMA_VERSION, "nodes": nodes,
                                       "ranks": placed})
