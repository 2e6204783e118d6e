"""dp without workers: the closed forms (parameter count, FSDP's padded shards, bytes per step,
the ZeRO table of state per rank, overlap), the options and their config file, bad input
through the command line, the fault hook, the collective counter's accounting, the pieces
of the strategy that need no peers (master weights, storage counting, the reference and its
batches), one-rank trainers against the table, the dp.csv contract; and on the fake group, a
mode one rank cannot run."""

from __future__ import annotations

import dataclasses
import textwrap
import time
from pathlib import Path

import helpers
import pytest
import torch
import torch.distributed as dist
from helpers import LAUNCHER_VARS, assert_one_line_error, resolved

from distbench.core.dtypes import ELEMENT_BYTES
from distbench.core.options import (
    OptionError,
    build,
    cli_types,
    load_config,
    option_fields,
    to_argv,
)
from distbench.kinds import commands
from distbench.kinds.dp.options import DPOptions
from distbench.kinds.dp.output import OUTPUT
from distbench.run.faults import SLOW_RANK, SLOW_SEND, Faults
from distbench.steps import dp_formulas as f
from distbench.steps import dp_model as strat
from distbench.steps import recipe
from distbench.steps import reference as refmod
from distbench.steps.comms import (
    CommCall,
    CommCounter,
    bus_bytes,
    op_bytes,
    op_counts,
    replay,
    replayable,
)
from distbench.steps.stacks import StackShape, build_stack

CPU = torch.device("cpu")
MODES = ("ddp", "zero1", "zero2", "zero3")


@pytest.fixture
def no_launcher(monkeypatch, tmp_path):
    """build() reads WORLD_SIZE and resolves a relative --out: neither from the outer shell."""
    for var in LAUNCHER_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)


def _opts(**raw) -> DPOptions:
    return build(DPOptions, raw, argv=[])


# ---- formulas: shapes and counts ---------------------------------------------------------------

def test_param_shapes_and_count_by_hand():
    # MLP block: up (ffn x hidden), down (hidden x ffn); no bias
    assert f.param_shapes("mlp", 8, 32, 2) == [(32, 8), (8, 32), (32, 8), (8, 32)]
    assert f.param_count(f.param_shapes("mlp", 8, 32, 2)) == 2 * 2 * 8 * 32
    # attention block: fused qkv (3 hidden x hidden), out (hidden x hidden); ffn plays no part
    assert f.param_shapes("attention", 8, 999, 3) == [(24, 8), (8, 8)] * 3
    assert f.param_count(f.param_shapes("attention", 8, 999, 3)) == 3 * (24 * 8 + 8 * 8)
    # the defaults: 4 layers of 512 x 2048 MLPs
    assert f.param_count(f.param_shapes("mlp", 512, 2048, 4)) == 4 * 2 * 512 * 2048


@pytest.mark.parametrize("kind", ["mlp", "attention"])
def test_param_shapes_are_the_models_weights_in_order(kind):
    sh = StackShape(hidden_size=16, ffn_size=48, heads=4, seq_len=2, micro_batch_size=1,
                    layers=3)
    model = build_stack(kind, sh, 1, CPU, torch.float32)
    weights = [tuple(p.shape) for p in model.parameters()]
    assert f.param_shapes(kind, 16, 48, 3) == weights
    assert f.param_count(f.param_shapes(kind, 16, 48, 3)) == sum(
        p.numel() for p in model.parameters())


def test_shard_count_pads_the_first_dimension():
    # 128 rows over 3 ranks: chunks of ceil(128 / 3) = 43 rows, 129 rows in all
    assert f.shard_count([(128, 10)], 3) == 43 * 10
    assert f.shard_count([(128, 10)], 2) == 64 * 10  # divides: no padding
    assert f.shard_count([(128, 10)], 1) == 128 * 10
    assert f.shard_count([(128, 10)], 200) == 1 * 10  # more ranks than rows: one padded row each
    # every weight is padded on its own: 43 + 22 rows (64 rows over 3 is 21.33)
    assert f.shard_count([(128, 64), (64, 128)], 3) == 43 * 64 + 22 * 128
    assert f.shard_count([(128, 64), (64, 128)], 3) * 3 > 2 * 128 * 64  # the padding is kept


# (world, elements of the padded whole): mlp hidden 64, ffn 128, one layer
BYTES_CASES = [(2, 2 * 128 * 64), (3, (43 + 43 + 43) * 64 + (22 + 22 + 22) * 128)]


@pytest.mark.parametrize("world, padded", BYTES_CASES, ids=["2-ranks", "3-ranks"])
@pytest.mark.parametrize("elt", [4, 2])
def test_bytes_per_step_by_mode(world, padded, elt):
    shapes = f.param_shapes("mlp", 64, 128, 1)
    psi = 2 * 64 * 128
    # ddp all-reduces every gradient once; zero1 also broadcasts every updated parameter
    assert f.bytes_per_step("ddp", shapes, elt, world) == psi * elt
    assert f.bytes_per_step("zero1", shapes, elt, world) == 2 * psi * elt
    # FSDP: all-gather + reduce-scatter of the padded whole; zero3 gathers again for backward
    assert f.bytes_per_step("zero2", shapes, elt, world) == 2 * padded * elt
    assert f.bytes_per_step("zero3", shapes, elt, world) == 3 * padded * elt


# ---- formulas: the ZeRO table ------------------------------------------------------------------

# bytes per rank as a Ψ + b Ψ/N (shapes whose every first dimension divides by N: no padding).
# float32 / float64: params, grads and two AdamW states in e bytes. Half precision: params and
# grads in 2 bytes, fp32 master + two fp32 states (12 bytes); FSDP keeps fp32 shards (s = 4).
# zero2 (FSDP2 without resharding) holds the gathered parameters in e bytes beside its shards.
TABLE = {
    "float32": {"ddp": (16, 0), "zero1": (8, 8), "zero2": (4, 16), "zero3": (0, 16)},
    "bfloat16": {"ddp": (16, 0), "zero1": (4, 12), "zero2": (2, 16), "zero3": (0, 16)},
    "float16": {"ddp": (16, 0), "zero1": (4, 12), "zero2": (2, 16), "zero3": (0, 16)},
    "float64": {"ddp": (32, 0), "zero1": (16, 16), "zero2": (8, 32), "zero3": (0, 32)},
}


@pytest.mark.parametrize("kind", ["mlp", "attention"])
@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("dtype", list(TABLE))
def test_state_bytes_is_the_zero_table(kind, world, dtype):
    shapes = f.param_shapes(kind, 48, 96, 2)  # 48, 96 and 144 rows all divide by 2, 3 and 4
    psi = f.param_count(shapes)
    for mode in MODES:
        a, b = TABLE[dtype][mode]
        assert f.state_bytes(mode, shapes, dtype, world) == pytest.approx(
            a * psi + b * psi / world, rel=1e-12), mode


@pytest.mark.parametrize("dtype, e, s", [("float32", 4, 4), ("bfloat16", 2, 4)])
def test_state_bytes_of_fsdp_counts_the_padding(dtype, e, s):
    shapes = f.param_shapes("mlp", 64, 128, 1)  # (128, 64), (64, 128)
    psi = 2 * 64 * 128
    shard = 43 * 64 + 22 * 128  # one rank's padded shard at 3 ranks
    assert f.state_bytes("zero3", shapes, dtype, 3) == 4 * s * shard
    assert f.state_bytes("zero2", shapes, dtype, 3) == e * 3 * shard + 4 * s * shard
    assert f.state_bytes("zero3", shapes, dtype, 3) > 16 * psi / 3  # padding costs memory
    # ddp and zero1 do not shard by rows: no padding
    k = 12 if dtype == "bfloat16" else 2 * e
    assert f.state_bytes("ddp", shapes, dtype, 3) == (2 * e + k) * psi
    assert f.state_bytes("zero1", shapes, dtype, 3) == pytest.approx(2 * e * psi + k * psi / 3)


SHAPES = [("mlp", 512, 2048, 4), ("attention", 64, 0, 3), ("mlp", 64, 100, 2),
          ("attention", 96, 0, 1)]


@pytest.mark.parametrize("dtype", list(TABLE))
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{s[0]}-{s[1]}" for s in SHAPES])
def test_state_falls_with_each_stage_and_zero1_ties_zero2_at_two_ranks(dtype, shape):
    shapes = f.param_shapes(*shape)
    for world in (3, 4, 5, 8):
        ddp, z1, z2, z3 = (f.state_bytes(m, shapes, dtype, world) for m in MODES)
        assert ddp > z1 > z2 > z3 > 0, (world, ddp, z1, z2, z3)
    # FSDP2's gradient shards are fp32 / --dtype, not the paper's e: at 2 ranks zero2 holds as
    # much as zero1 (documented): 3eΨ in float32-like dtypes, 10Ψ in half precision
    ddp, z1, z2, z3 = (f.state_bytes(m, shapes, dtype, 2) for m in MODES)
    psi = f.param_count(shapes)
    assert z1 == z2 == (10 * psi if dtype in ("bfloat16", "float16") else
                        3 * ELEMENT_BYTES[dtype] * psi)
    assert ddp > z1 and z2 > z3


# ---- formulas: overlap -------------------------------------------------------------------------

def test_overlap_pct_in_range_has_no_note():
    assert f.overlap_pct(25.0, 100.0) == (pytest.approx(75.0), "")
    assert f.overlap_pct(0.0, 100.0) == (pytest.approx(100.0), "")  # all of it hid
    assert f.overlap_pct(100.0, 100.0) == (pytest.approx(0.0), "")  # none of it hid


def test_overlap_pct_clamped_at_0_with_a_note():
    # 150 us exposed, but the collectives take 100 us alone: -50 % is clamped
    pct, note = f.overlap_pct(150.0, 100.0)
    assert pct == 0.0
    assert "clamped" in note and "-50" in note and "to 0" in note


def test_overlap_pct_clamped_at_100_with_a_note():
    # the step was 20 us faster than compute-only: 120 % is clamped
    pct, note = f.overlap_pct(-20.0, 100.0)
    assert pct == 100.0
    assert "clamped" in note and "120" in note and "to 100" in note


@pytest.mark.parametrize("alone", [0.0, -1.0])
def test_overlap_pct_without_communication(alone):
    pct, note = f.overlap_pct(5.0, alone)
    assert pct == 0.0
    assert note and "no communication" in note


# ---- fit -----------------------------------------------------------------------------------------

def test_need_per_rank_is_the_modes_largest_piece_plus_activations(no_launcher):
    opts = _opts(hidden_size=64, ffn_size=128, layers=2)
    psi = 2 * 2 * 64 * 128
    # twice what an MLP block keeps per token (its input h and 2 ffn), 2 layers, 4 bytes
    acts = 2 * opts.micro_batch_size * opts.seq_len * (64 + 2 * 128) * 2 * 4
    # ddp: its own float32 state (16 bytes a parameter), and its compute-only replica the same
    assert f.need_per_rank(opts, "ddp", 2) == 16 * psi + acts
    # zero3 at 4 ranks: the unsharded compute-only replica (parameters and gradients) and the
    # optimizer of the shards outweigh the shards
    assert f.need_per_rank(opts, "zero3", 4) == 8 * psi + 4 * 4 * psi / 4 + acts
    assert f.need_per_rank(opts, "zero3", 4) < f.need_per_rank(opts, "ddp", 4)
    bigger = _opts(hidden_size=64, ffn_size=128, layers=2, micro_batch_size=8)
    assert f.need_per_rank(bigger, "ddp", 2) > f.need_per_rank(opts, "ddp", 2)
    # per layer times layers: an absurd --layers is a number, not a list that long
    huge = _opts(hidden_size=64, ffn_size=128, layers=10**12)
    assert f.need_per_rank(huge, "zero3", 2) > 10**12


def test_check_world_refuses_only_what_does_not_fit(no_launcher, monkeypatch):
    opts = _opts(hidden_size=64, ffn_size=128, layers=2)
    need = max(f.need_per_rank(opts, m, 2) for m in opts.modes)
    opts.check_world(2)  # the backend is not known yet: nothing to check against
    opts.check_backend("gloo")
    for have in (need, need + 1, None):
        monkeypatch.setattr(f, "capacity_per_rank", lambda b, r, h=have: (h, "here"))
        opts.check_world(2)  # fits, or cannot be told: no error
    monkeypatch.setattr(f, "capacity_per_rank", lambda b, r: (need - 1, "here"))
    with pytest.raises(OptionError, match="^--hidden-size: ddp on 2 ranks .*here"):
        opts.check_world(2)
    # zero3 alone on 4 ranks needs less (12 bytes a parameter, not 16): the same machine fits it
    zero3 = _opts(hidden_size=64, ffn_size=128, layers=2, mode="zero3")
    zero3.check_backend("gloo")
    zero3.check_world(4)


# ---- options -----------------------------------------------------------------------------------

def test_mode_all_is_every_mode_in_zero_order(no_launcher):
    assert _opts().modes == ["ddp", "zero1", "zero2", "zero3"]  # the default
    assert _opts(mode="all").modes == ["ddp", "zero1", "zero2", "zero3"]
    assert _opts(mode=" ALL ").modes == ["ddp", "zero1", "zero2", "zero3"]


def test_fsdp_is_zero3_or_zero2_by_reshard_after_forward(no_launcher):
    assert _opts(mode="fsdp").modes == ["zero3"]
    assert _opts(mode="fsdp", reshard_after_forward="true").modes == ["zero3"]
    assert _opts(mode="fsdp", reshard_after_forward="false").modes == ["zero2"]
    assert _opts(mode="fsdp", reshard_after_forward="FALSE").modes == ["zero2"]
    assert _opts(mode="ddp,fsdp", reshard_after_forward="false").modes == ["ddp", "zero2"]


def test_duplicates_are_dropped_order_kept(no_launcher):
    assert _opts(mode="zero3,ddp,zero3, ddp").modes == ["zero3", "ddp"]
    # fsdp resolving to a mode already asked for is one row
    assert _opts(mode="zero3,fsdp").modes == ["zero3"]
    assert _opts(mode="fsdp,zero2,ddp", reshard_after_forward="false").modes == ["zero2", "ddp"]
    assert _opts(bucket_cap_mb="1,25,1.0,25").bucket_cap_mb == [1.0, 25.0]
    assert _opts(bucket_cap_mb="0.5").bucket_cap_mb == [0.5]


def test_dp_defaults(no_launcher):
    opts = _opts()
    assert opts.bucket_cap_mb == [25.0] and opts.block == "mlp"
    assert (opts.hidden_size, opts.ffn_size, opts.heads, opts.seq_len, opts.layers) == (
        512, 2048, 8, 128, 4)
    assert opts.dtype == "float32" and opts.check is True


@pytest.mark.parametrize("raw, option", [
    ({"mode": "zero4"}, "--mode"),
    ({"mode": "ddp,"}, "--mode"),
    ({"bucket_cap_mb": "0"}, "--bucket-cap-mb"),
    ({"bucket_cap_mb": "25,-1"}, "--bucket-cap-mb"),
    ({"bucket_cap_mb": "nan"}, "--bucket-cap-mb"),
    ({"reshard_after_forward": "yes"}, "--reshard-after-forward"),
    ({"block": "attention", "heads": 3, "hidden_size": 64}, "--heads"),
])
def test_bad_options_raise_naming_the_flag(no_launcher, raw, option):
    with pytest.raises(OptionError) as e:
        _opts(**raw)
    assert str(e.value).startswith(f"{option}:") and "(example: " in str(e.value)


def test_heads_need_not_divide_the_hidden_size_of_an_mlp(no_launcher):
    assert _opts(block="mlp", heads=7, hidden_size=512).heads == 7
    assert _opts(block="attention", heads=8, hidden_size=512).heads == 8


def _resolve(where: Path, *args: str) -> DPOptions:
    opts = resolved(where, "dp", *args)
    assert isinstance(opts, DPOptions)
    return opts


@pytest.mark.parametrize("raw", [
    {},
    {"mode": "zero3,ddp", "bucket_cap_mb": "1,2.5,100", "block": "attention", "heads": 4,
     "hidden_size": 64, "ffn_size": 96, "seq_len": 8, "micro_batch_size": 3, "layers": 2,
     "dtype": "bf16", "iters": 3, "warmup": 0, "check": False, "backend": "gloo",
     "timeout": 60},
    {"mode": "fsdp,zero1", "reshard_after_forward": "false", "bucket_cap_mb": "0.001"},
], ids=["defaults", "everything-else", "fsdp-as-zero2"])
def test_to_argv_round_trip(tmp_path, raw):
    opts = _opts(**raw)
    again = _resolve(tmp_path, *to_argv(opts))
    assert dataclasses.replace(again, argv=[]) == dataclasses.replace(opts, argv=[])
    # and once more through build() itself
    assert to_argv(again) == to_argv(opts)


def test_command_line_reaches_the_options(tmp_path):
    opts = _resolve(tmp_path, "--mode", "fsdp,ddp", "--reshard-after-forward", "false",
                    "--bucket-cap-mb", "4,4,8", "--block", "attention", "--heads", "4",
                    "--hidden-size", "64")
    assert opts.modes == ["zero2", "ddp"] and opts.bucket_cap_mb == [4.0, 8.0]
    assert opts.block == "attention" and opts.heads == 4 and opts.hidden_size == 64


# ---- --config ----------------------------------------------------------------------------------

def _known() -> dict:
    """What the command line hands load_config for dp."""
    return {spec.flag: cli_types(DPOptions)[fld.name] for fld, spec in option_fields(DPOptions)}


def test_config_dp_table_is_read(no_launcher, tmp_path):
    cfg = tmp_path / "bench.toml"
    cfg.write_text(textwrap.dedent("""
        iters = 3
        [dp]
        mode = "zero1,fsdp"
        bucket-cap-mb = "5,50"
        reshard_after_forward = "false"
        iters = 4
        [tp]
        heads = 2
    """))
    raw = load_config(cfg, "dp", _known(), set(commands()))
    assert raw["mode"] == "zero1,fsdp" and raw["bucket_cap_mb"] == "5,50"
    assert raw["iters"] == 4 and "heads" not in raw  # the table wins; tp's table is skipped
    opts = _opts(**raw)
    assert opts.modes == ["zero1", "zero2"] and opts.bucket_cap_mb == [5.0, 50.0]
    assert opts.iters == 4 and opts.heads == 8


def test_config_list_of_buckets_joins(no_launcher, tmp_path):
    cfg = tmp_path / "bench.toml"
    cfg.write_text('[dp]\nmode = ["ddp", "zero3"]\nbucket-cap-mb = [1, 2.5]\n')
    opts = _opts(**load_config(cfg, "dp", _known(), set(commands())))
    assert opts.modes == ["ddp", "zero3"] and opts.bucket_cap_mb == [1.0, 2.5]


@pytest.mark.parametrize("text, key", [
    ("[dp]\nbogus = 1\n", "bogus"),
    ("[dp]\nsizes = \"4K\"\n", "sizes"),  # collective's, not dp's
    ("schedule = \"1f1b\"\n", "schedule"),  # pp's, at the top level
])
def test_config_unknown_key_is_refused(tmp_path, text, key):
    cfg = tmp_path / "bench.toml"
    cfg.write_text(text)
    with pytest.raises(OptionError, match=f"^--config: unknown key '{key}'"):
        load_config(cfg, "dp", _known(), set(commands()))


def test_config_through_the_command_line_and_flags_win(tmp_path):
    cfg = tmp_path / "bench.toml"
    cfg.write_text('[dp]\nmode = "zero2"\nbucket-cap-mb = "7"\nlayers = 1\n')
    opts = _resolve(tmp_path, "--config", str(cfg))
    assert opts.modes == ["zero2"] and opts.bucket_cap_mb == [7.0] and opts.layers == 1
    opts = _resolve(tmp_path, "--config", str(cfg), "--mode", "ddp")
    assert opts.modes == ["ddp"] and opts.bucket_cap_mb == [7.0]


# ---- bad input through the command line (in this process: nothing can start) ------------------

@pytest.fixture
def dp_cli(in_process, tmp_path):
    """`distbench dp *args --out <tmp>/results`, in this process: (result, None, out)."""
    out = tmp_path / "results"

    def run(*args: str):
        return in_process("dp", *args, "--out", str(out)), None, out
    return run


def _nothing_made(tmp_path: Path, out: Path, keep: tuple[str, ...] = ()) -> None:
    assert not out.exists() or not any(out.iterdir()), f"a refused run wrote under {out}"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(keep)


BAD = [
    ("mode-unknown", ["--mode", "zero4"], "--mode", "'zero4'"),
    ("bucket-zero", ["--bucket-cap-mb", "0"], "--bucket-cap-mb", "above 0"),
    ("bucket-negative", ["--bucket-cap-mb", "-1"], "--bucket-cap-mb", "above 0"),
    ("bucket-not-a-number", ["--bucket-cap-mb", "abc"], "--bucket-cap-mb", "'abc'"),
    ("bucket-inf", ["--bucket-cap-mb", "inf"], "--bucket-cap-mb", "above 0"),
    ("bucket-nan-in-a-list", ["--bucket-cap-mb", "25,nan"], "--bucket-cap-mb", "nan"),
    ("reshard-maybe", ["--reshard-after-forward", "maybe"], "--reshard-after-forward",
     "'maybe'"),
    ("heads-do-not-divide", ["--block", "attention", "--heads", "7", "--hidden-size", "512"],
     "--heads", "7 heads do not divide --hidden-size 512"),
    ("block-unknown", ["--block", "conv"], "--block", "'conv'"),
    ("dtype-int", ["--dtype", "int8"], "--dtype", "int8"),
]
# Sized against the machine where the workers would start: refused by the real dispatch
DOES_NOT_FIT = [
    ("does-not-fit", ["--hidden-size", "200000", "--ffn-size", "800000"], "--hidden-size",
     "GiB per rank"),
    ("does-not-fit-gloo", ["--hidden-size", "200000", "--ffn-size", "800000", "--backend",
                           "gloo", "--workers", "2"], "--hidden-size", "GiB per rank"),
]


@pytest.mark.parametrize("args, option, needle", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_dp_option_is_one_line_exit_2(dp_cli, tmp_path, args, option, needle):
    proc, secs, out = dp_cli(*args)
    line = assert_one_line_error(proc, secs, option, ours=True)
    assert needle in line
    _nothing_made(tmp_path, out)


@pytest.mark.parametrize("args, option, needle", [c[1:] for c in DOES_NOT_FIT],
                         ids=[c[0] for c in DOES_NOT_FIT])
def test_a_model_past_the_memory_is_one_line_exit_2(tmp_path, args, option, needle):
    """In this process: a worker the dispatch started would fail the test (not multiproc)."""
    out = tmp_path / "results"
    proc = helpers.cli(tmp_path, "dp", *args, "--out", str(out), dispatch=True)
    line = assert_one_line_error(proc, None, option, ours=True)
    assert needle in line
    _nothing_made(tmp_path, out)


def test_config_unknown_key_through_the_command_line(dp_cli, tmp_path):
    cfg = tmp_path / "bench.toml"
    cfg.write_text('[dp]\nmode = "ddp"\nbucket_size = 25\n')
    proc, secs, out = dp_cli("--config", str(cfg))
    line = assert_one_line_error(proc, secs, "--config", ours=True)
    assert "'bucket_size'" in line and "bucket-cap-mb" in line  # the valid keys are listed
    _nothing_made(tmp_path, out, keep=("bench.toml",))


def test_config_bad_value_in_dp_table_fails_like_the_flag(dp_cli, tmp_path):
    cfg = tmp_path / "bench.toml"
    cfg.write_text('[dp]\nbucket-cap-mb = "0"\n')
    from_file, secs, out = dp_cli("--config", str(cfg))
    assert_one_line_error(from_file, secs, "--bucket-cap-mb", ours=True)
    from_flag, _, _ = dp_cli("--bucket-cap-mb", "0")
    assert from_file.stderr == from_flag.stderr
    _nothing_made(tmp_path, out, keep=("bench.toml",))


# ---- the fault hook ----------------------------------------------------------------------------

def test_no_delay_no_hook():
    assert Faults().before_collective() is None
    assert Faults.from_env(0, {}).before_collective() is None
    assert Faults(corrupt=True).before_collective() is None


@pytest.mark.parametrize("var", [SLOW_RANK, SLOW_SEND])
def test_slow_rank_hook_sleeps_its_delay_on_its_rank_only(var):
    env = {var: "1:0.05"}
    hook = Faults.from_env(1, env).before_collective()
    assert callable(hook)
    t0 = time.perf_counter()
    assert hook() is None
    took = time.perf_counter() - t0
    assert 0.05 <= took < 0.5, took
    assert Faults.from_env(0, env).before_collective() is None
    assert Faults.from_env(2, env).before_collective() is None


# ---- collectives: bus bytes and replay ---------------------------------------------------------

CALLS = [CommCall("all_reduce", 1000, torch.float32),
         CommCall("all_gather", 600, torch.float32),
         CommCall("reduce_scatter", 300, torch.bfloat16),
         CommCall("broadcast", 50, torch.float32, 1),
         CommCall("all_to_all", 999, torch.float32)]


@pytest.mark.parametrize("world", [2, 4, 8])
def test_bus_bytes_uses_nccl_tests_factors(world):
    n = world
    want = (1000 * 2 * (n - 1) / n + 600 * (n - 1) / n + 300 * (n - 1) / n + 50 * 1)
    assert bus_bytes(CALLS, world) == pytest.approx(want)  # all_to_all has no factor: left out
    assert bus_bytes([], world) == 0
    assert bus_bytes(CALLS, 1) == pytest.approx(50)  # one rank: only broadcast counts


def test_bus_bytes_by_hand_at_four_ranks():
    # 1000 x 1.5 + 600 x 0.75 + 300 x 0.75 + 50 x 1
    assert bus_bytes(CALLS, 4) == pytest.approx(1500 + 450 + 225 + 50)


def test_replayable_splits_off_what_cannot_be_replayed():
    calls = [*CALLS, CommCall("shard_dim_alltoall", 64, torch.float32),
             CommCall("all_to_all", 8, torch.float32), CommCall("all_reduce", 16, None)]
    ok, left = replayable(calls)
    assert ok == CALLS[:4]  # order kept
    assert left == {"all_to_all": 2, "shard_dim_alltoall": 1, "all_reduce": 1}
    assert replayable([]) == ([], {})
    assert replayable(CALLS[:2]) == (CALLS[:2], {})


# ---- master weights, storage and the reference -------------------------------------------------

def test_needs_master_only_in_half_precision():
    assert strat.needs_master(torch.bfloat16) and strat.needs_master(torch.float16)
    assert not strat.needs_master(torch.float32) and not strat.needs_master(torch.float64)
    assert strat.optimizer_class(torch.bfloat16) is strat.MasterAdamW
    assert strat.optimizer_class(torch.float32) is torch.optim.AdamW


def test_master_adamw_steps_fp32_masters_and_rounds_them_into_the_parameter():
    g = torch.Generator().manual_seed(5)
    p = torch.nn.Parameter(torch.randn(64, generator=g).to(torch.bfloat16))
    idle = torch.nn.Parameter(torch.randn(8, generator=g).to(torch.bfloat16))
    p0, idle0 = p.detach().clone(), idle.detach().clone()
    opt = strat.MasterAdamW([p, idle], lr=1e-2)
    (_, m), (_, m_idle) = opt.pairs
    assert m.dtype == torch.float32 and torch.equal(m, p0.float())
    assert m.data_ptr() != p.data_ptr()
    p.grad = torch.randn(64, generator=g).to(torch.bfloat16)
    opt.step()
    # AdamW's first step, by hand: decay by lr x 0.01, then move by lr x g / (|g| + eps)
    g64, p64 = p.grad.double(), p0.double()
    want = p64 * (1 - 1e-2 * 1e-2) - 1e-2 * g64 / (g64.abs() + 1e-8)
    torch.testing.assert_close(m.double(), want, rtol=0, atol=1e-6)
    assert torch.equal(p.detach(), m.to(torch.bfloat16))  # the master, rounded
    assert p.dtype == torch.bfloat16
    # no gradient: neither the parameter nor its master moved
    assert torch.equal(idle.detach(), idle0) and torch.equal(m_idle, idle0.float())


def test_master_adamw_holds_one_chunk_of_fp32_gradients_at_a_time(monkeypatch):
    """Real trainers keep no fp32 copy of every gradient at once, and the planner counts none:
    with chunks of 512 bytes, 8 parameters of 128 fp32 elements each step in 8 chunks, and while
    any chunk steps only its own master has an fp32 gradient; the result is the same as one
    AdamW over all of them."""
    monkeypatch.setattr(strat.MasterAdamW, "CHUNK_BYTES", 512)
    g = torch.Generator().manual_seed(3)
    params = [torch.nn.Parameter(torch.randn(128, generator=g).to(torch.bfloat16))
              for _ in range(8)]
    grads = [torch.randn(128, generator=g).to(torch.bfloat16) for _ in params]
    masters = [p.detach().float().clone().requires_grad_(True) for p in params]
    opt = strat.MasterAdamW(params, lr=1e-2)
    assert len(opt.chunks) == 8
    held: list[int] = []
    real_step = torch.optim.AdamW.step

    def counting_step(self, *args, **kwargs):
        held.append(sum(m.grad is not None for _, m in opt.pairs))
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", counting_step)
    for p, grad in zip(params, grads, strict=True):
        p.grad = grad
    opt.step()
    assert held == [1] * 8
    monkeypatch.setattr(torch.optim.AdamW, "step", real_step)
    whole = torch.optim.AdamW(masters, lr=1e-2)
    for m, grad in zip(masters, grads, strict=True):
        m.grad = grad.float()
    whole.step()
    for p, m in zip(params, masters, strict=True):
        assert torch.equal(p.detach(), m.detach().to(torch.bfloat16))


def test_half_precision_updates_are_lost_without_masters():
    """1.0 in bfloat16 has neighbours 1 - 2^-8 and 1 + 2^-7: a step of 1e-3 rounds back to 1.0
    every time, while the master accumulates 20 of them and the parameter follows."""
    plain = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    mastered = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    a = torch.optim.AdamW([plain], lr=1e-3)
    b = strat.MasterAdamW([mastered], lr=1e-3)
    for _ in range(20):
        plain.grad = torch.ones_like(plain)
        mastered.grad = torch.ones_like(mastered)
        a.step()
        b.step()
    assert torch.equal(plain.detach(), torch.ones(4, dtype=torch.bfloat16))
    master = b.pairs[0][1]
    assert float(master[0]) == pytest.approx(1 - 20 * 1e-3, abs=1e-3)
    assert torch.equal(mastered.detach(), master.to(torch.bfloat16))
    assert float(mastered.detach()[0]) < 1 - 2**-8


def test_storage_bytes_counts_each_storage_once():
    a = torch.zeros(100, dtype=torch.float32)
    b = torch.zeros(10, dtype=torch.float64)
    assert strat.storage_bytes([a]) == 400
    assert strat.storage_bytes([a[:50], a[50:], a.view(10, 10), a]) == 400  # views of one bucket
    assert strat.storage_bytes([a[:10], b, None, 3]) == 400 + 80  # not tensors: skipped
    assert strat.storage_bytes(t for t in (b, b[1:])) == 80  # any iterable
    assert strat.storage_bytes([]) == 0


def test_optimizer_tensors_include_the_masters():
    params = [torch.nn.Parameter(torch.zeros(s, dtype=torch.bfloat16)) for s in (30, 12)]
    opt = strat.MasterAdamW(params, lr=1e-2)
    masters = [m for _, m in opt.pairs]
    before = strat.optimizer_tensors(opt)
    assert all(any(t is m for t in before) for m in masters)  # before any step: the masters
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    tensors = strat.optimizer_tensors(opt)
    assert all(any(t is m for t in tensors) for m in masters)
    for m in masters:  # and the two states AdamW keeps for each master
        state = next(inner.state[m] for _, inner in opt.chunks if m in inner.state)
        assert any(t is state["exp_avg"] for t in tensors)
        assert any(t is state["exp_avg_sq"] for t in tensors)
    psi = 30 + 12
    # master + two states, 4 bytes each (the table's K = 12), and a float32 step count each
    assert strat.storage_bytes(tensors) == 12 * psi + 4 * len(params)
    plain = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(psi))], lr=1e-2)
    plain.param_groups[0]["params"][0].grad = torch.ones(psi)
    plain.step()
    assert strat.storage_bytes(strat.optimizer_tensors(plain)) == 8 * psi + 4  # K = 2e


SMALL = StackShape(hidden_size=16, ffn_size=32, heads=2, seq_len=4, micro_batch_size=2,
                   layers=2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_global_batch_is_the_local_batches_in_rank_order(dtype):
    xs, ts = strat.global_batch(SMALL, 7, 3, dtype)
    assert xs.shape == ts.shape == (3 * 2, 4, 16) and xs.dtype == dtype
    for r in range(3):
        x, t = strat.local_batch(SMALL, 7, r, "cpu", dtype)
        assert torch.equal(xs[2 * r:2 * r + 2], x) and torch.equal(ts[2 * r:2 * r + 2], t)
    # ranks and seeds see different data; the same (seed, rank) the same
    assert not torch.equal(xs[:2], xs[2:4])
    assert not torch.equal(strat.local_batch(SMALL, 8, 0, "cpu", dtype)[0], xs[:2])
    assert torch.equal(strat.local_batch(SMALL, 7, 1, "cpu", dtype)[0], xs[2:4])
    assert not torch.equal(xs, ts)


@pytest.mark.parametrize("kind", ["mlp", "attention"])
def test_reference_is_the_average_of_the_ranks_gradients_and_one_adamw_step(kind, monkeypatch):
    world, seed = 3, 11
    three = strat.reference(kind, SMALL, seed, world, torch.float32)
    monkeypatch.setattr(strat, "CHECK_STEPS", 1)
    ref = strat.reference(kind, SMALL, seed, world, torch.float32)
    # the check's default: three steps (DDP buckets as configured from its second), each on the
    # same batch with the eps the first step's gradients set
    assert strat.CHECK_STEPS == 1 and three.eps == ref.eps
    for n in ref.params:
        assert not torch.equal(three.grads[n], ref.grads[n])  # taken at the moved weights
        assert not torch.equal(three.params[n], ref.params[n])
    names = [n for n, _ in build_stack(kind, SMALL, seed, CPU, torch.float32).named_parameters()]
    assert list(ref.grads) == names and list(ref.params) == names
    top = max(float(g.abs().max()) for g in ref.grads.values())
    assert ref.eps > 0 and ref.eps == pytest.approx(0.1 * top)
    # what DDP computes: each rank's mean-squared-error gradient, averaged over the ranks
    per_rank = []
    for r in range(world):
        model = build_stack(kind, SMALL, seed, CPU, torch.float64)
        x, t = strat.local_batch(SMALL, seed, r, "cpu", torch.float32)
        ((model(x.double()) - t.double()) ** 2).mean().backward()
        per_rank.append({n: p.grad for n, p in model.named_parameters()})
    start = dict(build_stack(kind, SMALL, seed, CPU, torch.float64).named_parameters())
    for n in names:
        avg = sum(g[n] for g in per_rank) / world
        assert ref.grads[n].shape == start[n].shape
        torch.testing.assert_close(ref.grads[n].double(), avg, rtol=1e-4, atol=1e-6)
        # one AdamW step from the seed's weights with the check's eps, by hand
        g, p0 = ref.grads[n].double(), start[n].detach()
        want = p0 * (1 - strat.LR * 0.01) - strat.LR * g / (g.abs() + ref.eps)
        torch.testing.assert_close(ref.params[n].double(), want, rtol=0, atol=1e-6)
        assert (ref.params[n].double() - p0).abs().max() <= strat.LR * (1 + 0.01 * 10)


# ---- one rank: the trainers, their collectives and their state ---------------------------------

@pytest.fixture(scope="module")
def group(one_rank_group):
    return None


def test_comm_counter_sees_each_collective_with_nccl_tests_sizes(group):
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    with CommCounter() as c:
        dist.all_reduce(torch.ones(10))
        dist.broadcast(torch.ones(3, dtype=torch.float64), src=0)
        gather(torch.empty(6), torch.ones(6))
        scatter(torch.empty(5), torch.ones(5))
        torch.ones(4).sum()  # not a collective
    assert c.calls == [CommCall("all_reduce", 40, torch.float32),
                       CommCall("broadcast", 24, torch.float64),
                       CommCall("all_gather", 24, torch.float32),
                       CommCall("reduce_scatter", 20, torch.float32)]
    assert op_counts(c.calls) == {"all_reduce": 1, "broadcast": 1, "all_gather": 1,
                                  "reduce_scatter": 1}
    assert op_bytes(c.calls) == {"all_reduce": 40, "broadcast": 24, "all_gather": 24,
                                 "reduce_scatter": 20}


def test_replay_issues_the_same_collectives_again(group):
    calls = [CommCall("all_reduce", 40, torch.float32), CommCall("broadcast", 24, torch.float64),
             CommCall("all_gather", 24, torch.float32),
             CommCall("reduce_scatter", 20, torch.bfloat16)]
    waited = []
    run = replay(calls, CPU, before=lambda: waited.append(1))
    with CommCounter() as c:
        run()
        run()
    assert c.calls == calls * 2
    assert waited == [1, 1]  # the hook runs ahead of every all-reduce, only


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("mode", MODES)
def test_one_rank_trainer_holds_the_table_and_matches_the_reference(group, mode, dtype):
    """At one rank nothing is sharded: the table's N = 1 column (what storage_bytes finds on
    the trainer's own tensors, less AdamW's float32 step count per weight), DDP's collectives
    as the formula counts them, and one step as the single-rank reference takes it."""
    from distbench.steps.reference import RTOL

    tdtype = getattr(torch, dtype)
    shapes = f.param_shapes("mlp", SMALL.hidden_size, SMALL.ffn_size, SMALL.layers)
    batch = strat.local_batch(SMALL, 3, 0, CPU, tdtype)
    trainer = strat.build(mode, "mlp", SMALL, 3, CPU, tdtype, 25.0, batch)
    trainer.step()
    trainer.step()
    with CommCounter() as c:
        state = trainer.measured_step()
    steps = 4 * len(shapes)
    assert sum(state.values()) - steps == f.state_bytes(mode, shapes, dtype, 1)
    if mode in ("ddp", "zero1"):  # FSDP issues nothing on one rank
        elt = tdtype.itemsize
        assert sum(x.size_bytes for x in c.calls) == f.bytes_per_step(mode, shapes, elt, 1)
    ref = strat.reference("mlp", SMALL, 3, 1, tdtype)
    pairs = strat.mode_vs_reference(mode, "mlp", SMALL, 3, 0, 1, CPU, tdtype, 25.0, ref)
    assert len(pairs) == 2 * len(shapes)
    assert refmod.check_tensors(pairs, RTOL["dp"][dtype]).worst_ratio <= 1


# ---- the dp.csv contract -----------------------------------------------------------------------

REQUIRED = ("step_us", "compute_only_us", "comm_alone_us", "exposed_comm_us", "overlap_pct",
            "bytes_per_step", "implied_busbw_gbps", "state_bytes_per_rank", "peak_mem_bytes",
            "samples_per_s", "t1_us", "efficiency", "max_abs_err", "status", "note")


def test_dp_csv_contract():
    csv = OUTPUT.csv
    assert OUTPUT.file == "dp.csv"
    assert isinstance(csv, tuple) and all(isinstance(c, str) for c in csv)
    assert len(set(csv)) == len(csv)
    assert [c for c in REQUIRED if c not in csv] == []
    assert csv[0] == "mode" and "bucket_cap_mb" in csv and "world_size" in csv
    keys = [c.key for c in OUTPUT.console]
    assert [k for k in keys if k not in csv] == []
    assert keys[:2] == ["mode", "bucket_cap_mb"]  # the row's identity comes first
    assert [c.key for c in OUTPUT.console if c.ident] == ["mode", "bucket_cap_mb"]


def test_every_option_of_the_shape_is_a_csv_column():
    shape = StackShape.from_options(DPOptions())
    assert set(shape.to_json()) <= set(OUTPUT.csv)


# ---- a mode one rank cannot run: a skipped row quoting why, and the next mode still runs -----

class _NoAllReduce(torch.nn.Module):
    """DDP's place on the fake group, which has no process group object for DDP to hold: the
    same module and comm-hook call, gradients left as each rank computed them."""

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.module = module

    def forward(self, *args):
        return self.module(*args)

    def register_comm_hook(self, state, hook) -> None:
        pass


def _skip_on(rank: int) -> list[dict]:
    """zero2 then ddp on one rank of two, rank 1 refusing to build zero2 (as a backend without
    reduce_scatter would): the rows each rank returns."""
    from fake_session import FakeSession, fake_runtime

    from distbench.steps import dp as steps

    shape = StackShape(hidden_size=64, ffn_size=128, heads=4, seq_len=16, micro_batch_size=2,
                       layers=2)
    s = FakeSession(fake_runtime(rank, 2), block="mlp", dtype="float32", timeout=60, warmup=0,
                    iters=2, check=False)
    batch = strat.local_batch(shape, 1, rank, CPU, torch.float32)
    return [steps._measure(s, mode, bucket, shape, torch.float32, batch, 0.001, None, shape,
                           True, [])[0] for mode, bucket in (("zero2", None), ("ddp", 25.0))]


def test_a_mode_one_rank_cannot_run_is_a_skipped_row_quoting_why(monkeypatch, capsys):
    from fake_group import run_ranks


    real = strat.build

    def build(mode, *args, **kwargs):
        if mode == "zero2":  # FSDP needs a real process group: rank 0's is a stand-in
            if dist.get_rank() == 1:
                raise NotImplementedError("reduce_scatter is not supported on this backend\n"
                                          "second line")
            return "rank 0's zero2, built and never stepped"
        return real(mode, *args, **kwargs)

    monkeypatch.setattr(strat, "build", build)
    monkeypatch.setattr(strat, "ddp", lambda module, *args, **kwargs: _NoAllReduce(module))
    monkeypatch.setattr(recipe, "free", lambda device: None)  # collections cost, prove nothing
    r0, r1 = run_ranks(monkeypatch, 2, _skip_on)
    for skipped, ran in (r0, r1):
        assert skipped["mode"] == "zero2" and skipped["status"] == "skipped"
        # rank 0 writes the row: it quotes rank 1's reason, first line only
        assert skipped["note"] == ("cannot run here: NotImplementedError: reduce_scatter is not "
                                   "supported on this backend")
        assert "step_us" not in skipped
        assert ran["mode"] == "ddp" and ran["status"] == "ok" and ran["step_us"] > 0
    # the refusing rank says why at once, its peer may be waiting in a collective
    assert capsys.readouterr().err.splitlines() == [
        "distbench: rank 1: dp zero2 (build): NotImplementedError: reduce_scatter is not "
        "supported on this backend"]
