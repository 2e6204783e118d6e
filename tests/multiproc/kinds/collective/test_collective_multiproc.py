"""Real gloo workers on 127.0.0.1: what they wrote to the CSV and run.json, not just exit codes."""

from __future__ import annotations

import csv
import json
import re

import helpers
import pytest
from golden_runs import RECORDED, assert_matches_recording
from helpers import distbench
from paths import REPO

from distbench.run.session import NO_LOST_RANK

pytestmark = pytest.mark.multiproc

ELT = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int32": 4, "int64": 8,
       "int8": 1, "uint8": 1}
SPLIT = {"reduce_scatter", "all_gather", "all_to_all", "gather", "scatter"}
ALL_OPS = {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all",
           "gather", "scatter"}


def factor(op: str, n: int) -> float:  # nccl-tests' table, written out again on purpose
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("broadcast", "reduce"):
        return 1.0
    return (n - 1) / n


@pytest.fixture(scope="module")
def world3(tmp_path_factory):
    """`collective --op all` at world size 3, once: test_golden.py's recorded sweep (two dtypes,
    two redops, both placements), checked against the recording and by the rules below."""
    return distbench(tmp_path_factory.mktemp("world3"), *RECORDED["collective"])


def test_every_op_at_world_size_2(tmp_path):
    requested = [4, 1000, 65536]
    res = distbench(tmp_path, "collective", "--op", "all", "--sizes", ",".join(map(str, requested)),
                    "--placement", "both", "--iters", "2", "--warmup", "1", "--workers", "2")
    check_every_op(res, 2, requested)


def test_every_op_at_world_size_3(world3):
    check_every_op(world3, 3, [2, 1024, 65536])


def test_world_size_3_writes_the_recorded_csv(world3):
    assert_matches_recording("collective", world3)


def check_every_op(res, n: int, requested: list[int]) -> None:
    """Every op ran on n ranks of one node, sized and accounted as nccl-tests does."""
    assert res.code == 0, res.stderr
    rows = res.rows()
    assert {r["op"] for r in rows} == ALL_OPS
    ok = [r for r in rows if r["status"] == "ok"]
    for r in rows:
        assert int(r["world_size"]) == n and int(r["nnodes"]) == 1
    for r in ok:
        op, size, count = r["op"], int(r["size_bytes"]), int(r["count"])
        elt = ELT[r["dtype"]]
        assert size == count * elt
        assert int(r["wrong"]) == 0
        if op in SPLIT:  # the requested total, rounded down to 16 B per rank, as nccl-tests
            assert size % (n * 16) == 0
            assert any(req - n * 16 < size <= req for req in requested)
        else:
            assert size in requested
        algbw, busbw, t = float(r["algbw_gbps"]), float(r["busbw_gbps"]), float(r["time_us"])
        assert algbw == pytest.approx(size / t / 1e3, rel=1e-4)
        assert busbw == pytest.approx(algbw * factor(op, n), rel=1e-4)
        assert float(r["rank_min_us"]) <= t <= float(r["rank_max_us"])
        assert 0 <= int(r["slowest_rank"]) < n
        assert int(r["iters"]) == 2
    # the smallest size (4 or 2 bytes) cannot give every rank a float32 of a split op: a
    # skipped row with a note
    tiny = [r for r in rows if r["op"] in SPLIT and r["dtype"] == "float32"
            and r["size_bytes"] == str(requested[0])]
    assert tiny and all(r["status"] == "skipped" and "too small" in r["note"] for r in tiny)
    # both placements where torch has them, in-place only where it has nothing else
    places = {(r["op"], r["in_place"]) for r in ok}
    assert ("reduce_scatter", "0") in places and ("reduce_scatter", "1") in places
    assert ("all_gather", "0") in places and ("all_gather", "1") in places
    assert ("all_reduce", "1") in places and ("all_reduce", "0") not in places
    meta = res.meta()
    assert meta["status"] == "ok" and meta["exit_code"] == 0 and meta["world_size"] == n
    assert len(meta["ranks"]) == n and meta["end_utc"]
    assert "CPU-only" in (res.run_dir / "topo.txt").read_text()
    assert "all_reduce" in res.stdout and "busbw" in res.stdout


# Read by two tests: the dtypes and redops a config piped to the launcher asks for.
PIPED = ('op = "all_reduce,reduce_scatter,reduce"\ndtype = "all"\nredop = "all"\n'
         'sizes = "768"\niters = 1\nwarmup = 0\n')


@pytest.fixture(scope="module")
def piped(tmp_path_factory):
    """`distbench collective --config /dev/stdin --workers 3`, PIPED on its stdin."""
    out = tmp_path_factory.mktemp("piped")
    return distbench(out, "collective", "--config", "/dev/stdin", "--workers", "3",
                     stdin=PIPED, timeout=120)


def test_dtypes_and_redops_are_checked_or_skipped_with_reason(piped):
    res = piped
    assert res.code == 0, res.stderr
    rows = res.rows()
    assert len(rows) == 3 * 8 * 5
    for r in rows:
        if r["redop"] == "avg" and r["dtype"].startswith(("int", "uint")):
            assert r["status"] == "skipped" and "floating-point" in r["note"]
        else:
            assert r["status"] == "ok", r
            assert r["wrong"] == "0", r


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """Two workers, all_reduce of 4 KiB, the iterations calibrated to --min-time; no fault
    planted. Calibration takes the fastest warmup op, so noise during the warmup can only
    lengthen the loop; a median (of 5, then of 20) came out 3 to 4.6x the timed loop's mean on
    this 2-core machine now and then (13 x 0.83 ms = 0.011 s). 20 ops give a burst less room
    still."""
    return distbench(tmp_path_factory.mktemp("calibrated"), "collective", "--sizes", "4K",
                     "--min-time", "0.05", "--warmup", "20")


def test_calibrated_iterations_follow_min_time(calibrated):
    res = calibrated
    assert res.code == 0, res.stderr
    (row,) = res.rows()
    iters = int(row["iters"])
    assert 5 <= iters <= 10_000
    # the loop took about --min-time: not one op, not ten times the target
    assert 0.02 <= iters * float(row["time_us"]) / 1e6 <= 1.0


def test_a_corrupted_result_is_caught(tmp_path):
    res = distbench(tmp_path, "collective", "--op", "all_reduce,all_gather", "--sizes", "4K,64K",
                    "--iters", "2", "--warmup", "1", DISTBENCH_TEST_CORRUPT_RANK="1")
    assert res.code == 1, res.stderr
    rows = res.rows()
    assert len(rows) == 4 and all(int(r["wrong"]) == 1 for r in rows)  # one element, one rank
    assert res.meta()["status"] == "wrong" and res.meta()["exit_code"] == 1
    assert "wrong results" in res.stderr
    # each wrong step named, as for an op registered outside distbench (test_registry.py)
    assert "all_reduce 4 KiB float32" in res.meta()["error"]


def test_a_clean_run_has_no_wrong_elements_without_the_hook(calibrated):
    res = calibrated
    assert res.code == 0 and res.rows()[0]["wrong"] == "0"


def test_a_stalled_rank_ends_the_run_at_the_timeout(tmp_path):
    """Rank 1 hangs in its 64 KiB setup while rank 0 waits for it in the warmup: both have a
    3 s watchdog, and either may fire first. Whichever does decides, the same way: run.json
    says timeout in that rank's words (not "failed" on the connection it closed as it left),
    and one line says so."""
    res = distbench(tmp_path, "collective", "--sizes", "4K,64K,1M", "--iters", "2",
                    "--warmup", "1", "--timeout", "3", DISTBENCH_TEST_STALL="1:65536")
    assert res.code == 3, res.stderr
    assert res.secs < 60
    rows = res.rows()
    assert [r["size_bytes"] for r in rows] == ["4096"] and rows[0]["wrong"] == "0"
    meta = res.meta()
    assert (meta["status"], meta["exit_code"]) == ("timeout", 3), meta
    step = r"all_reduce 64 KiB float32 sum in-place \((setup|warmup)\)"
    assert re.fullmatch(rf"timed out after 3 s in {step} on rank [01]: "
                        + re.escape(NO_LOST_RANK), meta["error"]), meta["error"]
    said = [line for line in res.stderr.splitlines() if "error:" in line]
    assert len(said) == 1 and said[0].endswith(f"error: {meta['error']}"), res.stderr


def test_smoke_config_file(tmp_path):
    """configs/smoke-gloo.toml is what CI smoke runs use: it must run as documented."""

    config = REPO / "configs" / "smoke-gloo.toml"
    res = distbench(tmp_path, "collective", "--config", str(config), "--iters", "2",
                    "--warmup", "1")
    assert res.code == 0, res.stderr
    rows = res.rows()
    assert {r["op"] for r in rows} == ALL_OPS
    assert {r["iters"] for r in rows if r["status"] == "ok"} == {"2"}  # the flag beat the file
    assert {r["size_bytes"] for r in rows if r["op"] == "all_reduce"} == {
        str(1024 * 4 ** k) for k in range(4)}
    assert all(r["wrong"] == "0" for r in rows if r["status"] == "ok")
    assert res.meta()["options"]["placement"] == "both"


def test_config_from_a_pipe_reaches_the_workers(piped):
    """--config /dev/stdin can be read once: the workers run the options the launcher
    validated, not the defaults an empty stdin would give them."""
    proc = piped
    assert proc.code == 0, proc.stderr
    (run_dir,) = [p for p in proc.out.iterdir() if p.is_dir()]
    rows = list(csv.DictReader(open(run_dir / "collective.csv")))
    assert {(r["op"], r["size_bytes"], r["iters"]) for r in rows if r["status"] == "ok"} == {
        (op, "768", "1") for op in ("all_reduce", "reduce_scatter", "reduce")}
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["options"]["sizes"] == [768] and meta["options"]["iters"] == 1
    assert meta["options"]["warmup"] == 0 and len(meta["options"]["dtypes"]) == 8
    # run.json keeps what the user typed, not the flags handed to the workers
    assert meta["argv"] == ["collective", "--config", "/dev/stdin", "--workers", "3", "--out",
                            str(proc.out)]


def test_strided_groups_across_two_nodes_all_run_at_once(tmp_path):
    """--group-size 2 --group-stride 2 on 4 ranks of 2 (fake) nodes: the DP groups of tp 2,
    {0,2} and {1,3}, one rank on each node. Sizes, skips and busbw by the group's 2 ranks (32 B
    of reduce_scatter give each of 2 its 16 B, where 4 ranks would be too many); every rank ran
    the ops on its own group (its posts, recorded), under NCCL's rules and with no group left."""
    res = distbench(tmp_path, "collective", "--op", "all_reduce,reduce_scatter", "--sizes",
                    "32,1K", "--iters", "2", "--warmup", "1", "--reps", "1", "--workers", "4",
                    "--group-size", "2", "--group-stride", "2", DISTBENCH_TEST_NODE_SIZE="2")
    assert res.code == 0, res.stderr
    rows = res.rows()
    assert [(r["op"], r["size_bytes"]) for r in rows] == [
        ("all_reduce", "32"), ("all_reduce", "1024"), ("reduce_scatter", "32"),
        ("reduce_scatter", "1024")]
    for r in rows:
        assert r["status"] == "ok" and r["wrong"] == "0", r
        assert (r["world_size"], r["nnodes"], r["group_size"], r["group_stride"], r["groups"],
                r["per_node"]) == ("4", "2", "2", "2", "2", "1"), r
        assert int(r["size_bytes"]) == int(r["count"]) * 4
        assert float(r["busbw_gbps"]) == pytest.approx(
            float(r["algbw_gbps"]) * factor(r["op"], 2), rel=1e-4)
    traces = helpers.LAST_TRACES
    assert sorted(traces) == [0, 1, 2, 3]
    for rank, trace in traces.items():
        mine = [rank % 2, rank % 2 + 2]
        (group,) = [g for g, members in trace.groups.items() if members == mine]
        ops = {(e["op"], e["bytes"]) for e in trace.events if e["group"] == group}
        assert any(b == 1024 for _, b in ops) and len({op for op, _ in ops}) == 2, ops
        assert trace.complete and not trace.alive
    assert "2 groups of 2 at stride 2 (1 rank a node)" in res.stderr + res.stdout
