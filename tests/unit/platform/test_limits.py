"""Resource bounds and the rest of bad input: a run sized past this machine is refused before
any process, file or directory exists, in one line with the numbers, and quickly (no torch).
The tests that start processes: test_limits_multiproc.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import assert_one_line_error, cli
from platform_helpers import TOO_BIG, _nothing_created

from distbench.core.options import OptionError
from distbench.core.sizes import format_size
from distbench.platform import limits

GiB = 2**30


# ---------------------------------------------------------------------------------------------
# The bound itself, on a machine given by the test

def test_cores_may_be_oversubscribed_up_to_the_stated_bound():
    limits.check_workers(4, ncores=2, memory=None)  # what the tests run
    limits.check_workers(limits.WORKERS_PER_CORE * 2, ncores=2, memory=None)
    with pytest.raises(OptionError) as e:
        limits.check_workers(limits.WORKERS_PER_CORE * 2 + 1, ncores=2, memory=None)
    text = str(e.value)
    assert text.startswith("--workers: 9 workers on 2 cores: at most 8 (4 per core)"), text
    assert "example: --workers 2" in text


def test_memory_bound_gives_the_numbers():
    memory = 2 * GiB
    # the launcher counts as one more worker
    fits = int(memory * limits.MEMORY_SHARE) // limits.WORKER_BYTES - 1
    limits.check_workers(fits, ncores=64, memory=memory)
    with pytest.raises(OptionError) as e:
        limits.check_workers(fits + 1, ncores=64, memory=memory)
    text = str(e.value)
    need = format_size((fits + 2) * limits.WORKER_BYTES)
    assert text.startswith(f"--workers: {fits + 1} workers and their launcher need about "
                           f"{need} of memory"), text
    assert f"this machine has {format_size(memory)} available" in text
    assert f"example: --workers {fits}" in text


def test_a_rank_too_large_for_the_machine_names_what_sized_it():
    """One rank's buffers past the memory: fewer workers would not help, the sizes would."""
    with pytest.raises(OptionError) as e:
        limits.check_workers(2, 64 * GiB, ("--sizes", "--sizes 8:128M:x2"), ncores=2,
                             memory=16 * GiB)
    text = str(e.value)
    assert text.startswith("--sizes: 2 workers and their launcher need about"), text
    assert "64 GiB for --sizes" in text and "example: --sizes 8:128M:x2" in text
    # a count that would fit with fewer workers names --workers, with one that fits
    with pytest.raises(OptionError) as e:
        limits.check_workers(4, 3 * GiB, ("--sizes", "--sizes 8:128M:x2"), ncores=2,
                             memory=16 * GiB)
    assert str(e.value).startswith("--workers: 4 workers and their launcher need"), e.value
    assert "example: --workers 3" in str(e.value)


def test_this_machine_is_read():
    assert limits.cores() >= 1
    memory = limits.available_memory()
    assert memory is None or 0 < memory < 2**50


def _machine(tmp_path: Path, available: int | None, limit: str | None, current: int = 0) -> dict:
    """available_memory's paths for a machine whose /proc/meminfo says `available` bytes are
    available (None: no such file) and whose cgroup v2 has memory.max `limit` ("max": none;
    None: no cgroup files) with `current` bytes in use."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    meminfo = tmp_path / "meminfo"
    if available is not None:
        meminfo.write_text(f"MemTotal:       {2 * available // 1024} kB\n"
                           f"MemFree:        {available // 2048} kB\n"
                           f"MemAvailable:   {available // 1024} kB\n")
    group = tmp_path / "cgroup" / "job"
    group.mkdir(parents=True)
    if limit is not None:
        (group / "memory.max").write_text(f"{limit}\n")
        (group / "memory.current").write_text(f"{current}\n")
    (tmp_path / "self-cgroup").write_text("0::/job\n")
    return {"meminfo": meminfo, "cgroup_root": tmp_path / "cgroup",
            "self_cgroup": tmp_path / "self-cgroup"}


def test_a_cgroup_limit_is_what_is_left_of_it(tmp_path):
    paths = _machine(tmp_path, None, str(4 * GiB), current=GiB)
    assert limits._cgroup_left(paths["cgroup_root"], paths["self_cgroup"]) == 3 * GiB
    (tmp_path / "cgroup" / "job" / "memory.max").write_text("max\n")
    assert limits._cgroup_left(paths["cgroup_root"], paths["self_cgroup"]) is None


def test_a_containers_limit_bounds_the_run_not_the_hosts_memory(tmp_path, monkeypatch):
    """A container on a large host: /proc/meminfo shows the host's 64 GiB available, the
    cgroup allows 2 GiB. The bound is 2 GiB; planning on 64 would let the kernel kill the run
    (or its neighbours) past the limit."""
    paths = _machine(tmp_path, 64 * GiB, str(3 * GiB), current=GiB)
    assert limits._meminfo_available(paths["meminfo"]) == 64 * GiB
    assert limits.available_memory(**paths) == 2 * GiB
    # check_workers reads the machine through available_memory: it refuses 3 GiB of work
    # naming the cgroup's 2 GiB, not the host's 64
    real = limits.available_memory
    monkeypatch.setattr(limits, "available_memory", lambda: real(**paths))
    per_rank = (3 * GiB - 3 * limits.WORKER_BYTES) // 2  # 2 workers and the launcher: 3 GiB
    with pytest.raises(OptionError) as e:
        limits.check_workers(2, per_rank, ("--sizes", "--sizes 8:128M:x2"), ncores=64)
    text = str(e.value)
    assert "need about 3 GiB of memory" in text, text
    assert f"this machine has {format_size(2 * GiB)} available" in text, text


def test_no_cgroup_limit_leaves_the_kernels_figure(tmp_path):
    assert limits.available_memory(**_machine(tmp_path, 64 * GiB, "max")) == 64 * GiB
    # a cgroup v1 machine, or none: no memory.max to read
    assert limits.available_memory(**_machine(tmp_path / "v1", 64 * GiB, None)) == 64 * GiB


def test_a_limit_read_without_meminfo_is_the_bound(tmp_path):
    assert limits.available_memory(**_machine(tmp_path, None, str(2 * GiB))) == 2 * GiB


def test_memory_nothing_can_read_is_none(tmp_path):
    """No bound is then applied (check_workers returns): better than refusing every run."""
    assert limits.available_memory(**_machine(tmp_path, None, None)) is None
    # files that are there but not readable as such: a directory, and nonsense
    paths = _machine(tmp_path / "odd", None, "lots")
    paths["meminfo"].mkdir()
    assert limits.available_memory(**paths) is None
    paths["meminfo"].rmdir()
    paths["meminfo"].write_text("MemAvailable: some kB\n")
    assert limits.available_memory(**paths) is None


# ---------------------------------------------------------------------------------------------
# On the command line: refused within a second, torch never loaded, nothing created


# Sized where the workers would start, by the real dispatch, in this process: a worker it
# started would fail the test (only multiproc tests may start one).
@pytest.mark.parametrize("args,option", TOO_BIG,
                         ids=["collective-sizes", "p2p-sizes", "tp-model", "pp-model", "dp-model"])
def test_work_sized_past_the_memory_is_refused_before_workers(tmp_path, monkeypatch, args,
                                                              option):
    # this machine's 24 GiB, wherever the suite runs: on a 128 GiB GPU host the dp case fits
    # and its workers started (seen on the first GPU, issue 34)
    monkeypatch.setattr(limits, "available_memory", lambda *a, **k: 24 << 30)
    out = tmp_path / "results"
    proc = cli(tmp_path, *args, "--backend", "gloo", "--out", str(out), dispatch=True)
    line = assert_one_line_error(proc, None, option, ours=True)
    assert "GiB" in line or "TiB" in line, line
    _nothing_created(tmp_path, out)


# ---------------------------------------------------------------------------------------------
# The rest of bad input

COMMANDS = ["collective", "p2p", "tp", "pp", "dp", "accept", "topo"]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("where", ["/proc/distbench-x", "/proc/distbench-x/deeper", "/proc",
                                   "/sys/distbench-x"])
def test_an_out_nobody_can_create_is_refused(in_process, tmp_path, command, where):
    """Not skipped as root: /proc and /sys refuse new directories whatever access() says."""
    line = assert_one_line_error(in_process(command, "--out", where), None, "--out", ours=True)
    assert f"cannot write to {where!r}" in line
    assert list(tmp_path.iterdir()) == []


def test_the_probe_leaves_nothing_behind(tmp_path):
    from distbench.core.options import check_writable_dir

    target = tmp_path / "results" / "deeper"
    assert check_writable_dir("--out", target, "--out results") == target
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", ["1e30", "1048577", "25,1e30"])
def test_a_bucket_torch_would_refuse_is_refused_first(in_process, tmp_path, value):
    out = tmp_path / "results"
    proc = in_process("dp", "--bucket-cap-mb", value, "--out", str(out))
    line = assert_one_line_error(proc, None, "--bucket-cap-mb", ours=True)
    assert "at most 1048576 MiB" in line
    _nothing_created(tmp_path, out)


@pytest.mark.parametrize("text", ["", "# only a comment\n", None], ids=["empty", "comments",
                                                                        "dev-null"])
@pytest.mark.parametrize("command", ["dp", "collective"])
def test_a_config_that_says_nothing_is_refused(in_process, tmp_path, text, command):
    cfg = Path("/dev/null") if text is None else tmp_path / "empty.toml"
    if text is not None:
        cfg.write_text(text)
    out = tmp_path / "results"
    proc = in_process(command, "--config", str(cfg), "--out", str(out))
    line = assert_one_line_error(proc, None, "--config", ours=True)
    assert f"{cfg} holds no options" in line
    assert not out.exists()
