"""distbench.results.nccltests: nccl-tests logs and -J JSON files read as collective.csv rows.

The fixtures in fixtures/nccl-tests/ were written line by line with nccl-tests' own printf
formats (src/common.cu, src/util.cu) from chosen times, so algbw and busbw in them are what
nccl-tests would print for those times."""

import json
import shutil

import pytest
from doc_columns import documented_columns
from paths import FIXTURES

from distbench.core.errors import ReadError
from distbench.ops.collectives import OPS
from distbench.results.nccltests import read

NCCL_TESTS = FIXTURES / "nccl-tests"
WITH_ROWS = ["bare_table.log", "tag_output.log", "tag_output_every_rank.log", "mixed_multi.log",
             "nccl-alltoall.txt", "broadcast_perf_2019.log", "alltoall_perf_2020.log",
             "reduce_scatter_per_iter.log", "all_reduce.json"]
# nccl-tests prints bandwidths with two decimals
PRINTED = 0.005 + 1e-9


def by_size(rows, op=None):
    return {(r["size_bytes"], r["in_place"]): r for r in rows if op is None or r["op"] == op}


def measured(row):
    return row["time_us"], row["algbw_gbps"], row["busbw_gbps"], row["wrong"]


def copy(tmp_path, fixture, name):
    dst = tmp_path / name
    shutil.copyfile(NCCL_TESTS / fixture, dst)
    return dst


def write(tmp_path, name, text):
    dst = tmp_path / name
    dst.write_text(text)
    return dst


def read_error(path) -> str:
    with pytest.raises(ReadError) as e:
        read(path)
    assert e.value.path == str(path)
    assert str(path) in str(e.value)
    return str(e.value)


@pytest.mark.parametrize("fixture", WITH_ROWS)
def test_rows_have_exactly_the_collective_csv_columns(fixture):
    rows = read(NCCL_TESTS / fixture)
    assert rows
    for row in rows:
        assert list(row) == documented_columns("collective.csv")
        assert row["backend"] == "nccl"
        assert row["status"] == "ok"
        assert row["note"].startswith("nccl-tests")
        assert row["rank_min_us"] is row["rank_max_us"] is row["slowest_rank"] is None
        assert row["launch_bound"] is None


@pytest.mark.parametrize("fixture", WITH_ROWS)
def test_every_size_gives_one_row_per_placement(fixture):
    rows = read(NCCL_TESTS / fixture)
    sizes = [(r["op"], r["size_bytes"]) for r in rows]
    for key in set(sizes):
        assert sorted(r["in_place"] for r in rows if (r["op"], r["size_bytes"]) == key) == [0, 1]


@pytest.mark.parametrize("fixture", WITH_ROWS)
def test_bandwidths_read_are_nccl_tests_accounting(fixture):
    """algbw = size / time, busbw = algbw x the op's bus factor at the world size read."""
    for row in read(NCCL_TESTS / fixture):
        algbw = row["size_bytes"] / row["time_us"] / 1e3
        factor = OPS[row["op"]].accounting.factor(row["world_size"])
        assert row["algbw_gbps"] == pytest.approx(algbw, abs=PRINTED), row
        assert row["busbw_gbps"] == pytest.approx(algbw * factor, abs=PRINTED), row
        assert row["count"] * {"float32": 4, "float16": 2, "bfloat16": 2}[row["dtype"]] \
            == row["size_bytes"]


def test_bare_table_of_the_current_version():
    rows = read(NCCL_TESTS / "bare_table.log")
    assert len(rows) == 12
    assert {r["op"] for r in rows} == {"all_reduce"}  # from the header: the file name is mute
    first = rows[0]
    assert (first["dtype"], first["redop"], first["root"]) == ("float32", "sum", -1)
    assert (first["world_size"], first["nnodes"], first["iters"]) == (8, 1, 20)
    got = by_size(rows)
    assert measured(got[1048576, 0]) == (45.25, 23.17, 40.55, 0)
    assert measured(got[1048576, 1]) == (44.80, 23.41, 40.96, 0)
    assert measured(got[33554432, 0]) == (287.50, 116.71, 204.24, 0)
    assert measured(got[8589934592, 0]) == (48123.4, 178.50, 312.37, 0)  # %7.1f past 10 ms
    assert measured(got[8589934592, 1]) == (48050.9, 178.77, 312.84, 0)
    assert got[8589934592, 0]["count"] == 2147483648
    assert all(r["p50_us"] is r["p99_us"] is r["cv_pct"] is None for r in rows)


def test_mpirun_tag_output_reads_rank_0():
    rows = read(NCCL_TESTS / "tag_output.log")
    assert len(rows) == 6
    assert {(r["op"], r["dtype"], r["redop"], r["root"]) for r in rows} \
        == {("all_gather", "bfloat16", "none", -1)}
    assert {(r["world_size"], r["nnodes"], r["iters"]) for r in rows} == {(8, 2, 50)}
    got = by_size(rows)
    assert measured(got[1048576, 0]) == (60.42, 17.35, 15.19, 0)
    assert measured(got[1048576, 1]) == (59.88, 17.51, 15.32, 0)
    assert measured(got[67108864, 1]) == (809.70, 82.88, 72.52, 0)
    # nccl-tests prints all_gather's per-rank count; distbench counts the whole buffer
    assert got[1048576, 0]["count"] == 1048576 // 2


def test_a_table_every_rank_printed_is_read_once_from_rank_0():
    rows = read(NCCL_TESTS / "tag_output_every_rank.log")
    assert [(r["size_bytes"], r["in_place"], r["time_us"]) for r in rows] == [
        (1048576, 0, 30.12), (1048576, 1, 29.95), (16777216, 0, 221.4), (16777216, 1, 220.8)]
    # The op is named only on the untagged command line echoed before mpirun.
    assert {(r["op"], r["world_size"], r["nnodes"]) for r in rows} == {("all_reduce", 4, 1)}


def test_srun_label_prefix_and_crlf_lines(tmp_path):
    bare = read(NCCL_TESTS / "bare_table.log")
    text = (NCCL_TESTS / "bare_table.log").read_text()
    labelled = "\n".join(f"0: {line}" for line in text.splitlines())
    labelled += "\n1: gpu-3:77:77 [1] NCCL INFO Bootstrap : Using eth0\n"
    assert read(write(tmp_path, "run.out", labelled)) == bare
    assert read(write(tmp_path, "crlf.log", text.replace("\n", "\r\n"))) == bare


def test_a_log_of_two_runs_among_other_output():
    rows = read(NCCL_TESTS / "mixed_multi.log")
    assert [r["op"] for r in rows] == ["all_reduce"] * 6 + ["all_gather"] * 4
    reduce, gather = by_size(rows, "all_reduce"), by_size(rows, "all_gather")
    # the first run is of 2023 (no header names it): its op comes from the echoed command line
    assert measured(reduce[4194304, 0]) == (88.41, 47.44, 47.44, 0)
    assert measured(reduce[268435456, 1]) == (10213.0, 26.28, 26.28, 0)  # %7.0f past 10 ms
    # the second ran with -c 0: #wrong is N/A
    assert measured(gather[16777216, 0]) == (355.20, 47.23, 23.62, None)
    assert measured(gather[16777216, 1]) == (352.80, 47.55, 23.78, None)
    assert gather[65536, 0]["dtype"] == "float16"
    assert {(r["world_size"], r["nnodes"]) for r in rows} == {(2, 1)}


def test_op_from_the_file_name():
    rows = read(NCCL_TESTS / "nccl-alltoall.txt")
    assert {(r["op"], r["redop"], r["root"]) for r in rows} == {("all_to_all", "none", -1)}
    assert {(r["world_size"], r["nnodes"]) for r in rows} == {(16, 2)}
    got = by_size(rows)
    assert measured(got[1073741824, 0]) == (20480.0, 52.43, 49.15, 0)
    assert measured(got[4096, 1]) == (40.87, 0.10, 0.09, 0)


@pytest.mark.parametrize(("name", "op"), [
    ("allreduce_8gpu.log", "all_reduce"), ("reduce_scatter_perf.out", "reduce_scatter"),
    ("run-all_gather.txt", "all_gather"), ("bcast.log", "broadcast"), ("gather.log", "gather"),
    ("sendrecv_perf.log", "sendrecv"),
])
def test_file_names_that_name_one_collective(tmp_path, name, op):
    assert {r["op"] for r in read(copy(tmp_path, "nccl-alltoall.txt", name))} == {op}


@pytest.mark.parametrize("name", ["results.txt", "all_reduce_vs_all_gather.log",
                                  "alltoallv_perf.log"])
def test_a_file_name_that_names_no_one_collective(tmp_path, name):
    message = read_error(copy(tmp_path, "nccl-alltoall.txt", name))
    assert "cannot tell which collective" in message


def test_the_per_collective_header_of_2019():
    rows = read(NCCL_TESTS / "broadcast_perf_2019.log")
    assert {(r["op"], r["redop"], r["root"]) for r in rows} == {("broadcast", "none", 0)}
    assert {(r["world_size"], r["nnodes"], r["iters"]) for r in rows} == {(4, 1, 20)}
    got = by_size(rows)
    # the error column is a maximum delta, not a count of wrong elements
    assert measured(got[33554432, 0]) == (2871.6, 11.68, 11.68, None)
    assert measured(got[65536, 1]) == (21.40, 3.06, 3.06, None)


def test_the_blank_redop_of_alltoall_in_2020():
    got = by_size(read(NCCL_TESTS / "alltoall_perf_2020.log"))
    assert measured(got[8388608, 0]) == (161.3, 52.01, 45.51, None)
    assert measured(got[8388608, 1]) == (160.7, 52.20, 45.68, None)
    assert got[1024, 0]["redop"] == "none"


def test_a_nonzero_old_error_is_noted(tmp_path):
    text = (NCCL_TESTS / "broadcast_perf_2019.log").read_text()
    line = next(x for x in text.splitlines() if x.lstrip().startswith("65536"))
    bad = line[::-1].replace("00+e0", "*70-e1", 1)[::-1]  # the in-place column
    rows = read(write(tmp_path, "broadcast.log", text.replace(line, bad)))
    got = by_size(rows)
    assert "max error 1e-07*" in got[65536, 1]["note"]
    assert got[65536, 0]["note"] == "nccl-tests"


def test_per_iteration_columns_and_timestamps():
    rows = read(NCCL_TESTS / "reduce_scatter_per_iter.log")
    assert {r["op"] for r in rows} == {"reduce_scatter"}
    got = by_size(rows)
    assert measured(got[1048576, 0]) == (38.40, 27.31, 20.48, 0)
    assert (got[1048576, 0]["p99_us"], got[1048576, 0]["cv_pct"]) == (51.20, 9.85)
    assert (got[1048576, 1]["p99_us"], got[1048576, 1]["cv_pct"]) == (48.88, 8.12)
    assert measured(got[268435456, 1]) == (1859.80, 144.34, 108.25, 0)
    assert got[268435456, 1]["p99_us"] == 1880.02
    assert all(r["p50_us"] is None for r in rows)


def test_the_json_file():
    rows = read(NCCL_TESTS / "all_reduce.json")
    assert len(rows) == 6
    assert {(r["op"], r["dtype"], r["redop"], r["root"]) for r in rows} \
        == {("all_reduce", "float32", "sum", -1)}
    # one devices entry per process, one GPU each, 8 per node
    assert {(r["world_size"], r["nnodes"], r["iters"]) for r in rows} == {(16, 2, 20)}
    got = by_size(rows)
    assert measured(got[1048576, 0]) == (71.66, 14.632654, 27.436227, 0)
    assert measured(got[1073741824, 1]) == (11350.1, 94.60197, 177.378694, 0)


def test_json_op_from_args_not_the_file_name(tmp_path):
    assert read(copy(tmp_path, "all_reduce.json", "run7.json")) \
        == read(NCCL_TESTS / "all_reduce.json")


def test_json_unchecked_missing_placement_and_per_iteration(tmp_path):
    doc = json.loads((NCCL_TESTS / "all_reduce.json").read_text())
    first = doc["results"][0]
    first["out_of_place"]["nwrong"] = None
    first["out_of_place_per_iter"] = {"min_us": 20.1, "max_us": 31.0, "avg_us": 22.5,
                                      "p50_us": 22.2, "p95_us": 29.0, "p99_us": 30.7,
                                      "stdev_us": 1.9, "cv_pct": 8.44, "times_us": [22.2]}
    first["in_place"] = None
    doc["results"][1]["in_place"]["time"] = "nan"
    rows = read(write(tmp_path, "run.json", json.dumps(doc)))
    got = by_size(rows)
    assert (8, 1) not in got
    assert got[8, 0]["wrong"] is None
    assert (got[8, 0]["p50_us"], got[8, 0]["p99_us"], got[8, 0]["cv_pct"]) == (22.2, 30.7, 8.44)
    nan = got[1048576, 1]
    assert (nan["status"], nan["time_us"], nan["algbw_gbps"]) == ("skipped", None, None)
    assert "no valid time" in nan["note"]


def test_a_line_without_a_valid_time_is_skipped(tmp_path):
    text = (NCCL_TESTS / "bare_table.log").read_text()
    text = text.replace("  1040.60  128.98  225.72", "      nan     nan     nan")
    got = by_size(read(write(tmp_path, "run.log", text)))
    assert got[134217728, 0]["status"] == "ok"
    bad = got[134217728, 1]
    assert (bad["status"], bad["time_us"], bad["busbw_gbps"]) == ("skipped", None, None)
    assert "no valid time" in bad["note"]


def test_sendrecv_rows_keep_their_name(tmp_path):
    text = (NCCL_TESTS / "bare_table.log").read_text().replace("all_reduce_perf", "sendrecv_perf")
    rows = read(write(tmp_path, "p2p.log", text))
    assert {(r["op"], r["redop"], r["root"]) for r in rows} == {("sendrecv", "sum", -1)}


def test_no_table():
    message = read_error(NCCL_TESTS / "no_table.log")
    assert "no nccl-tests result table" in message
    assert "#  size  count  type" in message


def test_a_table_header_without_results(tmp_path):
    text = (NCCL_TESTS / "bare_table.log").read_text()
    cut = text[:text.index("           8             2")]
    assert "no result lines" in read_error(write(tmp_path, "died.log", cut))


def test_an_unknown_collective(tmp_path):
    text = (NCCL_TESTS / "bare_table.log").read_text().replace("all_reduce_perf", "alltoallv_perf")
    message = read_error(write(tmp_path, "all_reduce.log", text))
    assert "'alltoallv_perf'" in message
    assert "all_reduce_perf" in message


@pytest.mark.parametrize(("content", "expected"), [
    (b"", "empty file"),
    (b"  \n\n", "empty file"),
    (b"\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00" + bytes(range(256)) * 4, "binary file"),
    (b'{"version":2,"args":["all_reduce_perf"],"results":[{"size":8,', "not valid JSON"),
    (b'{"version":2,"config":{}}', "without a 'results' list"),
    (b'{"args":["all_reduce_perf"],"results":[]}', "no results"),
    (b'{"args":["all_reduce_perf"],"results":[{"count":2}]}', "results[0]"),
])
def test_unreadable_content(tmp_path, content, expected):
    path = tmp_path / "all_reduce_perf.log"
    path.write_bytes(content)
    assert expected in read_error(path)


def test_a_directory_or_a_missing_file(tmp_path):
    assert "a directory" in read_error(tmp_path)
    assert "cannot be read" in read_error(tmp_path / "missing.log")
