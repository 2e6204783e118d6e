"""pp on real gloo workers: what pp.csv and run.json say. A schedule that cannot run: test_pp.py,
on the fake group."""

from __future__ import annotations

import csv

import pytest
from doc_columns import documented_columns
from helpers import distbench

pytestmark = pytest.mark.multiproc

ALL = ["naive", "gpipe", "1f1b", "interleaved-1f1b"]


def _header(res) -> list[str]:
    with open(res.run_dir / "pp.csv", newline="") as f:
        return next(csv.reader(f))


def _check_accounting(r: dict, p: int, m: int, v: int, mbs: int, seq: int, hidden: int):
    """What every ok row must satisfy, whatever the timings."""
    stages = p * v if r["schedule"] == "interleaved-1f1b" else p
    assert int(r["stages"]) == stages and int(r["world_size"]) == p
    assert int(r["micro_batches"]) == m and int(r["micro_batch_size"]) == mbs
    analytic = {"naive": (p - 1) / p, "gpipe": (p - 1) / (m + p - 1),
                "1f1b": (p - 1) / (m + p - 1),
                "interleaved-1f1b": (p - 1) / (v * m + p - 1)}[r["schedule"]]
    assert float(r["bubble_analytic"]) == pytest.approx(analytic, rel=1e-5)
    assert int(r["p2p_bytes_per_step"]) == 2 * (stages - 1) * m * mbs * seq * hidden * 4
    step = float(r["step_us"])
    t1 = float(r["t1_us"])
    assert step > 0 and t1 > 0
    assert float(r["speedup"]) == pytest.approx(t1 / step, rel=1e-4)
    assert float(r["efficiency"]) == pytest.approx(t1 / (p * step), rel=1e-4)
    assert float(r["samples_per_s"]) == pytest.approx(m * mbs / (step / 1e6), rel=1e-4)
    per_stage = [float(b) for b in r["bubble_measured_per_stage"].split("/")]
    assert len(per_stage) == p  # one per pipeline rank
    assert all(-0.05 < b < 1 for b in per_stage), per_stage
    assert float(r["bubble_measured"]) == pytest.approx(sum(per_stage) / p, abs=2e-3)
    assert float(r["max_abs_err"]) < 1e-5  # float32 gradients of a mean loss are ~1e-3
    assert float(r["p50_us"]) > 0 and float(r["p99_us"]) >= float(r["p50_us"])
    assert r["status"] == "ok" and r["backend"] == "gloo"


def test_two_ranks_every_schedule(tmp_path):
    # p=2, m=4: compute (two 1024x1024 linears per layer, 64 tokens per micro-batch, ~25 ms per
    # micro-batch per stage) dominates the 256 KiB activations sent per micro-batch
    p, m, mbs, seq, hidden = 2, 4, 2, 32, 1024
    res = distbench(tmp_path, "pp", "--workers", str(p), "--micro-batches", str(m),
                    "--micro-batch-size", str(mbs), "--seq-len", str(seq), "--hidden-size",
                    str(hidden), "--layers", "4", "--iters", "5", "--warmup", "1")
    assert res.code == 0, res.stderr
    assert _header(res) == documented_columns("pp.csv")
    rows = res.rows("pp.csv")
    assert [r["schedule"] for r in rows] == ALL
    for r in rows:
        _check_accounting(r, p, m, 2, mbs, seq, hidden)
    by = {r["schedule"]: r for r in rows}
    assert by["gpipe"]["layers_per_stage"] == "2/2"
    assert by["interleaved-1f1b"]["layers_per_stage"] == "1/1/1/1"
    assert by["interleaved-1f1b"]["virtual_stages"] == "2"
    assert len({r["t1_us"] for r in rows}) == 1  # one single-rank run serves every row
    # naive runs the whole batch through one stage at a time: bit-identical to the reference
    assert float(by["naive"]["max_abs_err"]) == 0.0

    gpipe = float(by["gpipe"]["bubble_measured"])
    naive = float(by["naive"]["bubble_measured"])
    print(f"\ngpipe p=2 m=4 bubble: measured {gpipe:.3f} "
          f"({by['gpipe']['bubble_measured_per_stage']}), analytic "
          f"{float(by['gpipe']['bubble_analytic']):.3f}; naive measured {naive:.3f}, "
          f"analytic 0.5")
    assert 0.05 < gpipe < 0.45, by["gpipe"]
    assert 0.35 < naive < 0.7, by["naive"]

    for name in ALL:
        assert name in res.stdout
    assert "bubble" in res.stdout and "speedup" in res.stdout
    meta = res.meta()
    assert meta["status"] == "ok" and meta["exit_code"] == 0 and meta["world_size"] == p
    assert meta["options"]["schedules"] == ALL
    assert (res.run_dir / "topo.txt").exists()


def test_three_ranks_uneven_split(tmp_path):
    p, m, v, mbs, seq, hidden = 3, 6, 2, 1, 16, 256
    res = distbench(tmp_path, "pp", "--workers", str(p), "--micro-batches", str(m),
                    "--virtual-stages", str(v), "--micro-batch-size", str(mbs), "--seq-len",
                    str(seq), "--hidden-size", str(hidden), "--layers", "7", "--iters", "3",
                    "--warmup", "1")
    assert res.code == 0, res.stderr
    rows = res.rows("pp.csv")
    assert [r["schedule"] for r in rows] == ALL
    for r in rows:
        _check_accounting(r, p, m, v, mbs, seq, hidden)
        want = "2/1/1/1/1/1" if r["schedule"] == "interleaved-1f1b" else "3/2/2"
        assert r["layers_per_stage"] == want
        assert r["layers"] == "7"


def test_a_corrupted_gradient_fails_the_run(tmp_path):
    res = distbench(tmp_path, "pp", "--workers", "2", "--schedule", "naive,1f1b",
                    "--micro-batches", "2", "--hidden-size", "64", "--seq-len", "8",
                    "--layers", "2", "--iters", "2", "--warmup", "1",
                    DISTBENCH_TEST_CORRUPT_RANK="1")
    assert res.code == 1, res.stderr
    rows = res.rows("pp.csv")  # every row is still written
    assert [r["schedule"] for r in rows] == ["naive", "1f1b"]
    for r in rows:
        assert float(r["max_abs_err"]) == pytest.approx(1.0, rel=1e-2)
        assert float(r["step_us"]) > 0
    meta = res.meta()
    assert meta["status"] == "wrong" and meta["exit_code"] == 1
    assert "wrong results" in res.stderr and "pp naive" in res.stderr
