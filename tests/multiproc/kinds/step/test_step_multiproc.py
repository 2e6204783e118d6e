"""step on 4 real gloo workers: every layout of 4 ranks (tp, pp, dp) with ZeRO 0, 1 and 3 where
dp > 1, in one launch, each checked against the single-rank reference (sequence-parallel TP and
FSDP2's gradient sync every micro-batch, the defaults); the layout keys beyond the defaults
(per-op recomputation, a sync every micro-batch under DDP, interleaved; full recomputation of
k layers, uneven stages, TP without sequence parallelism, FSDP2 synced at the last
micro-batch); and a wrong result that must fail the run. Options and arithmetic: test_step.py.
Every run's posts are held to NCCL's rules (helpers.distbench)."""

from __future__ import annotations

import helpers
import pytest
from doc_columns import documented_columns
from helpers import Run, distbench

from distbench.planner.layouts import stage_layers
from distbench.planner.ranking import layout_of

# each run takes the slots it needs (helpers.distbench): a 2-rank run leaves the other three free
pytestmark = pytest.mark.multiproc

FAST = ["--iters", "2", "--warmup", "1"]
LAYOUTS = [(1, 1, 4), (2, 1, 2), (1, 2, 2), (2, 2, 1), (4, 1, 1), (1, 4, 1)]


@pytest.fixture(scope="module")
def matrix(tmp_path_factory) -> Run:
    # one timed step after the one warmup step every loop has: the rows' checks are the build's
    # and the counted step's, and 16 layouts' timed loops were a fifth of the suite's CPU here
    run = distbench(tmp_path_factory.mktemp("step-matrix"), "step", "--workers", "4",
                    "--zero", "0,1,3", "--iters", "1", "--warmup", "0", timeout=300)
    run.traces = dict(helpers.LAST_TRACES)  # what NCCL's rules were held to
    return run


def _within_10_percent(r: dict) -> None:
    """The planner's memory model against the peak the step held (docs/plan.md#memory)."""
    peak, model = int(r["peak_mem_bytes"]), int(r["model_mem_bytes"])
    assert abs(model / peak - 1) <= 0.10, (layout_of(r).label(), peak, model)


def test_every_layout_of_4_ranks_trains_like_one_rank(matrix):
    res = matrix
    assert res.code == 0, res.stderr
    with open(res.run_dir / "step.csv") as f:
        assert f.readline().strip().split(",") == documented_columns("step.csv")
    rows = res.rows("step.csv")
    got = {(int(r["tp"]), int(r["pp"]), int(r["dp"]), int(r["zero"])) for r in rows}
    want = {(t, p, d, z) for t, p, d in LAYOUTS for z in ((0, 1, 3) if d > 1 else (0,))}
    assert got == want and len(rows) == len(want)
    meta = res.meta()
    assert meta["status"] == "ok" and meta["exit_code"] == 0
    assert meta["step"]["check"]["rtol"] == 1e-4
    for r in rows:
        t, p, d, z = (int(r[k]) for k in ("tp", "pp", "dp", "zero"))
        label = f"tp{t} pp{p} dp{d} zero{z} m{r['micro_batches']}"
        info = meta["step"]["layouts"][label]
        assert r["status"] == "ok", (label, r["note"])
        assert r["model"] == "toy" and r["backend"] == "gloo" and r["world_size"] == "4"
        assert int(r["micro_batches"]) == (1 if p == 1 else 2 * p)
        assert int(r["micro_batch_size"]) * int(r["micro_batches"]) * d == 16
        assert r["schedule"] == ("1f1b" if p > 1 else "")
        # the layout's other keys, at their defaults: sequence parallelism, FSDP2's sync of
        # every micro-batch, DDP's at the last
        assert (r["sp"], r["recompute_layers"], r["tp_overlap"], r["dp_overlap"]) == \
            ("1", "0", "0", "1")
        assert r["grad_sync"] == ("micro" if z >= 2 else "last")
        assert layout_of(r).label() == label
        # the check: every gradient, every parameter after the step, the loss
        assert info["check"]["worst_err_over_tolerance"] < 1, (label, info["check"])
        assert 0 <= float(r["max_abs_err"]) < 1e-5
        # communication: bytes on a dimension exactly where it has more than one rank
        for dim, size in (("tp", t), ("pp", p), ("dp", d)):
            moved = int(r[f"{dim}_bytes_per_step"])
            alone = float(r[f"{dim}_comm_alone_us"])
            assert (moved > 0) == (size > 1), (label, dim, moved)
            assert (alone > 0) == (size > 1), (label, dim, alone)
            assert bool(info["collectives_counted"][dim]) == (size > 1)
        assert "no mesh dimension" not in r["note"], r["note"]
        if p > 1:  # every micro-batch's activation and gradient cross a boundary
            assert info["collectives_counted"]["pp"]["send"] >= int(r["micro_batches"])
        if d > 1:
            ops = set(info["collectives_counted"]["dp"])
            assert ops == {0: {"all_reduce"}, 1: {"all_reduce", "broadcast"},
                           3: {"all_gather", "reduce_scatter"}}[z], (label, ops)
        if z == 3 and p > 1:  # each micro-batch's gradients reduce-scattered, layer by layer
            m = int(r["micro_batches"])
            assert info["collectives_counted"]["dp"]["reduce_scatter"] == m * 4 // p, label
        if t > 1:
            # sequence parallelism: an all-gather and a reduce-scatter where TP all-reduced,
            # each call's bytes nccl-tests': the whole sequence of a micro-batch (the gather's
            # output, the scatter's input)
            counts, moved = info["collectives_counted"]["tp"], info["bytes_counted"]["tp"]
            assert set(counts) == {"all_gather", "reduce_scatter"}, (label, counts)
            whole = int(r["micro_batch_size"]) * 32 * 128 * 4
            assert moved == {op: n * whole for op, n in counts.items()}, (label, moved)
        # the parts
        step, compute = float(r["step_us"]), float(r["compute_only_us"])
        bubble, exposed = float(r["bubble_us"]), float(r["exposed_comm_us"])
        assert step > 0 and compute > 0
        assert exposed == pytest.approx(step - compute - bubble, abs=1e-5 * step + 1)
        assert float(r["bubble_analytic"]) == pytest.approx((p - 1) / (int(r["micro_batches"])
                                                                       + p - 1))
        assert (bubble > 0) == (p > 1)
        parts = [float(r[f"{dim}_exposed_us"]) for dim in ("tp", "pp", "dp")]
        assert min(parts) >= 0 and sum(parts) <= max(exposed, 0) * (1 + 1e-5) + 1
        assert float(r["samples_per_s"]) == pytest.approx(16 / (step / 1e6), rel=1e-4)
        # the planner's memory model against the peak the step held (docs/plan.md#memory)
        assert r["recompute"] == "none"
        _within_10_percent(r)
    # the state a rank holds falls with each ZeRO stage
    state = {(int(r["tp"]), int(r["pp"]), int(r["dp"]), int(r["zero"])):
             int(r["state_bytes_per_rank"]) for r in rows}
    for t, p, d in LAYOUTS:
        if d > 1:
            assert state[t, p, d, 0] > state[t, p, d, 1] > state[t, p, d, 3]
    # the table: one line per row
    lines = [ln.split() for ln in res.stdout.splitlines() if not ln.startswith("#")
             and ln.strip() and ln.split()[0].isdigit()]
    assert len(lines) == len(rows)
    # NCCL's rules were held to sequence parallelism's gathers and scatters on the TP pairs and
    # to FSDP's reduce-scatters of every micro-batch (helpers.distbench checked them)
    pairs = {(0, 1), (2, 3)}
    posted = {(e["op"], tuple(t.groups.get(e["group"], ()))) for t in matrix.traces.values()
              for e in t.events}
    assert {("all_gather", pair) for pair in pairs} <= posted
    assert {("reduce_scatter", pair) for pair in pairs} <= posted
    assert {op for op, _ in posted} >= {"all_reduce", "broadcast", "send", "recv"}


def test_a_wrong_gradient_fails_the_run_after_writing_its_row(tmp_path):
    res = distbench(tmp_path, "step", "--workers", "4", "--tp", "2", "--pp", "2",
                    "--iters", "1", "--warmup", "0", DISTBENCH_TEST_CORRUPT_RANK="1",
                    timeout=180)
    assert res.code == 1, res.stderr
    (row,) = res.rows("step.csv")
    assert row["status"] == "wrong" and float(row["max_abs_err"]) == pytest.approx(1.0, rel=1e-2)
    assert "WRONG: layers.0.attn.qkv.weight gradient" in row["note"]
    meta = res.meta()
    assert meta["status"] == "wrong" and meta["exit_code"] == 1
    errors = [ln for ln in res.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1
    assert "wrong results: step tp2 pp2 dp1 zero0 m4 float32: layers.0.attn.qkv.weight " \
           "gradient" in errors[0]


def test_a_rank_that_fails_while_its_peer_waits_on_it_ends_the_run_at_once(tmp_path):
    """Stage 0 of a 2-stage pipeline runs out of memory as the layout starts (planted) while
    stage 1 waits for its first activation: the waiting rank learns it through the store, and
    the run ends within the grace (15 s), naming the rank and why, instead of after --timeout
    (120 s here, which the run used to wait out)."""
    res = distbench(tmp_path, "step", "--workers", "2", "--pp", "2", "--micro-batches", "4",
                    "--timeout", "120", *FAST, DISTBENCH_TEST_FAIL="0:first steps",
                    timeout=180)
    assert res.code == 3, res.stderr
    assert res.secs < 70, res.secs
    meta = res.meta()
    assert meta["status"] == "failed" and meta["exit_code"] == 3
    assert meta["error"].startswith(
        "rank 0 failed in step tp1 pp2 dp1 zero0 m4 (build and first steps): RuntimeError: "
        "CUDA out of memory (planted"), meta["error"]
    assert "timed out" not in res.stderr


def test_a_layout_every_rank_refuses_is_skipped_and_the_run_goes_on(tmp_path):
    """Both ranks fail the pipeline's layout alike: they agree on it at once, its row is
    skipped quoting why, and the next layouts run."""
    res = distbench(tmp_path, "step", "--workers", "2", *FAST,
                    DISTBENCH_TEST_FAIL="0,1:step tp1 pp2", timeout=180)
    assert res.code == 0, res.stderr
    rows = {(r["tp"], r["pp"], r["dp"]): r for r in res.rows("step.csv")}
    assert set(rows) == {("1", "1", "2"), ("1", "2", "1"), ("2", "1", "1")}
    skipped = rows["1", "2", "1"]
    assert skipped["status"] == "skipped" and skipped["step_us"] == ""
    assert skipped["note"].startswith("cannot run here: RuntimeError: CUDA out of memory "
                                      "(planted"), skipped["note"]
    assert all(r["status"] == "ok" for k, r in rows.items() if k != ("1", "2", "1"))
    assert res.meta()["status"] == "ok"


INTERLEAVED_MODEL = "layers=8,hidden=64,ffn=256,heads=4,seq=16,batch=16"


def test_interleaved_layouts_train_like_one_rank_and_their_parts_add_up(tmp_path):
    """--virtual-stages 2 on 4 ranks: every layout with a pipeline the 8 layers split into
    pp x 2 chunks (tp1 pp2 dp2 under DDP and FSDP, tp1 pp4, tp2 pp2), torch's
    ScheduleInterleaved1F1B checked against the single-rank reference, its trace held to
    NCCL's rules (helpers.distbench), its parts adding up with the bubble (pp - 1) / v slots,
    its peak within 10% of the memory model's. Under per-op recomputation (torchtitan's
    selective AC, sequence-parallel at tp 2) and with the gradients synced after every
    micro-batch, DDP's too, which torch's pipeline stage would hold to the last."""
    res = distbench(tmp_path, "step", "--workers", "4", "--model", INTERLEAVED_MODEL,
                    "--virtual-stages", "2", "--zero", "0,3", "--iters", "1", "--warmup", "0",
                    "--recompute", "op", "--grad-sync", "micro", timeout=300)
    assert res.code == 0, res.stderr
    rows = res.rows("step.csv")
    got = {(int(r["tp"]), int(r["pp"]), int(r["dp"]), int(r["zero"])) for r in rows}
    assert got == {(1, 2, 2, 0), (1, 2, 2, 3), (1, 4, 1, 0), (2, 2, 1, 0)}
    meta = res.meta()
    assert meta["step"]["schedule"] == "interleaved-1f1b"
    for r in rows:
        p, d, m = int(r["pp"]), int(r["dp"]), int(r["micro_batches"])
        label = layout_of(r).label()
        assert label.startswith(f"tp{r['tp']} pp{p} dp{d} zero{r['zero']} m{m} v2 rc-op")
        info = meta["step"]["layouts"][label]
        assert r["status"] == "ok", (label, r["note"])
        assert r["schedule"] == "interleaved-1f1b" and r["virtual_stages"] == "2"
        assert (r["recompute"], r["grad_sync"]) == ("op", "micro")
        if d > 1:  # each chunk's gradients reduced after each of its m backwards
            dp_calls = info["collectives_counted"]["dp"]
            assert dp_calls.get("all_reduce", 0) + dp_calls.get("reduce_scatter", 0) >= 2 * m
        assert m == 4 * p  # 2 x pp x v
        assert info["check"]["worst_err_over_tolerance"] < 1, (label, info["check"])
        # each micro-batch crosses every rank twice: at least 2m sends from every stage
        assert info["collectives_counted"]["pp"]["send"] >= 2 * m, label
        step, compute = float(r["step_us"]), float(r["compute_only_us"])
        bubble, exposed = float(r["bubble_us"]), float(r["exposed_comm_us"])
        fb = info["compute_forward_backward_us"]
        assert bubble == pytest.approx((p - 1) / (2 * m) * fb, rel=1e-4)  # run.json rounds
        assert exposed == pytest.approx(step - compute - bubble, abs=1e-5 * step + 1)
        assert float(r["bubble_analytic"]) == pytest.approx((p - 1) / (2 * m + p - 1))
        _within_10_percent(r)


KEYS_MODEL = "layers=5,hidden=64,ffn=256,heads=4,seq=16,batch=16"


def test_uneven_stages_k_recomputed_layers_tp_without_sp_and_the_last_sync_train_like_one_rank(
        tmp_path):
    """The layout keys the other runs leave at their defaults, on 4 ranks: 5 layers, so pp 2
    and pp 4 stages are uneven (2 and 3; 1, 1, 2 and 1: the ends give a layer up first); full
    recomputation of the first layer of each stage only; TP's all-reduces (no sequence
    parallelism); FSDP's gradients synced at the last micro-batch only. Every layout checked
    against the single-rank reference, its peak within 10% of the memory model's."""
    res = distbench(tmp_path, "step", "--workers", "4", "--model", KEYS_MODEL, "--zero", "0,3",
                    "--recompute", "full", "--recompute-layers", "1", "--no-sp",
                    "--grad-sync", "last", "--iters", "1", "--warmup", "0", timeout=300)
    assert res.code == 0, res.stderr
    rows = res.rows("step.csv")
    got = {(int(r["tp"]), int(r["pp"]), int(r["dp"]), int(r["zero"])) for r in rows}
    assert got == {(t, p, d, z) for t, p, d in LAYOUTS for z in ((0, 3) if d > 1 else (0,))}
    assert [stage_layers(5, 4, s) for s in range(4)] == [1, 1, 2, 1]
    meta = res.meta()
    for r in rows:
        t, p, d, z = (int(r[k]) for k in ("tp", "pp", "dp", "zero"))
        layout = layout_of(r)
        info = meta["step"]["layouts"][layout.label()]
        assert r["status"] == "ok", (layout.label(), r["note"])
        assert info["check"]["worst_err_over_tolerance"] < 1, (layout.label(), info["check"])
        assert (r["recompute"], r["recompute_layers"], r["sp"], r["grad_sync"]) == \
            ("full", "1", "0", "last")
        if t > 1:  # TP's all-reduces, sequence parallelism off
            assert set(info["collectives_counted"]["tp"]) == {"all_reduce"}
        if z == 3 and p > 1:  # one reduce-scatter a layer of rank 0's, at the last micro-batch
            assert info["collectives_counted"]["dp"]["reduce_scatter"] == stage_layers(5, p, 0)
        _within_10_percent(r)
