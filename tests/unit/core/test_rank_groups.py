"""The world split into concurrent groups (issue 31, item 2): which ranks each group holds,
consecutive or strided as a layout's DP group; their ranks per node; the options of
`collective --group-size/--group-stride` refused in one line before any worker; the process
groups made on every rank and destroyed; the strided shapes `plan --workers` measures; and
`plan --from` reading a grouped collective run with the right ranks per node. The workers
themselves: test_collective_multiproc.py."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch.distributed as dist
from helpers import assert_one_line_error, refused, resolved

from distbench.core import rank_groups
from distbench.core.options import OptionError
from distbench.kinds import KINDS
from distbench.kinds.collective.options import group_of
from distbench.kinds.collective.output import OUTPUT as COLLECTIVE
from distbench.kinds.plan import sources
from distbench.planner import points
from distbench.planner.inputs import CommFit, Inputs, Span
from distbench.planner.layouts import Layout
from distbench.planner.predict import dp_collectives_us, dp_ops, spans
from distbench.run import split


def dp_groups(tp: int, dp: int, pp: int) -> list[list[int]]:
    """A layout's DP groups from its mesh (pp, dp, tp), worked out apart from rank_groups: the
    ranks that share a stage and a TP position."""
    world = tp * dp * pp
    coords = {r: (r // (tp * dp), r // tp % dp, r % tp) for r in range(world)}
    return sorted(sorted(r for r, (p, _, t) in coords.items() if (p, t) == (stage, pos))
                  for stage in range(pp) for pos in range(tp))


def test_consecutive_and_strided_groups():
    assert rank_groups.members(4, 2) == [[0, 1], [2, 3]]
    assert rank_groups.members(4, 2, 2) == [[0, 2], [1, 3]]
    assert rank_groups.members(8, 2, 2) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert rank_groups.members(16, 2, 8) == [[r, r + 8] for r in range(8)]


@pytest.mark.parametrize(("tp", "dp", "pp"), [(2, 2, 1), (2, 2, 2), (8, 2, 1), (4, 2, 2),
                                              (2, 4, 1), (1, 4, 2)])
def test_a_stride_of_tp_gives_the_layouts_dp_groups(tp, dp, pp):
    got = rank_groups.members(tp * dp * pp, dp, tp)
    assert sorted(got) == dp_groups(tp, dp, pp)
    assert sorted(r for g in got for r in g) == list(range(tp * dp * pp))


@pytest.mark.parametrize(("world", "size", "stride", "flag", "says"), [
    (4, 3, 1, "--group-size", "does not divide the 4 ranks"),
    (4, 1, 1, "--group-size", "moves nothing"),
    (4, 8, 1, "--group-size", "groups of 8 ranks in a world of 4"),
    (4, 4, 2, "--group-stride", "blocks of 8 ranks"),
    (4, 2, 3, "--group-stride", "blocks of 6 ranks"),
    (8, 2, 0, "--group-stride", "1 or more"),
])
def test_a_split_the_world_cannot_hold_is_refused(world, size, stride, flag, says):
    with pytest.raises(OptionError, match=says) as e:
        rank_groups.check(world, size, stride)
    assert str(e.value).startswith(f"{flag}: ")
    # the example it gives is a split that world holds
    example = str(e.value).rpartition("(example: ")[2].rstrip(")").split()
    rank_groups.check(world, int(example[1]), int(example[3]) if len(example) > 3 else 1)


def test_group_size_is_asked_for_only_when_it_was_not_given():
    """--group-stride 2 alone takes the world as the group: say to give --group-size. Given
    (--group-size 4 --group-stride 2 on 4 ranks), it is not asked for again."""
    with pytest.raises(OptionError, match="give --group-size too"):
        rank_groups.check(4, 4, 2, size_given=False)
    with pytest.raises(OptionError) as e:
        rank_groups.check(4, 4, 2, size_given=True)
    assert "give --group-size" not in str(e.value) and "blocks of 8 ranks" in str(e.value)


@pytest.mark.parametrize(("args", "says", "not_says"), [
    (["--group-stride", "2"], "give --group-size too", None),
    (["--group-size", "4", "--group-stride", "2"], "blocks of 8 ranks", "give --group-size"),
])
def test_collective_asks_for_group_size_only_when_missing(in_process, tmp_path, args, says,
                                                          not_says):
    out = tmp_path / "results"
    res = in_process("collective", "--workers", "4", *args, "--out", str(out))
    assert_one_line_error(res, None, "--group-stride", True)
    assert says in res.stderr and (not_says is None or not_says not in res.stderr)
    assert not out.exists()


@pytest.mark.parametrize(("world", "size", "stride"), [(4, 2, 1), (4, 2, 2), (4, 4, 1),
                                                       (16, 2, 8), (12, 3, 2)])
def test_a_split_that_tiles_the_world_passes(world, size, stride):
    rank_groups.check(world, size, stride)


def test_ranks_per_node_of_a_group_and_of_a_split():
    two_nodes = ["a", "a", "b", "b"]
    assert rank_groups.per_node([0, 1], two_nodes) == 2  # inside a node: its size
    assert rank_groups.per_node([0, 2], two_nodes) == 1
    assert rank_groups.per_node([0, 1, 2], two_nodes) == 1  # the fewest on a node it spans
    assert rank_groups.placement(rank_groups.members(4, 2, 2), two_nodes) == (1, "")
    # 16 GPUs on 2 nodes of 8: tp 8's DP groups hold one GPU per node, tp 4's two
    sixteen = [r // 8 for r in range(16)]
    assert rank_groups.placement(rank_groups.members(16, 2, 8), sixteen) == (1, "")
    assert rank_groups.placement(rank_groups.members(16, 4, 4), sixteen) == (2, "")
    # 6 ranks on 2 nodes of 3: {2,3} straddles them beside two groups inside one
    per_node, note = rank_groups.placement(rank_groups.members(6, 2), [0, 0, 0, 1, 1, 1])
    assert per_node == 1 and "placed unlike" in note


@pytest.mark.parametrize(("args", "flag"), [
    (["--group-size", "3"], "--group-size"),
    (["--group-size", "1"], "--group-size"),
    (["--group-stride", "2"], "--group-stride"),
    (["--group-size", "2", "--group-stride", "3"], "--group-stride"),
    (["--group-size", "2", "--group-stride", "0"], "--group-stride"),
    (["--group-size", "2", "--root", "2"], "--root"),
])
def test_collective_refuses_a_bad_split_before_any_worker(in_process, tmp_path, args, flag):
    out = tmp_path / "results"
    res = in_process("collective", "--workers", "4", *args, "--out", str(out))
    assert_one_line_error(res, None, flag, True)
    assert not out.exists()


def test_collective_takes_a_split_and_sizes_buffers_by_the_group(tmp_path):
    opts = resolved(tmp_path, "collective", "--workers", "4", "--group-size", "2",
                    "--group-stride", "2", "--op", "all_gather")
    assert (opts.group_size, opts.group_stride, group_of(opts, 4)) == (2, 2, 2)
    assert opts.buffer_multiple(4) == 3  # all_gather's input and its output of 2 blocks
    whole = resolved(tmp_path, "collective", "--workers", "4", "--op", "all_gather")
    assert (whole.group_size, group_of(whole, 4), whole.buffer_multiple(4)) == (None, 4, 5)


class FakeDist:
    """What split.split asks of torch.distributed, recorded."""

    def __init__(self, rank: int):
        self.rank, self.made, self.destroyed = rank, [], []

    def new_subgroups_by_enumeration(self, lists, timeout=None):
        self.made.append([list(g) for g in lists])
        return ("group", tuple(next(g for g in lists if self.rank in g))), []

    def destroy_process_group(self, group=None):
        self.destroyed.append(group)


def _rt(rank: int, nodes: list[int]) -> SimpleNamespace:
    return SimpleNamespace(rank=rank, world=len(nodes), backend="gloo",
                           ranks=[{"rank": r, "node": n} for r, n in enumerate(nodes)])


def test_every_rank_makes_every_group_and_destroys_its_own(monkeypatch):
    fake = FakeDist(rank=3)
    monkeypatch.setattr(dist, "new_subgroups_by_enumeration", fake.new_subgroups_by_enumeration)
    monkeypatch.setattr(dist, "destroy_process_group", fake.destroy_process_group)
    with split.split(_rt(3, [0, 0, 1, 1]), 2, 2, 30) as part:
        assert fake.made == [[[0, 2], [1, 3]]]  # every group, in one call
        assert (part.mine, part.rank, part.per_node, part.crosses) == ([1, 3], 1, 1, True)
        assert fake.destroyed == []
    assert fake.destroyed == [("group", (1, 3))]
    # the whole world is the default group: nothing made, nothing destroyed
    with split.split(_rt(3, [0, 0, 1, 1]), 4, 1, 30) as part:
        assert part.group is None and (part.per_node, part.crosses) == (2, True)
    assert len(fake.made) == 1 and len(fake.destroyed) == 1


def test_a_failed_block_leaves_its_group_to_the_process_end(monkeypatch):
    fake = FakeDist(rank=0)
    monkeypatch.setattr(dist, "new_subgroups_by_enumeration", fake.new_subgroups_by_enumeration)
    monkeypatch.setattr(dist, "destroy_process_group", fake.destroy_process_group)
    with pytest.raises(RuntimeError), split.split(_rt(0, [0, 0, 1, 1]), 2, 1, 30):
        raise RuntimeError("a peer is gone")
    assert fake.destroyed == []  # a destroy could wait on the peer that is gone


# ---------------------------------------------------------------------------------------------
# plan: the shapes its workers measure, and a grouped collective run read back


class Recording(Inputs):
    """Inputs that price every collective at 1 us and keep the ops asked for."""

    def comm_us(self, op, ranks, span, size_bytes):
        self.asked.append(op)
        return 1.0


def test_dp_ops_are_the_ops_the_dp_time_prices():
    for zero in (0, 1, 2, 3):
        inputs = Recording()
        inputs.asked = []
        dp_collectives_us(inputs, Layout(tp=1, pp=1, dp=2, zero=zero, micro_batches=2), "node",
                          1024)
        assert sorted(set(inputs.asked)) == sorted(dp_ops(zero)), zero


def test_the_workers_measure_the_strided_groups_of_their_layouts_across_nodes():
    two_nodes = [0, 0, 1, 1]
    layouts = [Layout(tp=2, pp=1, dp=2, zero=z, micro_batches=1) for z in (0, 3)] + [
        Layout(tp=1, pp=2, dp=2, micro_batches=2), Layout(tp=1, pp=1, dp=4)]
    shapes = points.group_shapes(layouts, 4, two_nodes)
    consecutive = [s for s in shapes if s.stride == 1]
    assert [(s.size, s.ops) for s in consecutive] == [
        (2, ("all_reduce", "all_gather", "reduce_scatter", "sendrecv")),
        (4, ("all_reduce", "all_gather", "reduce_scatter"))]
    # tp 2's DP groups {0,2}, {1,3} with DDP's and ZeRO-3's ops; pp 2 dp 2's hop 2 ranks apart
    assert [(s.size, s.stride, s.ops) for s in shapes if s.stride > 1] == [
        (2, 2, ("all_gather", "all_reduce", "reduce_scatter", "sendrecv"))]
    # the plan places those layouts' groups as measured: one rank per node
    assert spans(layouts[0], 2)["dp"] == Span(crosses=True, per_node=1)
    assert spans(layouts[2], 2)["pp"] == Span(crosses=True, per_node=1)
    # on one node a stride shares the same links: nothing more to measure
    assert all(s.stride == 1 for s in points.group_shapes(layouts, 4, [0, 0, 0, 0]))
    # 8 ranks on 2 nodes of 4: tp 2 dp 4 is 2 per node, not the 4 of consecutive ranks
    eight = [r // 4 for r in range(8)]
    got = points.group_shapes([Layout(tp=2, pp=1, dp=4), Layout(tp=4, pp=1, dp=2)], 8, eight)
    assert [(s.size, s.stride) for s in got if s.stride > 1] == [(2, 4), (4, 2)]


def _write_collective(root: Path, rows: list[dict]) -> Path:
    root.mkdir(parents=True)
    with open(root / "collective.csv", "w", newline="") as fh:
        out = csv.DictWriter(fh, COLLECTIVE.csv)
        out.writeheader()
        for r in rows:
            out.writerow({c: r.get(c, "") for c in COLLECTIVE.csv})
    (root / "run.json").write_text(json.dumps({"command": "collective", "status": "ok",
                                               "backend": "nccl"}))
    return root


def _rows(op: str, alpha: float, beta: float, **cells) -> list[dict]:
    return [{"op": op, "dtype": "float32", "redop": "sum", "root": -1, "in_place": 1,
             "size_bytes": 2**k, "count": 2**k // 4, "time_us": alpha + 2**k / (beta * 1e3),
             "p99_us": 1, "algbw_gbps": 1, "busbw_gbps": 1, "status": "ok", **cells}
            for k in range(10, 31, 2)]


def test_plan_from_a_grouped_collective_run_keys_its_fits_by_the_groups_ranks_per_node(
        tmp_path):
    # 16 GPUs on 2 nodes: tp 8's DP groups (2 ranks, 1 per node) at 20 GB/s; 8 per node (the
    # whole world) at 160; consecutive groups of 8 inside a node at 300; an older row without
    # the group columns, the whole world
    run = _write_collective(tmp_path / "run", [
        *_rows("all_reduce", 40.0, 20.0, world_size=16, nnodes=2, group_size=2,
               group_stride=8, groups=8, per_node=1),
        *_rows("all_reduce", 60.0, 160.0, world_size=16, nnodes=2, group_size=16,
               group_stride=1, groups=1, per_node=8),
        *_rows("all_reduce", 10.0, 300.0, world_size=16, nnodes=2, group_size=8,
               group_stride=1, groups=2, per_node=8),
        *_rows("all_gather", 50.0, 100.0, world_size=16, nnodes=2)])
    got = sources.read([run])
    fits = {(f.op, f.ranks, f.span, f.per_node): f for f in got.fits}
    assert set(fits) == {("all_reduce", 2, "nodes", 1), ("all_reduce", 16, "nodes", 8),
                         ("all_reduce", 8, "node", None), ("all_gather", 16, "nodes", 8)}
    assert fits["all_reduce", 2, "nodes", 1].beta_gbps == pytest.approx(20.0, rel=0.01)
    assert fits["all_reduce", 8, "node", None].alpha_us == pytest.approx(10.0, rel=0.01)
    # tp 8 dp 2 on those 16: its DP group is priced from the fit of its own shape, unscaled
    got.gpus_per_node = 8
    layout = Layout(tp=8, pp=1, dp=2)
    span = spans(layout, 8)["dp"]
    assert span == Span(crosses=True, per_node=1)
    size = 2**30
    assert got.comm_us("all_reduce", 2, span, size) == pytest.approx(
        fits["all_reduce", 2, "nodes", 1].time_us(size))
    assert not any("x " in n and "per node" in n for n in got.notes)


def test_a_fit_of_a_grouped_run_survives_inputs_json(tmp_path):
    saved = Inputs(fits=[CommFit(op="all_reduce", ranks=2, span="nodes", alpha_us=1.0,
                                 beta_gbps=2.0, per_node=1, source="measured here")])
    assert Inputs.from_json(json.loads(json.dumps(saved.to_json()))).fits == saved.fits


def test_report_says_how_a_grouped_run_split_its_world(tmp_path):
    from distbench.results import reader, report

    grouped = _write_collective(tmp_path / "grouped", _rows(
        "all_reduce", 40.0, 20.0, world_size=16, nnodes=2, group_size=2, group_stride=8,
        groups=8, per_node=1))
    whole = _write_collective(tmp_path / "whole", _rows(
        "all_reduce", 40.0, 20.0, world_size=16, nnodes=2, group_size=16, group_stride=1,
        groups=1, per_node=8))
    runs = [reader.load(grouped), reader.load(whole)]
    text = "\n".join(report.markdown(runs, KINDS.values(), []))
    assert "16 ranks on 2 node(s), in 8 groups of 2 at stride 8 (1 a node) all at once" in text
    assert text.count("groups of") == 1


def test_a_baseline_of_other_groups_is_refused_before_any_worker(in_process, tmp_path):
    base = _write_collective(tmp_path / "base", _rows(
        "all_reduce", 40.0, 20.0, world_size=4, nnodes=2, group_size=2, group_stride=2,
        groups=2, per_node=1))
    for other in (["--group-size", "2"], []):
        res = in_process("collective", "--workers", "4", "--baseline", str(base), *other,
                         "--out", str(tmp_path / "out"))
        line = assert_one_line_error(res, None, "--baseline", True)
        assert "groups of 2 at stride 2" in line
    same = in_process("collective", "--workers", "4", "--baseline", str(base), "--group-size",
                      "2", "--group-stride", "2", "--out", str(tmp_path / "out"))
    assert same.code == 0, same.stderr


def test_a_root_outside_a_group_says_the_group_and_outside_the_world_says_the_world(tmp_path):
    """The group's reminder only where there are groups: a plain run's refusal reads as before."""
    assert "rank 2 does not exist in a group of 2 (the root is a rank of each group)" in refused(
        tmp_path, "collective", "--workers", "4", "--group-size", "2", "--root", "2")
    assert refused(tmp_path, "collective", "--workers", "2", "--root", "5").strip() == (
        "distbench: error: --root: rank 5 does not exist in a world of 2 (example: --root 0)")
