"""distbench on a real one-node Slurm cluster (tests/slurm_cluster.py: slurmctld and slurmd on
this machine): ranks started by srun, and `watch --once --drain` draining the node, run under
srun and by slurmd as its HealthCheckProgram (docs/monitoring.md). What is asserted is what the
ranks wrote and what Slurm says of the node afterwards. Skips, saying why, where Debian's
slurm-wlm is not installed (.ci/run installs it) or not as root.

Each test with a cluster holds all 8 of the suite's process slots: the cluster is 3 processes,
srun 3 more with its shepherd and step daemon (slurm_cluster's docstring). So the drain under
srun runs one rank (8 with its scontrol), the check on two ranks, whose reason names the
straggler, runs as slurmd runs it (self-launched, no srun), and the baselines are made first,
by a test of their own that holds 3. A test that holds all 8 waits for every other test's slots
to free, blocking the queue meanwhile: two such tests share a cluster each (make test's time).
"""

from __future__ import annotations

import csv
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import json_schemas
import pytest
from helpers import distbench, free_port, nccl_rules_held, processes_naming
from slurm_cluster import missing, one_node_cluster

from distbench.kinds.watch.probe_baseline import read_baseline

WHY_NOT = missing()
pytestmark = [pytest.mark.multiproc, pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))]

# srun starts the venv's console script, as a site's job script would name distbench
_SCRIPT = Path(sys.executable).with_name("distbench")
DISTBENCH = [str(_SCRIPT)] if _SCRIPT.is_file() else [sys.executable, "-m", "distbench"]
PROBE = ("--sizes", "64K", "--iters", "10", "--timeout", "30")
# The slowed rank waits 100 ms before every op. The check fails a probe only past the baseline's
# own noise ((1 + noise) ** 1.5, noise.limit): gloo's 64 KiB all-reduce here swings 0.7 to 4 ms
# between a watch's cycles (a baseline noise of 290%, limit 7.7x), so 10 ms an op (7.4x) read
# ok, not fail; 50 ms read 34x; 100 ms leaves room for a baseline noise up to about 15x.
DELAY_S = 0.1
RUN_S = 120  # one srun or health check of distbench: 3 to 6 s here
HEALTH_INTERVAL_S = 2  # HealthCheckInterval: slurmctld asks slurmd to run the check this often
GONE_S = 15
# Slurm's name for the node in the drain tests, not this machine's hostname (slurmd -N): the
# drain must name the node as Slurm does (SLURMD_NODENAME, which slurmd hands srun's tasks and
# the HealthCheckProgram), not as the host calls itself, or scontrol refuses it
NODE = "dbnode1"


def _gone(where: Path) -> None:
    """No process still runs under `where` or names it: the ranks, a launcher, its workers."""
    deadline = time.monotonic() + GONE_S
    while processes_naming(where) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_naming(where) == [], f"processes outlived their run under {where}"


def _run_dir(out: Path) -> Path:
    dirs = [p for p in out.iterdir() if p.is_dir()]
    assert len(dirs) == 1, f"expected one run directory in {out}: {dirs}"
    return dirs[0]


def _meta(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def _cycles(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "watch.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """`baseline(world)`: a healthy short watch on `world` ranks, made once for the module as a
    node's baseline is made when it is known good: self-launched (no cluster needed), 12 cycles,
    so that its noise (the cycles' 90th percentile over the 10th) leaves the slow first out."""
    made: dict[int, Path] = {}

    def make(world: int) -> Path:
        if world not in made:
            out = tmp_path_factory.mktemp(f"baseline{world}")
            run = distbench(out, "watch", *PROBE, "--interval", "0.1", "--count", "12",
                            "--warm", "2", "--workers", str(world), timeout=RUN_S)
            _gone(out)
            cycles = _cycles(run.run_dir)
            # its verdict may be anything on a busy machine: a baseline is its measured cycles
            assert len(cycles) == 12, run.stderr
            assert all(p["status"] == "ok" and p["time_us"] for c in cycles
                       for p in c["probes"]), run.stderr
            made[world] = run.run_dir
        return made[world]

    return make


def _assert_drained(state: str, reason: str, run: str, straggler: int | None) -> None:
    """The node drained by distbench, the reason naming the failed probe, its state and the
    straggler where there is one."""
    assert state in ("drained", "draining"), f"node {state!r} ({reason})\n{run}"
    assert reason.startswith("distbench: "), f"reason {reason!r}\n{run}"
    assert "all_reduce 64 KiB" in reason, f"the reason names no probe: {reason!r}\n{run}"
    assert "fail" in reason, f"the reason names no state: {reason!r}\n{run}"
    if straggler is not None:
        assert f"rank {straggler}" in reason, f"the reason names no straggler: {reason!r}\n{run}"


def _assert_failed(run_dir: Path, said: str, world: int, stragglers: list[int]) -> None:
    """What a --once watch with a rank slowed wrote: one cycle, failed, naming `stragglers`."""
    meta = _meta(run_dir)
    assert meta["status"] == "below_expectation" and meta["exit_code"] == 4, said
    assert meta["world_size"] == world, said
    (cycle,) = _cycles(run_dir)
    assert cycle["verdict"] == "fail" and cycle["stragglers"] == stragglers, cycle
    (probe,) = cycle["probes"]
    assert (probe["op"], probe["size_bytes"], probe["state"]) == ("all_reduce", 65536, "fail")


@pytest.mark.procs(3)  # a watch's launcher and its (up to) 2 workers
def test_the_baselines_are_healthy_watches_read_as_baselines(baseline):
    """Both baselines the checks below read, made first and here: the tests that start a
    cluster hold all 8 process slots, and would hold them through these runs too."""
    for world in (1, 2):
        run_dir = baseline(world)
        assert _meta(run_dir)["world_size"] == world
        ((key, (time_us, noise)),) = read_baseline(run_dir).items()
        assert key == "all_reduce/65536/cluster" and time_us > 0 and noise is not None


@pytest.mark.procs(8)  # 3 of the cluster's; srun, its shepherd, its slurmstepd and 2 ranks
def test_srun_starts_the_ranks_of_a_collective_run_and_of_a_watch_a_sigterm_ends(tmp_path):
    """One cluster for both (a test holding all 8 slots waits for every other test's to
    free): a collective's ranks started by srun, then a watch's stopped as scancel stops it."""
    out = tmp_path / "out"
    out.mkdir()
    # the job's port (10000 + job id) would be the same in two clusters: a free one instead
    env = {"MASTER_PORT": str(free_port())}
    with one_node_cluster() as cluster:
        with nccl_rules_held("collective", env), json_schemas.held(out):
            run = cluster.srun(2, [*DISTBENCH, "collective", "--op", "all_reduce", *PROBE,
                                   "--out", str(out)], tmp_path, RUN_S, **env)
        said = f"srun exited {run.returncode}\n{run.stdout}\n{run.stderr}"
        assert run.returncode == 0, said
        _gone(tmp_path)
        _watch_stopped_as_scancel_stops_it(cluster, tmp_path)
    meta = _meta(_run_dir(out))
    assert (meta["status"], meta["exit_code"], meta["world_size"]) == ("ok", 0, 2), said
    assert meta["options"]["workers"] is None, said  # srun started the ranks, distbench none
    assert [r["rank"] for r in meta["ranks"]] == [0, 1], meta["ranks"]
    assert {r["host"] for r in meta["ranks"]} == {cluster.node}, meta["ranks"]
    assert len({r["pid"] for r in meta["ranks"]}) == 2, meta["ranks"]
    assert meta["env"]["MASTER_PORT"] == env["MASTER_PORT"], meta["env"]
    with open(_run_dir(out) / "collective.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["op"], r["size_bytes"], r["world_size"], r["nnodes"], r["iters"], r["wrong"],
             r["status"]) for r in rows] == [("all_reduce", "65536", "2", "1", "10", "0", "ok")]
    assert float(rows[0]["time_us"]) > 0 and float(rows[0]["busbw_gbps"]) > 0, rows


def _health_check(armed: Path, ran: Path, out: Path, log: Path, baseline: Path,
                  conf: str) -> str:
    """The HealthCheckProgram. slurmd runs it as root with only PWD and SLURMD_NODENAME in its
    environment (no PATH), at its start and every HealthCheckInterval, a new one beside one
    still running: so it does nothing until the test arms it, and then checks once (only the
    first run creates `ran`, under the shell's noclobber), with no process of its own but the
    check. SLURM_CONF: scontrol finds this cluster's (a site's is /etc/slurm/slurm.conf)."""
    argv = [*DISTBENCH, "watch", "--once", "--drain", "--workers", "2", "--baseline",
            str(baseline), *PROBE, "--out", str(out)]
    return f"""#!/bin/sh
[ -e {shlex.quote(str(armed))} ] || exit 0
set -C
printf '%s\\n' "$SLURMD_NODENAME" > {shlex.quote(str(ran))} 2>/dev/null || exit 0
export SLURM_CONF={shlex.quote(conf)} DISTBENCH_TEST_SLOW_RANK=1:{DELAY_S} \\
    CUDA_VISIBLE_DEVICES= NO_COLOR=1 PYTHONUNBUFFERED=1
exec {shlex.join(argv)} > {shlex.quote(str(log))} 2>&1
"""


def _finished(out: Path) -> Path | None:
    """The check's run directory once its run.json says how it ended and no process of it is
    left, else None."""
    dirs = [p for p in out.iterdir() if p.is_dir()]
    if len(dirs) != 1 or processes_naming(out):
        return None
    try:
        return dirs[0] if _meta(dirs[0])["status"] != "running" else None
    except (OSError, ValueError, KeyError):
        return None


# 3 of the cluster's; the check's launcher, its 2 workers and rank 0's scontrol; and the next
# interval's run of the program, which finds the check ran and exits
@pytest.mark.procs(8)
def test_watch_once_drains_the_node_under_srun_and_as_slurmds_health_check_program(
        tmp_path, baseline):
    script, armed, ran = tmp_path / "distbench-health", tmp_path / "armed", tmp_path / "ran"
    out, log = tmp_path / "health", tmp_path / "health.log"
    out.mkdir()
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o755)
    extra = (f"HealthCheckProgram={script}\nHealthCheckInterval={HEALTH_INTERVAL_S}\n"
             f"HealthCheckNodeState=IDLE\n")
    base = baseline(2)
    with one_node_cluster(extra, node=NODE) as cluster:
        _drain_under_srun(cluster, tmp_path, baseline(1))
        # renamed over the placeholder: slurmd may be running it right now
        real = tmp_path / "distbench-health.new"
        real.write_text(_health_check(armed, ran, out, log, base, str(cluster.conf)))
        real.chmod(0o755)
        real.replace(script)
        assert cluster.node_state() == ("idle", "none")
        armed.touch()
        deadline = time.monotonic() + RUN_S
        with json_schemas.held(out):
            while (run_dir := _finished(out)) is None:
                assert time.monotonic() < deadline, (
                    f"no health check ended within {RUN_S} s (ran: {ran.exists()})\n"
                    f"{log.read_text() if log.exists() else ''}\n{cluster.logs()}")
                time.sleep(0.2)
        said = log.read_text()
        assert ran.read_text().strip() == cluster.node, ran.read_text()  # SLURMD_NODENAME
        _assert_failed(run_dir, said, world=2, stragglers=[1])
        assert _meta(run_dir)["options"]["workers"] == 2, said
        state, reason = cluster.node_state()
        _assert_drained(state, reason, said, straggler=1)
        armed.unlink()
        cluster.resume()
        cluster.wait_state(lambda s: s == "idle", 30, "scontrol's resume")
        assert cluster.node_state() == ("idle", "none")
        _gone(tmp_path)


def _watch_stopped_as_scancel_stops_it(cluster, tmp_path: Path) -> None:
    """The operator's stop of a watch job: scancel has slurmstepd send SIGTERM to every task
    (SIGKILL follows KillWait later), sent here to the tasks directly, since scancel would be a
    ninth process (srun's own SIGTERM kills the step at once). Every rank leaves at the same
    cycle boundary, with the signal's code, and the job's output says so in one line, not a c10d
    stack trace per rank."""
    out, textfile = tmp_path / "watch", tmp_path / "distbench.prom"
    out.mkdir()
    env = {"MASTER_PORT": str(free_port())}
    proc = subprocess.Popen(
        ["srun", "-n2", "--overcommit", *DISTBENCH, "watch", *PROBE, "--interval", "2",
         "--textfile", str(textfile), "--out", str(out)], cwd=tmp_path,
        env=cluster.env(**env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + RUN_S
        while not (list(out.glob("*/watch.jsonl"))
                   and next(out.glob("*/watch.jsonl")).read_text().count("\n") >= 1):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        for rank in _meta(_run_dir(out))["ranks"]:
            os.kill(rank["pid"], signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            cluster.command("scancel", "--full", "--signal=KILL", "--state=RUNNING")
    _gone(tmp_path)
    said = f"srun exited {proc.returncode}\n{stdout}\n{stderr}"
    meta = _meta(_run_dir(out))
    assert (meta["status"], meta["exit_code"]) == ("terminated", 143), said
    assert meta["error"].startswith("stopped by SIGTERM after "), meta["error"]
    ours = [x for x in stderr.splitlines() if x.startswith("distbench: rank")]
    assert ours == [f"distbench: rank 0: error: {meta['error']}"], said
    assert not any(s in stderr for s in ("Traceback", "frame #", "c10d", "[W ", "[E ")), said
    assert "distbench_ended{Hostname=" in textfile.read_text() and \
        "distbench_up{" in textfile.read_text(), textfile.read_text()
    assert 'distbench_ended{Hostname="' + cluster.node + '"} 1.0' in textfile.read_text()


def _drain_under_srun(cluster, tmp_path: Path, base: Path) -> None:
    """`watch --once --drain` under srun, its one rank slowed (with 3 of the cluster's, srun, its
    shepherd, its slurmstepd, the rank and the rank's scontrol are 8 processes): the node
    drained with the probe in its reason, then resumed. While the job runs the node is
    allocated, so slurmd runs no IDLE health check beside it."""
    out = tmp_path / "srun"
    out.mkdir()
    assert cluster.node_state() == ("idle", "none")
    with json_schemas.held(out):
        run = cluster.srun(1, [*DISTBENCH, "watch", "--once", "--drain", "--baseline",
                               str(base), *PROBE, "--out", str(out)], tmp_path, RUN_S,
                           DISTBENCH_TEST_SLOW_RANK=f"0:{DELAY_S}",
                           # the store's address: distbench's default under srun is the
                           # step's first node by its Slurm name, no host name here
                           MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    said = f"srun exited {run.returncode}\n{run.stdout}\n{run.stderr}"
    _gone(tmp_path)
    assert run.returncode == 4, said  # the rank's own: fail
    _assert_failed(_run_dir(out), said, world=1, stragglers=[])
    # the rank printed the line it ran
    assert f"scontrol update NodeName={cluster.node} State=drain" in run.stdout, said
    state, reason = cluster.node_state()
    _assert_drained(state, reason, said, straggler=None)
    cluster.resume()
    cluster.wait_state(lambda s: s == "idle", 30, "scontrol's resume")
    assert cluster.node_state() == ("idle", "none")
