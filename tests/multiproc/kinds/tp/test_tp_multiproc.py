"""tp on real gloo workers: what tp.csv and run.json say. The helpers tp shares with pp (t1 on
rank 0 alone, the check's verdict agreed across ranks) are in test_cross_rank.py."""

from __future__ import annotations

import pytest
from doc_columns import documented_columns
from helpers import distbench

from distbench.steps import tp_model as strat
from distbench.steps.stacks import StackShape

pytestmark = pytest.mark.multiproc

# (workers, dtype, element size, shape): an odd world size catches rounding in the splits
CASES = [
    (2, "float32", 4, StackShape(hidden_size=64, ffn_size=128, heads=4, seq_len=16,
                                 micro_batch_size=2, layers=2)),
    (3, "bfloat16", 2, StackShape(hidden_size=96, ffn_size=192, heads=6, seq_len=8,
                                  micro_batch_size=2, layers=3)),
]


def _args(n: int, dtype: str, sh: StackShape) -> list[str]:
    return ["tp", "--workers", str(n), "--dtype", dtype, "--hidden-size", str(sh.hidden_size),
            "--ffn-size", str(sh.ffn_size), "--heads", str(sh.heads), "--seq-len",
            str(sh.seq_len), "--micro-batch-size", str(sh.micro_batch_size), "--layers",
            str(sh.layers), "--iters", "3", "--warmup", "1"]


@pytest.mark.parametrize("n, dtype, elt, sh", CASES, ids=["2-float32", "3-bfloat16"])
def test_tp_rows(tmp_path, n, dtype, elt, sh):
    res = distbench(tmp_path, *_args(n, dtype, sh))
    assert res.code == 0, res.stderr
    with open(res.run_dir / "tp.csv") as f:
        assert f.readline().strip().split(",") == documented_columns("tp.csv")
    rows = res.rows("tp.csv")
    assert [r["block"] for r in rows] == ["mlp", "attention"]
    meta = res.meta()
    assert meta["status"] == "ok" and meta["exit_code"] == 0
    for r in rows:
        kind = r["block"]
        assert r["status"] == "ok" and r["dtype"] == dtype and r["backend"] == "gloo"
        assert int(r["world_size"]) == n and int(r["nnodes"]) == 1 and r["iters"] == "3"
        assert {k: int(r[k]) for k in sh.to_json()} == sh.to_json()
        step, compute = float(r["step_us"]), float(r["compute_only_us"])
        assert float(r["rank_min_us"]) <= step <= float(r["rank_max_us"])
        assert 0 <= int(r["slowest_rank"]) < n and float(r["p99_us"]) >= float(r["p50_us"]) > 0
        assert compute > 0
        # communication: the formula, and what DTensor was counted sending
        ar = 2 * sh.layers * sh.micro_batch_size * sh.seq_len * sh.hidden_size * elt
        assert int(r["allreduce_bytes_per_step"]) == ar
        counted = meta["tp"]["blocks"][kind]
        assert counted["allreduce_bytes_counted"] == ar
        assert counted["collectives_counted"] == {"all_reduce": 2 * sh.layers}
        comm = float(r["comm_pct"])
        assert 0 <= comm <= 100  # percent, like cv_pct
        assert comm == pytest.approx(100 * max(0.0, 1 - compute / step), abs=2e-3)
        if step > compute:
            want = ar * 2 * (n - 1) / n / ((step - compute) / 1e6) / 1e9
            assert float(r["implied_busbw_gbps"]) == pytest.approx(want, rel=1e-3)
        else:
            assert r["implied_busbw_gbps"] == ""
        # throughput
        assert float(r["tflops_per_rank"]) == pytest.approx(
            strat.flops_per_rank(kind, sh, n) / (step / 1e6) / 1e12, rel=1e-4)
        assert float(r["tokens_per_s"]) == pytest.approx(sh.tokens / (step / 1e6), rel=1e-4)
        # scaling view: t1 from one rank running the whole problem
        t1 = float(r["t1_us"])
        assert t1 > 0
        assert float(r["speedup"]) == pytest.approx(t1 / step, rel=1e-4)
        assert float(r["efficiency"]) == pytest.approx(float(r["speedup"]) / n, rel=1e-4)
        # correctness against the single-rank reference
        assert meta["tp"]["blocks"][kind]["check"]["worst_err_over_tolerance"] < 1
        limit = 1e-4 if dtype == "float32" else 0.25
        assert 0 <= float(r["max_abs_err"]) < limit
    assert meta["tp"]["check"]["configured_shapes"] is True
    assert meta["tp"]["shape"] == meta["tp"]["check"]["shape"] == {
        "hidden_size": sh.hidden_size, "seq_len": sh.seq_len,
        "micro_batch_size": sh.micro_batch_size, "layers": sh.layers, "ffn_size": sh.ffn_size,
        "heads": sh.heads}
    # the table on stdout: one line per block
    lines = [ln.split() for ln in res.stdout.splitlines() if not ln.startswith("#")]
    assert [ln[0] for ln in lines] == ["mlp", "attention"]
    assert float(lines[0][1]) == pytest.approx(float(rows[0]["step_us"]) / 1e3, abs=0.01)
    for name in ("run.json", "topo.txt"):
        assert (res.run_dir / name).exists()


def test_corrupted_output_fails_the_run_after_writing_the_rows(tmp_path):
    sh = CASES[0][3]
    res = distbench(tmp_path, *_args(2, "float32", sh), DISTBENCH_TEST_CORRUPT_RANK="1")
    assert res.code == 1, res.stderr
    rows = res.rows("tp.csv")
    assert [r["block"] for r in rows] == ["mlp", "attention"]  # every row still written
    for r in rows:
        assert r["status"] == "wrong" and float(r["max_abs_err"]) == pytest.approx(1.0, rel=1e-3)
        assert "WRONG: output" in r["note"]
    meta = res.meta()
    assert meta["status"] == "wrong" and meta["exit_code"] == 1
    errors = [ln for ln in res.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1 and "wrong results: tp mlp float32: output differs" in errors[0]
