"""collective's combinations, typed (bench.combinations): what a run measures, built without
torch and without workers."""

from __future__ import annotations

from distbench.bench.combinations import Combination, combinations


def _key(c: Combination) -> tuple:
    return c.op.name, c.dtype, c.redop, c.root, c.in_place, c.skip


def test_every_op_dtype_redop_is_a_combination_with_its_root_and_placement():
    got = [_key(c) for c in combinations(["all_reduce", "broadcast", "all_gather"],
                                         ["float32", "int32"], ["sum", "avg"], 1, "out")]
    assert got == [
        ("all_reduce", "float32", "sum", -1, True, ""),
        ("all_reduce", "float32", "avg", -1, True, ""),
        ("all_reduce", "int32", "sum", -1, True, ""),
        ("all_reduce", "int32", "avg", -1, True, "avg needs a floating-point dtype"),
        ("broadcast", "float32", "none", 1, True, ""),
        ("broadcast", "int32", "none", 1, True, ""),
        ("all_gather", "float32", "none", -1, False, ""),
        ("all_gather", "int32", "none", -1, False, ""),
    ]


def test_in_place_asked_of_an_op_without_one_is_a_skipped_combination():
    (c,) = combinations(["all_to_all"], ["float32"], ["sum"], 0, "in")
    assert c.in_place and c.skip == "all_to_all has no in-place form in torch.distributed"
    both = combinations(["reduce_scatter", "all_to_all"], ["float32"], ["max"], 0, "both")
    assert [_key(c) for c in both] == [("reduce_scatter", "float32", "max", -1, False, ""),
                                       ("reduce_scatter", "float32", "max", -1, True, ""),
                                       ("all_to_all", "float32", "none", -1, False, "")]


def test_a_combination_hands_its_op_the_reduction_and_root():
    (c,) = combinations(["reduce"], ["float32"], ["max"], 2, "out")
    ctx = c.ctx(rank=1, n=4)
    assert (ctx.rank, ctx.n, ctx.root, ctx.redop, ctx.in_place) == (1, 4, 2, "max", True)
    (g,) = combinations(["all_gather"], ["float32"], ["max"], 2, "out")
    assert g.ctx(0, 4).redop == "sum" and g.ctx(0, 4).root == -1
