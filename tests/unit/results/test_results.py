"""The run directory contract (distbench.results.writer): CSV rows on disk at once, run.json
states."""

from __future__ import annotations

import csv
import json
from datetime import UTC, datetime

import pytest

from distbench.kinds.collective.output import OUTPUT as COLLECTIVE
from distbench.results import writer

DESIGN_COLUMNS = [
    "op", "dtype", "redop", "root", "in_place", "world_size", "nnodes", "size_bytes", "count",
    "iters", "time_us", "rank_min_us", "rank_max_us", "slowest_rank", "p50_us", "p99_us",
    "cv_pct", "algbw_gbps", "busbw_gbps", "wrong",
]


def _read(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_collective_columns_begin_with_the_design_list():
    assert list(COLLECTIVE.csv[:len(DESIGN_COLUMNS)]) == DESIGN_COLUMNS
    assert len(set(COLLECTIVE.csv)) == len(COLLECTIVE.csv)


def test_csv_sink_rows_on_disk_immediately(tmp_path):
    path = tmp_path / "collective.csv"
    cols = ["op", "in_place", "root", "time_us", "size_bytes", "note"]
    sink = writer.CsvSink(path, cols)
    try:
        assert _read(path) == [cols]  # header before any row
        sink.append({"op": "all_reduce", "in_place": True, "root": None, "time_us": 12.5,
                     "size_bytes": 1024, "note": "x"})
        assert _read(path) == [cols, ["all_reduce", "1", "", "12.5", "1024", "x"]]
        sink.append({"op": "broadcast", "in_place": False, "root": 0, "time_us": 1 / 3,
                     "size_bytes": 8})  # missing key -> empty cell
        rows = _read(path)
        assert rows[2] == ["broadcast", "0", "0", "0.333333", "8", ""]
        assert len(rows) == 3
    finally:
        sink.close()
    assert len(_read(path)) == 3


@pytest.mark.parametrize(("value", "cell"), [
    (None, ""), (True, "1"), (False, "0"), (0, "0"), (3, "3"), ("s", "s"),
    (2.0, "2"), (1234.56789, "1234.57"), (0.000123456789, "0.000123457"), (1e20, "1e+20"),
])
def test_csv_cells(tmp_path, value, cell):
    path = tmp_path / "t.csv"
    sink = writer.CsvSink(path, ["a"])
    sink.append({"a": value})
    sink.close()
    assert _read(path)[1] == [cell]


def test_run_record_lifecycle(tmp_path):
    rec = writer.RunRecord(tmp_path, "collective", {"op": "all_reduce"}, ["collective", "-x"])
    assert not (tmp_path / "run.json").exists()
    rec.update(world_size=2)
    data = json.loads((tmp_path / "run.json").read_text())
    assert data["status"] == "running"
    assert data["exit_code"] is None and data["end_utc"] is None
    assert data["world_size"] == 2
    assert data["command"] == "collective"
    assert data["options"] == {"op": "all_reduce"}
    assert data["argv"] == ["collective", "-x"]
    assert data["schema_version"] == writer.SCHEMA_VERSION
    datetime.fromisoformat(data["start_utc"])

    rec.finish("ok", 0)
    data = json.loads((tmp_path / "run.json").read_text())
    assert data["status"] == "ok" and data["exit_code"] == 0 and data["error"] is None
    assert data["world_size"] == 2  # earlier fields survive
    end = datetime.fromisoformat(data["end_utc"])
    assert end >= datetime.fromisoformat(data["start_utc"])
    assert not list(tmp_path.glob("*.tmp"))  # atomic write left nothing behind

    # a finished run is not touched by the launcher's fallback
    assert writer.mark_unfinished(tmp_path, "rank 1 died", 1) is False
    assert json.loads((tmp_path / "run.json").read_text())["status"] == "ok"


def test_run_record_failure(tmp_path):
    rec = writer.RunRecord(tmp_path, "collective", {}, [])
    rec.update()
    rec.finish("failed", 3, "wrong results: all_reduce 1024 B rank 1")
    data = json.loads((tmp_path / "run.json").read_text())
    assert (data["status"], data["exit_code"]) == ("failed", 3)
    assert data["error"] == "wrong results: all_reduce 1024 B rank 1"


def test_mark_unfinished_flips_running(tmp_path):
    rec = writer.RunRecord(tmp_path, "collective", {}, [])
    rec.update()
    assert writer.mark_unfinished(tmp_path, "worker exited with code -9", 137) is True
    data = json.loads((tmp_path / "run.json").read_text())
    assert data["status"] == "failed"
    assert data["error"] == "worker exited with code -9"
    assert data["exit_code"] == 137
    assert data["end_utc"] is not None
    assert writer.mark_unfinished(tmp_path, "again", 1) is False  # no longer running
    assert json.loads((tmp_path / "run.json").read_text())["error"] == "worker exited with code -9"


def test_mark_unfinished_missing_or_unreadable(tmp_path):
    assert writer.mark_unfinished(tmp_path, "e", 1) is False
    assert writer.mark_unfinished(tmp_path / "nope", "e", 1) is False
    (tmp_path / "run.json").write_text("{not json")
    assert writer.mark_unfinished(tmp_path, "e", 1) is False
    assert (tmp_path / "run.json").read_text() == "{not json"


def test_new_run_dir_unique_in_the_same_second(tmp_path, monkeypatch):
    fixed = datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)

    class FrozenDatetime(datetime):
        @classmethod
        def now(cls, tz=None):
            return fixed

    monkeypatch.setattr(writer, "datetime", FrozenDatetime)
    parent = tmp_path / "results"  # created on demand
    a = writer.new_run_dir(parent, "collective")
    b = writer.new_run_dir(parent, "collective")
    c = writer.new_run_dir(parent, "collective")
    assert len({a, b, c}) == 3
    assert all(p.is_dir() and p.parent == parent for p in (a, b, c))
    assert a.name == "20240506T070809Z-collective"
    assert all(p.name.startswith(a.name) for p in (b, c))
    # a different command in the same second gets its own name
    assert writer.new_run_dir(parent, "p2p").name == "20240506T070809Z-p2p"


def test_what_run_json_holds_is_gathered_before_its_directory_exists(tmp_path, monkeypatch):
    """A launcher SIGKILLed between making its run directory and writing run.json leaves a
    directory no reader can read: the platform's name (which reads the interpreter's file) is
    asked first, so the first write follows the directory at once."""
    events = []
    real_platform, real_new = writer.platform.platform, writer.new_run_dir
    monkeypatch.setattr(writer.platform, "platform",
                        lambda: events.append("platform") or real_platform())
    monkeypatch.setattr(writer, "new_run_dir", lambda *a: events.append("mkdir") or real_new(*a))
    record = writer.RunRecord.in_new_dir(tmp_path, "collective", {}, [])
    assert events == ["platform", "mkdir"]
    assert record.path.parent.parent == tmp_path and not record.path.exists()
    record.update()
    assert json.loads(record.path.read_text())["command"] == "collective"

def test_new_run_dir_real_clock(tmp_path):
    a = writer.new_run_dir(tmp_path, "collective")
    b = writer.new_run_dir(tmp_path, "collective")
    assert a != b and a.is_dir() and b.is_dir()


def test_json_written_is_json_nan_and_infinity_as_null(tmp_path):
    """json.dumps writes NaN and Infinity, which jq, JavaScript and Go refuse: a figure that is
    not a number is written as unknown."""
    path = tmp_path / "run.json"
    writer.write_json(path, {"a": float("nan"), "b": [1.5, float("inf"), (float("-inf"),)],
                             "c": {"d": 2.0, "e": "NaN"}})

    def refuse(constant):
        raise AssertionError(f"{constant} in {path.read_text()}")
    assert json.loads(path.read_text(), parse_constant=refuse) == {
        "a": None, "b": [1.5, None, [None]], "c": {"d": 2.0, "e": "NaN"}}
