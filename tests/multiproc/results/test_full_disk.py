"""A full results disk, for real: a small tmpfs fills up in the middle of the run. The run ends
with exit 3 and a line naming the file, every whole row stays (none cut in half), and run.json
says how the run ended, with no temporary file left beside it."""

from __future__ import annotations

import contextlib
import csv
import errno
import json
import subprocess
from pathlib import Path

import pytest
from helpers import distbench
from runs import planner_sources_run

from distbench.results import samples, writer

pytestmark = pytest.mark.multiproc


@pytest.fixture
def tiny_disk(tmp_path):
    def mount(size: str) -> Path:
        disk = tmp_path / f"disk-{size}"
        disk.mkdir()
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip() or proc.returncode}")
        mounted.append(disk)
        return disk

    mounted: list[Path] = []
    yield mount
    for disk in mounted:
        subprocess.run(["umount", str(disk)], check=False)


def _run_dir(disk: Path) -> Path:
    (run_dir,) = [p for p in disk.iterdir() if p.is_dir()]
    return run_dir


@pytest.mark.procs(3)  # mount, then a launcher and 2 workers
def test_disk_full_mid_sweep_keeps_whole_rows(tmp_path, tiny_disk):
    # a 4 KiB page each for run.json, topo.txt, topo.json, the CSV and its samples file (whose
    # lines, at one iteration a row, are a fifth as long as the CSV's: the CSV fills first)
    disk = tiny_disk("20k")
    res = distbench(disk, "collective", "--sizes", "64:64K:+1K", "--iters", "1", "--warmup", "1",
                    "--no-check", "--workers", "2")
    assert res.code == 3, res.stderr
    run_dir = _run_dir(disk)
    errors = [line for line in res.stderr.splitlines() if line.startswith("distbench: rank 0:")]
    assert len(errors) == 1, res.stderr
    assert f"cannot write {run_dir}/collective.csv: No space left on device" in errors[0]
    assert "Traceback" not in res.stderr
    with open(run_dir / "collective.csv", newline="") as f:
        rows = list(csv.reader(f))
    header, body = rows[0], rows[1:]
    assert 5 < len(body) < 64  # some fit, not all
    assert all(len(r) == len(header) for r in body)  # no row cut in half
    sizes = [int(r[header.index("size_bytes")]) for r in body]
    assert sizes == [64 + 1024 * i for i in range(len(body))]
    kept = samples.read(run_dir / "collective.samples.jsonl")  # whole lines, one per row
    assert sorted(kept) == list(range(len(body)))
    assert all(len(v.us) == 1 and v.us[0] > 0 for v in kept.values())
    meta = json.loads((run_dir / "run.json").read_text())
    assert (meta["status"], meta["exit_code"]) == ("failed", 3)
    assert "No space left on device" in meta["error"]
    assert not list(run_dir.glob("*.tmp"))


@pytest.mark.procs(3)
def test_disk_full_at_start_still_finishes_run_json(tmp_path, tiny_disk):
    disk = tiny_disk("4k")  # room for run.json alone
    res = distbench(disk, "collective", "--sizes", "1K", "--iters", "3", "--workers", "2")
    assert res.code == 3, res.stderr
    run_dir = _run_dir(disk)
    assert "No space left on device" in res.stderr and "Traceback" not in res.stderr
    meta = json.loads((run_dir / "run.json").read_text())
    assert (meta["status"], meta["exit_code"]) == ("failed", 3)
    assert not list(run_dir.glob("*.tmp"))


@pytest.mark.procs(3)
def test_a_read_only_results_disk_is_refused_before_workers(tmp_path, tiny_disk):
    disk = tiny_disk("64k")
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    out = disk / "results"
    proc = distbench(out, "collective", cwd=tmp_path, timeout=60)
    assert proc.code == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        f"distbench: error: --out: cannot write to {str(out)!r}: Read-only file system "
        "(example: --out results)"]


def _fill(disk: Path) -> None:
    """Every free block of `disk` taken by a file of its own."""
    with open(disk / "filler", "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"x" * 1024)


@pytest.mark.procs(1)  # the mount
def test_run_json_outgrowing_a_full_disk_is_never_cut(tmp_path, tiny_disk):
    # step's run.json grows as layouts end; once it outgrows its blocks on a full disk, the
    # rewrite in place used to stop at the last block: 4096 bytes of JSON no reader takes
    disk = tiny_disk("16k")
    record = writer.RunRecord(disk, "step", {"out": str(disk)}, ["step"])
    record.update()
    _fill(disk)
    layouts = {f"tp1 pp{i} dp1": {"step_ms": i * 1.5, "worst": "layers.1.mlp.up.weight " * 4}
               for i in range(60)}
    with pytest.raises(writer.PartlyWritten) as got:
        record.update(step={"layouts": layouts})
    assert (got.value.errno, got.value.filename) == (errno.ENOSPC, str(record.path))
    with pytest.raises(writer.PartlyWritten):  # the section still does not fit
        record.finish("failed", 3, f"cannot write {record.path}: No space left on device")
    meta = json.loads(record.path.read_text())
    assert (meta["status"], meta["exit_code"], meta["command"]) == ("failed", 3, "step")
    assert meta["error"].endswith("No space left on device") and meta["end_utc"]
    assert "step" not in meta  # the section that did not fit, and nothing cut
    assert not list(disk.glob("*.tmp"))


@pytest.mark.procs(1)
def test_run_json_a_little_bigger_on_a_full_disk_is_kept_whole(tmp_path, tiny_disk):
    disk = tiny_disk("16k")
    record = writer.RunRecord(disk, "collective", {"out": str(disk)}, ["collective"])
    record.update()
    _fill(disk)
    record.finish("ok", 0)  # longer than "running", compact it fits
    meta = json.loads(record.path.read_text())
    assert (meta["status"], meta["exit_code"], meta["env"]) == ("ok", 0, record.data["env"])


@pytest.mark.procs(2)  # the mount, then distbench planning with no worker
def test_a_plan_from_earlier_runs_on_a_full_disk_ends_failed_with_whole_rows(tmp_path,
                                                                              tiny_disk):
    run = planner_sources_run(tmp_path / "run")
    disk = tiny_disk("40k")  # run.json fits, the 1024-GPU plan.csv does not
    res = distbench(disk, "plan", "--from", str(run), "--gpus", "1024", "--gpus-per-node", "8",
                    "--model", "7b", cwd=tmp_path, procs=1)
    assert res.code == 3, res.stderr
    run_dir = _run_dir(disk)
    assert res.stderr.splitlines() == [
        f"distbench: error: cannot write {run_dir}/plan.csv: No space left on device"]
    meta = json.loads((run_dir / "run.json").read_text())
    assert (meta["status"], meta["exit_code"]) == ("failed", 3)
    assert meta["error"] == f"cannot write {run_dir}/plan.csv: No space left on device"
    with open(run_dir / "plan.csv", newline="") as f:
        header, *body = list(csv.reader(f))
    assert body and all(len(r) == len(header) for r in body)
    assert not (run_dir / "inputs.json").exists()  # not written, rather than 0 bytes
    assert not list(run_dir.glob("*.tmp"))
