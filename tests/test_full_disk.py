"""A full results disk, for real: a small tmpfs fills up in the middle of the run. The run ends
with exit 3 and a line naming the file, every whole row stays (none cut in half), and run.json
says how the run ended, with no temporary file left beside it."""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import pytest
from helpers import distbench

from distbench.results import samples

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
