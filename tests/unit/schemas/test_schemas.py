"""The schemas of the files distbench writes (distbench/schemas/): each is a valid draft 2020-12
schema, the files the real writers write validate against theirs, and a file with a key
missing or a value the writer never writes does not. The multi-process tests validate every
file their runs write (json_schemas.held, around helpers.distbench)."""

from __future__ import annotations

import copy
import json
import sys
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
from fake_nvml import NVMLError_NotSupported, _fake_pynvml, _no_nvidia_smi
from json_schemas import problems, validator
from paths import FIXTURES, REPO
from runs import accept_in_progress

from distbench import schemas
from distbench.core import exitcodes
from distbench.kinds.accept import files, verdicts
from distbench.kinds.accept.profile_files import load
from distbench.planner.inputs import CommFit, ComputePoint, Inputs
from distbench.platform import topo_probe
from distbench.results import writer

SCHEMA_DIR = Path(schemas.__file__).parent
PROFILE = load(REPO / "configs" / "profiles" / "cpu-gloo.toml")

# how each status ends a run (docs/results.md, Status values; distbench/core/exitcodes.py)
ENDINGS = [("ok", exitcodes.EXIT_OK), ("wrong", exitcodes.EXIT_WRONG),
           ("bad_input", exitcodes.EXIT_BAD_INPUT), ("failed", exitcodes.EXIT_FAILED),
           ("timeout", exitcodes.EXIT_FAILED), ("slow_links", exitcodes.EXIT_BELOW),
           ("below_expectation", exitcodes.EXIT_BELOW),
           ("inconclusive", exitcodes.EXIT_INCONCLUSIVE),
           ("interrupted", exitcodes.EXIT_INTERRUPTED),
           ("terminated", exitcodes.EXIT_TERMINATED), ("terminated", 129)]


def valid(name: str, doc) -> list[str]:
    return [e.message for e in validator(name).iter_errors(doc)]


def test_every_schema_file_is_a_valid_schema_and_named():
    on_disk = {p.name.removesuffix(".schema.json") for p in SCHEMA_DIR.glob("*.schema.json")}
    assert on_disk == set(schemas.SCHEMAS.values())
    for name in on_disk:
        s = schemas.schema(name)
        jsonschema.Draft202012Validator.check_schema(s)
        assert s["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        assert len(s["description"]) > 80, f"{name}: say what is strict and what is open"
    with pytest.raises(KeyError):
        schemas.schema("nothing")


def test_file_names_map_to_their_schemas():
    assert [schemas.schema_name_for(n) for n in (
        "run.json", "accept.json", "topo.json", "inputs.json", "watch.jsonl", "model.json",
        "p2p_matrix.samples.jsonl", "plan.csv", "x.json")] == [
        "run", "accept", "topo", "plan-inputs", "watch-line", "model", "samples-line", None,
        None]


# run.json ------------------------------------------------------------------------------------

def _record(tmp_path: Path, command: str = "collective") -> writer.RunRecord:
    record = writer.RunRecord(tmp_path, command, {"sizes": [1024], "baseline": None},
                              [command, "--sizes", "1K"])
    record.update()
    return record


def _read(path: Path) -> dict:
    return json.loads(path.read_text())


def test_run_json_as_written_at_start_and_at_each_ending(tmp_path):
    record = _record(tmp_path)
    assert problems(record.path) == []
    assert _read(record.path)["status"] == "running"
    # what a session adds once its ranks have started (session.open_run_dir)
    record.update(backend="gloo", world_size=2, nnodes=1,
                  versions={"torch": "2.10", "torch_path": "/x", "cuda": None, "nccl": None,
                            "nccl_library": None, "driver": None},
                  ranks=[{"rank": r, "host": "vm", "node": 0, "local_rank": r, "device": "cpu",
                          "pid": 100 + r, "gpu_uuid": None, "gpu_bus_id": None}
                         for r in range(2)])
    assert problems(record.path) == []
    for status, code in ENDINGS:
        record.finish(status, code, None if status == "ok" else f"{status} here")
        assert problems(record.path) == [], (status, code)


def test_run_json_with_lost_ranks_and_a_command_section(tmp_path):
    record = _record(tmp_path, "tp")
    record.update(tp={"seed": 1, "blocks": []})
    record.finish("failed", exitcodes.EXIT_FAILED, "rank 1 (vm:1) died",
                  lost_ranks=[{"rank": 1, "host": "vm", "local_rank": 1, "state": "dead",
                               "name": "vm:1"}], failed_step="all_reduce 1 KiB")
    assert problems(record.path) == []
    # the lowest rank left finishing a run whose rank 0 died
    other = tmp_path / "other"
    other.mkdir()
    _record(other)
    assert writer.mark_unfinished(other, "rank 0 died", exitcodes.EXIT_FAILED)
    assert problems(other / "run.json") == []


def _ended(tmp_path: Path) -> dict:
    record = _record(tmp_path)
    record.finish("ok", 0)
    return _read(record.path)


@pytest.mark.parametrize("mutate, why", [
    (lambda d: d.pop("status"), "'status' is a required property"),
    (lambda d: d.update(status="passed"), "is not one of"),
    (lambda d: d.update(exit_code=3), "0 was expected"),  # ok ends with 0
    (lambda d: d.update(status="running"), "is not of type 'null'"),  # no end yet
    (lambda d: d.update(status="terminated", exit_code=3), "is not one of"),
    (lambda d: d.update(schema_version=2), "1 was expected"),
    (lambda d: d.update(env={"HOME": "/root"}), "does not match"),
    (lambda d: d.update(tp=[1]), "is not of type 'object'"),  # a section is an object
    (lambda d: d.update(lost_ranks=[{"rank": 1, "host": "vm", "local_rank": 1,
                                     "state": "gone", "name": "vm:1"}]), "is not one of"),
    (lambda d: d.update(failed_step="x"), "'lost_ranks' is a dependency of 'failed_step'"),
    (lambda d: d.update(start_utc="yesterday"), "does not match"),
])
def test_run_json_mutants_fail(tmp_path, mutate, why):
    doc = _ended(tmp_path)
    assert valid("run", doc) == []
    mutate(doc)
    errors = valid("run", doc)
    assert any(why in e for e in errors), errors


# topo.json -----------------------------------------------------------------------------------

def test_topo_json_of_this_machine_validates(tmp_path):
    snap = topo_probe.node_snapshot()
    writer.write_topology(tmp_path, [snap], [{"rank": 0, "host": snap["host"], "node": 0,
                                              "local_rank": 0, "gpu_uuid": None,
                                              "gpu_bus_id": None}])
    assert problems(tmp_path / "topo.json") == []


def test_topo_json_of_gpus_validates_and_mutants_fail(tmp_path, monkeypatch):
    # two GPUs, one refused by NVML, PCIe queries failing: every shape a GPU entry takes
    fake = _fake_pynvml(nvlinks=(18, 0), fail_pcie=True,
                        field_errors={"nvmlDeviceGetNvLinkVersion": NVMLError_NotSupported()})
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    _no_nvidia_smi(monkeypatch)
    snaps = [topo_probe.node_snapshot()]
    monkeypatch.setitem(sys.modules, "pynvml",
                        _fake_pynvml(nvlinks=(18, 0), bad_handles={1: NVMLError_NotSupported()}))
    snaps.append({**topo_probe.node_snapshot(), "boot_id": "other"})
    snaps[0]["nvidia_smi_topo"] = (FIXTURES /
                                   "topo_dgx_h100_nv18.txt").read_text()
    del snaps[0]["nvidia_smi_error"]
    writer.write_topology(tmp_path, snaps)
    doc = _read(tmp_path / "topo.json")
    assert len(doc["nodes"][0]["gpu_links"]["links"]) == 56
    assert {"index": 1}.items() <= doc["nodes"][1]["gpus"][1].items()
    assert valid("topo", doc) == []
    for mutate in (lambda d: d["nodes"][0].pop("nvls"),
                   lambda d: d["nodes"][0]["gpus"][0].update(memory_total_bytes="80 GB"),
                   lambda d: d["nodes"][0]["gpus"][0].update(extra=1),
                   lambda d: d["nodes"][1].update(nvidia_smi_topo=None, nvidia_smi_error=None),
                   lambda d: d["nodes"][1].pop("nvidia_smi_error"),
                   lambda d: d["ranks"].append({"rank": 0})):
        bad = copy.deepcopy(doc)
        mutate(bad)
        assert valid("topo", bad), "a mutant validated"


# accept.json ---------------------------------------------------------------------------------

def _judged(time_us: float | None, wrong: int = 0) -> verdicts.Judged:
    check = PROFILE.checks[0]
    measured = [verdicts.Result(check, name, (i,), 2, time_us=time_us, wrong=wrong,
                                iters=10, size_bytes=check.size, spread=0.1)
                for i, name in enumerate("ab")]
    return verdicts.judge(measured, replace(PROFILE, checks=PROFILE.checks[:1]), ["a", "b"])


@pytest.mark.parametrize("time_us, wrong", [(1000.0, 0), (1e9, 0), (1000.0, 3), (None, 0)])
def test_accept_json_from_start_to_end_validates(tmp_path, time_us, wrong):
    progress = accept_in_progress(tmp_path)[0]
    path = tmp_path / "accept.json"
    assert problems(path) == []
    progress.begin(PROFILE.checks[0].name)
    assert problems(path) == []
    judged = _judged(time_us, wrong)
    progress.finished(PROFILE.checks[0].name, judged)
    assert problems(path) == []
    progress.conclude(judged)
    status, code, _ = progress.outcome
    progress.record.finish(status, code, None if code == 0 else "judged")
    progress.ended(status, code, None if code == 0 else "judged")
    assert problems(path) == [] and problems(tmp_path / "run.json") == []
    doc = _read(path)
    assert doc["verdicts"] and doc["verdict"] in files.VERDICT_WORDS.values()
    for mutate in (lambda d: d.pop("checks_done"),
                   lambda d: d.update(verdict="OK"),
                   lambda d: d.update(status="running"),  # a verdict while running
                   lambda d: d["verdicts"][0].update(verdict="pass"),
                   lambda d: d["verdicts"][0].update(measured=0),
                   lambda d: d["verdicts"][0].update(spread=-0.1),
                   lambda d: d["verdicts"][0].pop("retest")):
        bad = copy.deepcopy(doc)
        mutate(bad)
        assert valid("accept", bad), "a mutant validated"


def test_accept_json_stopped_halfway_validates(tmp_path):
    progress = accept_in_progress(tmp_path)[0]
    progress.begin(PROFILE.checks[0].name)
    progress.record.finish("interrupted", exitcodes.EXIT_INTERRUPTED, "interrupted by SIGINT")
    progress.ended("interrupted", exitcodes.EXIT_INTERRUPTED, "interrupted by SIGINT")
    assert problems(tmp_path / "accept.json") == []
    assert _read(tmp_path / "accept.json")["check_in_progress"] == PROFILE.checks[0].name


# inputs.json ---------------------------------------------------------------------------------

def _inputs() -> Inputs:
    inputs = Inputs(
        fits=[CommFit(op="all_reduce", ranks=8, span="node", alpha_us=20.0, beta_gbps=150.0,
                      source="a"),
              CommFit(op="sendrecv", ranks=2, span="nodes", alpha_us=5.0, beta_gbps=25.0,
                      per_node=1)],
        compute=[ComputePoint(tp=1, tokens=2048, layer_us=900.0, flops=3e12, source="b"),
                 ComputePoint(tp=2, tokens=2048, layer_us=500.0, flops=1.5e12,
                              with_tp_comm=True)],
        alone_ratio=0.6, compute_model={"hidden": 1024, "ffn": 4096, "heads": 16, "seq": 1024},
        optimizer_us_per_param=1e-4, overlap={"ddp": 0.4}, wrapper_us_per_layer={"zero3": 12.0},
        overlap_layouts={"ddp": "dp2"}, gpus_per_node=8, memory_per_gpu=80 * 2**30,
        device="NVIDIA H100 80GB HBM3", sources=["run"])
    inputs.note("scaled")
    return inputs


def test_inputs_json_validates_and_reads_back(tmp_path):
    _inputs().write(tmp_path)
    assert problems(tmp_path / "inputs.json") == []
    Inputs().write(tmp_path)  # nothing measured yet: the defaults
    assert problems(tmp_path / "inputs.json") == []
    _inputs().write(tmp_path)
    doc = _read(tmp_path / "inputs.json")
    assert Inputs.from_json(doc).fits == _inputs().fits
    for mutate in (lambda d: d.pop("bubble_weight"),
                   lambda d: d.update(unknown=1),  # from_json would refuse it too
                   lambda d: d["fits"][0].update(span="rack"),
                   lambda d: d["fits"][0].update(beta_gbps=0),
                   lambda d: d["overlap"].update(zero4=0.1),
                   lambda d: d.update(alone_ratio=1.5)):
        bad = copy.deepcopy(doc)
        mutate(bad)
        assert valid("plan-inputs", bad), "a mutant validated"


# watch.jsonl ---------------------------------------------------------------------------------

# the line issue 32's contract shows (/work/briefs/watch.md), as the watch command writes it
WATCH_LINE = {
    "schema_version": 1, "cycle": 0, "started": "2026-11-26T19:00:00Z", "duration_s": 0.8,
    "late": False, "interval_s": 2.0, "verdict": "unknown", "stragglers": [1],
    "late_counts": {"1": 3},
    "probes": [{"op": "all_reduce", "size_bytes": 1048576, "scope": "cluster",
                "dtype": "float32", "status": "ok", "time_us": 812.0, "busbw_gbps": 2.58,
                "rank_time_us": [800.0, 812.0], "late_rank": 0, "lateness_us": 12.0,
                "state": "unknown", "median_us": None, "p95_us": None, "cv": None,
                "baseline_us": None, "note": ""}],
    "changes": ["all_reduce 1 MiB: ok -> warn (...)"]}


def test_watch_line_of_the_contract_validates_and_mutants_fail(tmp_path):
    path = tmp_path / "watch.jsonl"
    skipped = {**WATCH_LINE["probes"][0], "status": "skipped", "time_us": None,
               "busbw_gbps": None, "rank_time_us": [], "late_rank": None, "lateness_us": None,
               "note": "cannot run here"}
    second = {**WATCH_LINE, "cycle": 1, "started": "2026-11-26T19:00:02+00:00",
              "verdict": "warn", "probes": [skipped], "late_counts": {}, "stragglers": []}
    path.write_text(json.dumps(WATCH_LINE) + "\n" + json.dumps(second) + "\n")
    assert problems(path) == []
    for mutate in (lambda d: d.pop("schema_version"),
                   lambda d: d.update(verdict="degraded"),
                   lambda d: d.update(late_counts={"rank1": 3}),
                   lambda d: d.update(started="2026-11-26T20:00:00+01:00"),  # not UTC
                   lambda d: d["probes"][0].update(status="running"),
                   lambda d: d["probes"][0].update(state="bad"),
                   lambda d: d["probes"][0].pop("late_rank"),
                   lambda d: d["probes"][0].update(spread=0.1)):
        bad = copy.deepcopy(WATCH_LINE)
        mutate(bad)
        path.write_text(json.dumps(WATCH_LINE) + "\n" + json.dumps(bad) + "\n")
        got = problems(path)
        assert got and all(":2: " in line for line in got), got


# what every file goes through ----------------------------------------------------------------

def test_samples_lines_as_the_writer_writes_them(tmp_path):
    sink = writer.CsvSink(tmp_path / "collective.csv", ["size_bytes"])
    sink.append({"size_bytes": 1}, [1.5, 2.25, 1e5], [1.5, 2.0])
    sink.append({"size_bytes": 2}, [3.0])
    sink.close()
    path = tmp_path / "collective.samples.jsonl"
    assert problems(path) == []
    path.write_text('{"row": 0, "us": [1, -2]}\n')
    assert problems(path)


def test_nan_is_no_json_and_an_unknown_file_has_no_schema(tmp_path):
    # Python writes NaN where a figure is one; the schema's bounds would let it through
    record = _record(tmp_path)
    assert problems(record.path) == []
    record.path.write_text(record.path.read_text().replace('"exit_code": null',
                                                           '"exit_code": NaN'))
    assert any("NaN is not JSON" in p for p in problems(record.path))
    (tmp_path / "cache.json").write_text("{}")
    assert "no schema" in problems(tmp_path / "cache.json")[0]
