"""tp without workers: the shapes and models, the FLOP and byte formulas, the shard layout (a
rank's plain shard modules add up to the unsharded block), the comparison, a one-rank DTensor
run and its check, the table, and option errors through the real command line."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from fake_session import FakeSession

import distbench.steps.stacks
from distbench.core.tables import format_table
from distbench.kinds.tp import options as cmd
from distbench.kinds.tp.output import OUTPUT
from distbench.parallel.device_mesh import flat_mesh
from distbench.parallel.tensor_parallel import stack_plan
from distbench.run.faults import Faults
from distbench.steps import reference
from distbench.steps import tp_model as strat
from distbench.steps.common import check_against_reference
from distbench.steps.stacks import StackShape, build_stack, make_inputs, make_stack, make_step

CPU = torch.device("cpu")


# ---- shapes and models -------------------------------------------------------------------------

def test_models_know_nothing_of_parallelism():
    tree = ast.parse(Path(distbench.steps.stacks.__file__).read_text())
    imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    imported += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert "torch" in imported  # the walk sees the imports
    for name in imported:
        assert not name.startswith(("torch.distributed", "distbench.parallel",
                                    "distbench.steps")), name


def test_the_shape_takes_the_options_names():
    opts = cmd.TPOptions(hidden_size=96, ffn_size=192, heads=6, seq_len=8, micro_batch_size=3,
                         layers=4)
    sh = StackShape.from_options(opts)
    assert sh == StackShape(hidden_size=96, ffn_size=192, heads=6, seq_len=8,
                            micro_batch_size=3, layers=4)
    assert sh.tokens == 24 and sh.head_dim == 16
    # every key is a tp.csv column: the row takes them as they are
    assert sh.to_json() == {"hidden_size": 96, "seq_len": 8, "micro_batch_size": 3,
                            "layers": 4, "ffn_size": 192, "heads": 6}
    assert set(sh.to_json()) <= set(OUTPUT.csv)
    assert sh.describe() == "hidden 96 ffn 192 heads 6 seq 8 batch 3 layers 4"


# ---- formulas ----------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_flops_per_rank_by_hand(n):
    sh = StackShape(hidden_size=1024, ffn_size=4096, heads=16, seq_len=512,
                    micro_batch_size=2, layers=3)
    tokens = 2 * 512
    # MLP: up h x f and down f x h, split n ways; fwd 2 FLOPs per weight per token, bwd twice that
    assert strat.params_per_rank("mlp", sh, n) == 3 * 2 * 1024 * 4096 // n
    assert strat.flops_per_rank("mlp", sh, n) == 3 * 6 * (2 * 1024 * 4096 // n) * tokens
    # attention: qkv h x 3h + out h x h; scores QK^T and PV: 2 x (2 b s^2 h/n) forward, x3 fwd+bwd
    linear = 3 * 6 * (4 * 1024 * 1024 // n) * tokens
    attn = 3 * 3 * 2 * 2 * 2 * 512 * 512 * (1024 // n)
    assert strat.flops_per_rank("attention", sh, n) == linear + attn
    # n ranks do 1/n of the work each
    assert strat.flops_per_rank("attention", sh, n) * n == strat.flops_per_rank("attention", sh, 1)


def test_allreduce_bytes_formula():
    sh = StackShape(hidden_size=1024, ffn_size=4096, heads=16, seq_len=512,
                    micro_batch_size=2, layers=3)
    for kind in strat.BLOCKS:
        # per layer: forward one (b, s, h) after the row-parallel layer, backward one (b, s, h)
        # for the column-parallel layer's input gradient
        assert strat.allreduce_bytes(kind, sh, 4, 2) == 2 * 3 * 2 * 512 * 1024 * 4
        assert strat.allreduce_bytes(kind, sh, 2, 8) == 2 * 3 * 2 * 512 * 1024 * 2
        assert strat.allreduce_bytes(kind, sh, 4, 1) == 0  # one rank: nothing to reduce


def test_implied_busbw_comm_fraction_and_scaling():
    # 1 GB all-reduced on 4 ranks, 0.5 s exposed: algbw 2 GB/s x 2(n-1)/n = 3 GB/s
    assert strat.implied_busbw_gbps(10**9, 4, 1.0, 0.5) == pytest.approx(3.0)
    assert strat.implied_busbw_gbps(10**9, 2, 1.0, 0.5) == pytest.approx(2.0)
    assert strat.implied_busbw_gbps(10**9, 2, 1.0, 1.0) is None  # no exposed time
    assert strat.implied_busbw_gbps(10**9, 2, 1.0, 1.2) is None
    assert strat.implied_busbw_gbps(0, 1, 1.0, 0.5) is None
    assert strat.comm_fraction(1.0, 0.25) == (pytest.approx(0.75), False)
    assert strat.comm_fraction(1.0, 1.5) == (0.0, True)
    speedup, eff = strat.scaling(t1_s=3.0, tn_s=2.0, world=2)
    assert speedup == pytest.approx(1.5) and eff == pytest.approx(0.75)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_small_check_shape_splits_over_any_world(n):
    sh = strat.small_shape(n)
    assert sh.hidden_size % sh.heads == 0 and sh.heads % n == 0 and sh.ffn_size % n == 0
    big = StackShape(hidden_size=1024, ffn_size=4096, heads=16, seq_len=512, micro_batch_size=1,
                     layers=2)
    assert strat.check_shape(big, n) == (sh, False)
    tiny = StackShape(hidden_size=64, ffn_size=128, heads=4, seq_len=16, micro_batch_size=2,
                      layers=2)
    assert strat.check_shape(tiny, n) == (tiny, True)


# ---- the shard layout --------------------------------------------------------------------------

def _local_shard(full, kind: str, shape: StackShape, rank: int, world: int):
    """Plain modules with `rank`'s shard shapes and weights: the rows of each projection the TP
    plan makes column-parallel, the columns of each it makes row-parallel (as ColwiseParallel
    and RowwiseParallel cut them), so the sum below checks the plan the timed run applies."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan = stack_plan(kind, 1)
    col, = (k.rsplit(".", 1)[1] for k, v in plan.items() if isinstance(v, ColwiseParallel))
    row, = (k.rsplit(".", 1)[1] for k, v in plan.items() if isinstance(v, RowwiseParallel))
    local = make_stack(kind, shape, shards=world).to(dtype=next(full.parameters()).dtype)
    with torch.no_grad():
        for src, dst in zip(full.blocks, local.blocks, strict=True):
            getattr(dst, col).weight.copy_(getattr(src, col).weight.chunk(world, 0)[rank])
            getattr(dst, row).weight.copy_(getattr(src, row).weight.chunk(world, 1)[rank])
    return local


@pytest.mark.parametrize("kind", strat.BLOCKS)
@pytest.mark.parametrize("n", [2, 4])
def test_local_shards_add_up_to_the_unsharded_block(kind, n):
    """What TP computes, without a process group: each rank's shard (rows of the column-parallel
    weight, columns of the row-parallel one) gives a partial output; the all-reduce sums them.
    This fails if the fused QKV rows were not grouped by head."""
    sh = StackShape(hidden_size=64, ffn_size=128, heads=8, seq_len=8, micro_batch_size=2,
                    layers=1)
    full = build_stack(kind, sh, 7, CPU, torch.float64)
    x, _ = make_inputs(sh, 7, CPU, torch.float64)
    x = x.detach()
    with torch.no_grad():
        total = x + sum(_local_shard(full, kind, sh, r, n)(x) - x for r in range(n))
        ref = full(x)
    torch.testing.assert_close(total, ref, rtol=1e-12, atol=1e-12)
    local = _local_shard(full, kind, sh, 1, n)
    assert sum(p.numel() for p in local.parameters()) == strat.params_per_rank(kind, sh, n)


def test_same_seed_same_model_other_seed_other_model():
    sh = strat.small_shape(2)
    a = build_stack("mlp", sh, 3, CPU, torch.float32)
    b = build_stack("mlp", sh, 3, CPU, torch.float32)
    c = build_stack("mlp", sh, 4, CPU, torch.float32)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(next(a.parameters()), next(c.parameters()))


def test_step_resets_gradients_and_backpropagates_to_the_input():
    sh = strat.small_shape(1)
    model = build_stack("attention", sh, 1, CPU, torch.float32)
    x, dy = make_inputs(sh, 1, CPU, torch.float32)
    step = make_step(model, x, dy)
    step()
    g1 = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
    step()  # a second step gives the same gradients, not twice them
    g2 = [p.grad for p in model.parameters()] + [x.grad]
    assert all(torch.equal(a, b) for a, b in zip(g1, g2, strict=True))
    assert float(x.grad.abs().sum()) > 0


def test_compare_flags_errors_beyond_tolerance():
    ref = torch.linspace(-4, 4, 100, dtype=torch.float64)
    ok = reference.check_tensors([("out", ref + 1e-6, ref)], rtol=1e-5)
    assert ok.max_abs_err == pytest.approx(1e-6, rel=1e-2) and ok.worst_ratio < 1
    bad_ref = ref.clone()
    bad = ref.clone()
    bad[3] += 1  # what the corrupt-rank fault does
    c = reference.check_tensors([("out", ref, ref), ("grad", bad, bad_ref)], rtol=1e-5)
    assert c.worst == "grad" and c.worst_ratio > 1 and c.max_abs_err == pytest.approx(1.0)
    nan = ref.clone()
    nan[0] = float("nan")
    assert reference.check_tensors([("out", nan, ref)], rtol=1e-5).worst_ratio == float("inf")
    assert reference.check_tensors([("out", ref[:10], ref)], rtol=1e-5).worst_ratio == float("inf")


# ---- DTensor on one rank -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def group(one_rank_group):
    return flat_mesh(CPU, 1)



@pytest.mark.parametrize("kind", strat.BLOCKS)
def test_parallelized_stack_matches_reference_on_one_rank(group, kind):
    sh = strat.small_shape(1)
    pairs = strat.tp_vs_reference(kind, sh, 5, CPU, torch.float32, group)
    names = [name for name, _, _ in pairs]
    assert names[:2] == ["output", "input gradient"]
    assert len(names) == 2 + 2 * sh.layers  # every weight gradient is compared
    assert reference.check_tensors(pairs, reference.RTOL["tp"]["float32"]).worst_ratio < 1


def _session(corrupt: bool):
    """What check_against_reference reads of a session."""
    return FakeSession(faults=Faults(corrupt=corrupt))


@pytest.mark.parametrize("kind", strat.BLOCKS)
def test_the_check_agrees_and_a_fault_hits_a_copy_of_the_output(group, kind):
    sh = strat.small_shape(1)
    rtol = reference.RTOL["tp"]["float32"]
    pairs = strat.tp_vs_reference(kind, sh, 5, CPU, torch.float32, group)
    clean = check_against_reference(_session(False), pairs, rtol)
    assert clean.worst_ratio < 1 and clean.wrong == 0
    assert clean == reference.check_tensors(pairs, rtol)  # one rank: the agreed verdict is its own
    before = pairs[0][1].clone()
    c = check_against_reference(_session(True), pairs, rtol)
    assert c.worst == "output" and c.worst_ratio > 1 and c.wrong == 1
    assert c.max_abs_err == pytest.approx(1.0, rel=1e-3)
    assert torch.equal(pairs[0][1], before)  # the strategy's tensor was not touched


def test_apply_tp_shards_the_planned_layers(group):
    from torch.distributed.tensor import DTensor

    sh = strat.small_shape(1)
    full = build_stack("mlp", sh, 1, CPU, torch.float32)
    tp = strat.apply_tp(full, "mlp", sh, group)
    assert all(isinstance(p, DTensor) for p in tp.parameters())
    assert not any(isinstance(p, DTensor) for p in full.parameters())  # reference untouched
    assert set(stack_plan("attention", 2)) == {"blocks.0.qkv", "blocks.0.out", "blocks.1.qkv",
                                                  "blocks.1.out"}


@pytest.mark.parametrize("kind", strat.BLOCKS)
def test_the_timed_models_never_exist_whole_on_the_device(group, monkeypatch, kind):
    """The TP stack and the compute-only stack are built on the meta device and only their
    shards materialised; the whole seeded stack is never built for them."""
    from torch.distributed.tensor import DTensor

    built_on: list[str] = []
    real = strat.make_stack

    def spy(*args, **kwargs):
        built_on.append(torch.empty(0).device.type)  # the default device where it is built
        return real(*args, **kwargs)

    def whole(*args, **kwargs):
        raise AssertionError("the whole stack was built")

    monkeypatch.setattr(strat, "make_stack", spy)
    monkeypatch.setattr(strat, "build_stack", whole)
    sh = strat.small_shape(2)
    tp = strat.build_sharded(kind, sh, group, CPU, torch.float32, 1)
    local = strat.build_local_shard(kind, sh, 2, CPU, torch.float32, 1)
    assert built_on == ["meta", "meta"]
    assert all(isinstance(p, DTensor) and p.to_local().device == CPU for p in tp.parameters())
    assert sum(p.numel() for p in local.parameters()) == strat.params_per_rank(kind, sh, 2)
    for model in (tp, local):
        assert all(torch.isfinite(p.full_tensor() if isinstance(p, DTensor) else p).all()
                   for p in model.parameters())
        x, dy = make_inputs(sh, 1, CPU, torch.float32)
        assert torch.isfinite(make_step(model, x, dy)()).all()


def test_the_sharded_model_is_gone_before_rank_0_builds_the_whole_one(group, monkeypatch):
    """t1 builds the whole stack on rank 0: the sharded one (kept alive by its timed step's
    closure) must be freed first, or both are on the device at once."""
    import weakref

    from distbench.steps import tp as steps

    sharded: list = []
    alive_at_t1: list[bool] = []
    real_sharded, real_whole = strat.build_sharded, steps.build_stack

    def build_sharded(*args, **kwargs):
        model = real_sharded(*args, **kwargs)
        sharded.append(weakref.ref(model))
        return model

    def build_whole(*args, **kwargs):
        alive_at_t1.append(sharded[0]() is not None)
        return real_whole(*args, **kwargs)

    monkeypatch.setattr(strat, "build_sharded", build_sharded)
    monkeypatch.setattr(steps, "build_stack", build_whole)
    sh = strat.small_shape(1)
    s = FakeSession(timeout=60, warmup=1, iters=2, check=False, dtype="float32")
    row, _ = steps._measure_block(s, "mlp", sh, group, torch.float32, sh, True, [])
    assert alive_at_t1 == [False]
    assert row["t1_us"] > 0


# ---- the table ---------------------------------------------------------------------------------

def test_table_lines_align_and_show_missing_values():
    head = format_table(OUTPUT.console, [], title="tp")
    row = {"block": "mlp", "step_us": 2500.0, "compute_only_us": 2000.0, "comm_pct": 20.0,
           "tflops_per_rank": 0.5, "tokens_per_s": 1000.0, "allreduce_bytes_per_step": 4096,
           "implied_busbw_gbps": None, "t1_us": 4000.0, "speedup": 1.6, "efficiency": 0.8,
           "max_abs_err": None}
    (line,) = format_table(OUTPUT.console, [row])
    assert len(line) == len(head[2]) == len(head[3])
    cells = line.split()
    assert cells == ["mlp", "2.50", "2.00", "20.0", "0.5000", "1000.0", "4096", "-", "4.00",
                     "1.60", "0.80", "-"]


# ---- option errors through the command line ---------------------------------------------------

@pytest.mark.parametrize("args, option", [
    (["--hidden-size", "100", "--heads", "16"], "--heads"),
    (["--ffn-size", "1001", "--workers", "2"], "--ffn-size"),
    (["--heads", "3", "--hidden-size", "96", "--workers", "2"], "--heads"),
    (["--block", "conv"], "--block"),
    (["--dtype", "int8"], "--dtype"),
])
def test_bad_tp_option_is_one_line_exit_2(in_process, tmp_path, args, option):
    proc = in_process("tp", *args, "--out", str(tmp_path / "r"))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"distbench: error: {option}"), proc.stderr
    assert "example:" in lines[0]
    assert not (tmp_path / "r").exists()  # refused before anything was created
