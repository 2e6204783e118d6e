"""dp on real gloo workers: what dp.csv and run.json say for every mode at 2 and 3 ranks, a wrong
result, and a slowed all-reduce. A mode one rank cannot run: test_dp.py, on the fake group."""

from __future__ import annotations

import pytest
from doc_columns import documented_columns
from helpers import Run, distbench

from distbench.steps.stacks import StackShape

pytestmark = pytest.mark.multiproc

# (workers, dtype, element size, block, shape): an odd world size pads FSDP's shards
CASES = [
    (2, "float32", 4, "mlp", StackShape(hidden_size=64, ffn_size=128, heads=4, seq_len=16,
                                        micro_batch_size=2, layers=2)),
    (3, "bfloat16", 2, "attention", StackShape(hidden_size=64, ffn_size=128, heads=4,
                                               seq_len=8, micro_batch_size=2, layers=3)),
]
# DDP's bucket sizes by world size: at 2 ranks also one that splits the gradients in several
BUCKETS = {2: ["0.02", "25"], 3: ["25"]}


def _args(n: int, dtype: str, block: str, sh: StackShape, *more: str) -> list[str]:
    return ["dp", "--workers", str(n), "--dtype", dtype, "--block", block, "--hidden-size",
            str(sh.hidden_size), "--ffn-size", str(sh.ffn_size), "--heads", str(sh.heads),
            "--seq-len", str(sh.seq_len), "--micro-batch-size", str(sh.micro_batch_size),
            "--layers", str(sh.layers), "--iters", "3", "--warmup", "1", *more]


def _weights(block: str, sh: StackShape) -> list[tuple[int, int]]:
    h, f = sh.hidden_size, sh.ffn_size
    return ([(f, h), (h, f)] if block == "mlp" else [(3 * h, h), (h, h)]) * sh.layers


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Run:
    """CASES[0] on every mode, two DDP bucket sizes: test_dp_rows reads all of it, the slowed
    all-reduce's test its ddp 0.02 MiB row as the base, unslowed."""
    n, dtype, _, block, sh = CASES[0]
    return distbench(tmp_path_factory.mktemp("two-ranks"),
                     *_args(n, dtype, block, sh, "--bucket-cap-mb", ",".join(BUCKETS[n])))


# Two runs compared, each perhaps beside another test's load: the delay planted is large enough
# (50 ms a bucket) that a neighbour's load moves the compute-only time by much less than the
# quarter of it allowed.
def test_a_slowed_allreduce_shows_as_exposed_communication(tmp_path, two_ranks):
    """Rank 1 waits before every gradient bucket's all-reduce, as a slow link would make it:
    the exposed communication grows by about the delays, the compute-only time does not. The
    base is two_ranks' ddp 0.02 MiB row: the same shape, bucket and iterations, no delay."""
    n, dtype, _, block, sh = CASES[0]
    args = _args(n, dtype, block, sh, "--mode", "ddp", "--bucket-cap-mb", "0.02", "--no-check")
    delay = 0.05
    base = two_ranks
    slow = distbench(tmp_path, *args, DISTBENCH_TEST_SLOW_RANK=f"1:{delay}")
    assert base.code == 0, base.stderr
    assert slow.code == 0, slow.stderr
    (b,) = [r for r in base.rows("dp.csv") if (r["mode"], r["bucket_cap_mb"]) == ("ddp", "0.02")]
    (s,) = slow.rows("dp.csv")
    buckets = slow.meta()["dp"]["modes"]["ddp 0.02 MiB"]["collectives_counted"]["all_reduce"]
    assert buckets >= 2  # 0.02 MiB buckets split the 128 KiB of gradients
    added = buckets * delay * 1e6
    grew = float(s["exposed_comm_us"]) - float(b["exposed_comm_us"])
    assert 0.5 * added < grew < 3 * added + 50_000, (grew, added)
    assert float(s["comm_alone_us"]) > 0.5 * added  # the same collectives, alone, slowed too
    # compute-only has no all-reduce to slow: it stays where it was, up to this VM's noise
    assert abs(float(s["compute_only_us"]) - float(b["compute_only_us"])) < 0.25 * added


@pytest.mark.parametrize("n, dtype, elt, block, sh", CASES, ids=["2-float32-mlp",
                                                                 "3-bfloat16-attention"])
def test_dp_rows(tmp_path, request, n, dtype, elt, block, sh):
    buckets = BUCKETS[n]
    res = request.getfixturevalue("two_ranks") if n == 2 else distbench(
        tmp_path, *_args(n, dtype, block, sh, "--bucket-cap-mb", ",".join(buckets)))
    assert res.code == 0, res.stderr
    with open(res.run_dir / "dp.csv") as f:
        assert f.readline().strip().split(",") == documented_columns("dp.csv")
    rows = res.rows("dp.csv")
    modes = ["ddp"] * len(buckets) + ["zero1", "zero2", "zero3"]
    assert [r["mode"] for r in rows] == modes
    assert [r["bucket_cap_mb"] for r in rows] == [*buckets, buckets[0], "", ""]
    meta = res.meta()
    assert meta["status"] == "ok" and meta["exit_code"] == 0
    weights = _weights(block, sh)
    psi = sum(a * b for a, b in weights)
    padded = sum(-(-a // n) * n * b for a, b in weights)  # FSDP pads dim 0 to n chunks
    shard = padded // n
    assert meta["dp"]["params"] == psi
    half = dtype == "bfloat16"
    state: dict[str, int] = {}
    for r in rows:
        mode = r["mode"]
        info = meta["dp"]["modes"][mode if mode != "ddp" and mode != "zero1"
                                   else f"{mode} {float(r['bucket_cap_mb']):g} MiB"]
        assert r["status"] == "ok" and r["dtype"] == dtype and r["backend"] == "gloo"
        assert int(r["world_size"]) == n and r["iters"] == "3" and r["block"] == block
        assert int(r["params"]) == psi
        step, compute = float(r["step_us"]), float(r["compute_only_us"])
        alone, exposed = float(r["comm_alone_us"]), float(r["exposed_comm_us"])
        assert float(r["rank_min_us"]) <= step <= float(r["rank_max_us"])
        assert float(r["p99_us"]) >= float(r["p50_us"]) > 0 and compute > 0 and alone > 0
        # the CSV keeps 6 significant digits of each
        assert exposed == pytest.approx(step - compute, abs=1e-5 * (step + compute))
        want = 100 * (1 - exposed / alone)
        overlap = float(r["overlap_pct"])
        assert overlap == pytest.approx(min(100.0, max(0.0, want)), abs=1e-2)
        if abs(want) > 0.1 and abs(want - 100) > 0.1:  # not on the clamp's edge
            assert ("overlap_pct clamped" in r["note"]) == (not 0 <= want <= 100)
        # bytes: the closed form, and what the dispatcher saw the mode issue
        counts, sizes = info["collectives_counted"], info["bytes_counted"]
        if mode == "ddp":
            want_bytes = psi * elt
            assert set(counts) == {"all_reduce"}
        elif mode == "zero1":
            want_bytes = 2 * psi * elt
            assert counts["broadcast"] == len(weights) and sizes["broadcast"] == psi * elt
            assert sizes["all_reduce"] == psi * elt
        else:
            gathers = 2 if mode == "zero3" else 1
            want_bytes = (gathers + 1) * padded * elt
            assert counts == {"all_gather": gathers * sh.layers, "reduce_scatter": sh.layers}
            assert sizes == {"all_gather": gathers * padded * elt,
                             "reduce_scatter": padded * elt}
        assert int(r["bytes_per_step"]) == want_bytes == sum(sizes.values())
        assert int(r["bytes_counted"]) == want_bytes
        assert "formula says" not in r["note"]
        factor = {"all_reduce": 2 * (n - 1) / n, "broadcast": 1.0,
                  "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n}
        bus = sum(sizes[k] * factor[k] for k in sizes)
        assert float(r["implied_busbw_gbps"]) == pytest.approx(bus / (alone / 1e6) / 1e9,
                                                               rel=1e-3)
        # state per rank, from the tensors, beside the ZeRO table
        measured, formula = int(r["state_bytes_per_rank"]), float(r["state_bytes_formula"])
        k, s_elt = (12, 4) if half else (2 * elt, elt)
        table = {"ddp": (2 * elt + k) * psi, "zero1": 2 * elt * psi + k * psi / n,
                 "zero2": elt * padded + 4 * s_elt * shard, "zero3": 4 * s_elt * shard}[mode]
        assert formula == pytest.approx(table, abs=1)
        steps = 4 * 2 * len(weights)  # AdamW's step counters, 4 B each (+ master copies')
        if mode == "zero1":  # partitioned by whole tensors: the largest share is >= Ψ/N
            assert table <= measured <= 2 * elt * psi + k * psi + steps
        else:
            assert table <= measured <= table + steps
        state[mode] = measured
        assert r["peak_mem_bytes"] == ""  # CPU: no device allocator to ask
        # throughput and weak scaling
        assert float(r["samples_per_s"]) == pytest.approx(
            n * sh.micro_batch_size / (step / 1e6), rel=1e-4)
        t1 = float(r["t1_us"])
        assert t1 > 0 and float(r["efficiency"]) == pytest.approx(t1 / step, rel=1e-4)
        # every mode trained like one rank on the global batch
        assert info["check"]["worst_err_over_tolerance"] < 1
        assert 0 <= float(r["max_abs_err"]) < (1e-4 if dtype == "float32" else 0.1)
    # the ZeRO stages shrink what each rank holds; at 2 ranks FSDP2's zero2 ties with zero1
    # (its gradient shards are kept in the shards' dtype), within AdamW's step counters
    assert state["ddp"] > state["zero1"] and state["zero2"] > state["zero3"]
    if n == 2:
        assert abs(state["zero1"] - state["zero2"]) <= 4 * 2 * len(weights)
    else:
        assert state["zero1"] > state["zero2"]
    # the table on stdout: one line per row
    lines = [ln.split() for ln in res.stdout.splitlines() if not ln.startswith("#")]
    assert [ln[0] for ln in lines] == modes
    assert float(lines[0][2]) == pytest.approx(float(rows[0]["step_us"]) / 1e3, abs=0.01)
    for name in ("run.json", "topo.txt"):
        assert (res.run_dir / name).exists()


def test_a_wrong_gradient_fails_the_run_after_writing_every_row(tmp_path):
    n, dtype, _, block, sh = CASES[0]
    res = distbench(tmp_path, *_args(n, dtype, block, sh, "--mode", "zero1,zero3"),
                    DISTBENCH_TEST_CORRUPT_RANK="1")
    assert res.code == 1, res.stderr
    rows = res.rows("dp.csv")
    assert [r["mode"] for r in rows] == ["zero1", "zero3"]
    for r in rows:
        assert r["status"] == "wrong" and float(r["max_abs_err"]) == pytest.approx(1.0, rel=1e-2)
        assert "WRONG: blocks.0.up.weight gradient" in r["note"]
    meta = res.meta()
    assert meta["status"] == "wrong" and meta["exit_code"] == 1
    errors = [ln for ln in res.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1
    assert "wrong results: dp zero1 25 MiB float32: blocks.0.up.weight gradient" in errors[0]
    assert "dp zero3 float32: blocks.0.up.weight gradient" in errors[0]
