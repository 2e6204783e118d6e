"""The profile every rank of `distbench accept` runs (profile_choice.agree and pick_for_nodes):
rank 0 picks it from what the ranks see (their torch devices, how many per node), with NVML's
snapshot as extra evidence only, and sends every rank the profile's text, not its path. Each
judgement is tried both ways: the planted fault is caught, a healthy layout stays quiet."""

from __future__ import annotations

from dataclasses import replace

import pytest
from fake_session import fake_runtime

from distbench.core.exitcodes import EXIT_BAD_INPUT, EXIT_BELOW, EXIT_INCONCLUSIVE, EXIT_OK
from distbench.kinds.accept import profile_choice, profile_files
from distbench.kinds.accept.verdicts import Result, judge
from distbench.run.runtime import RunFailure, Runtime

H100 = "NVIDIA H100 80GB HBM3"
NVML_GONE = "nvmlInit failed: NVMLError_LibraryNotFound: NVML Shared Library Not Found"
# what a healthy 8 x H100 node with NVLS reaches, check by check (docs/accept.md's figures)
HEALTHY = {"node all_reduce busbw": 475.0, "node all_gather busbw": 368.0,
           "node reduce_scatter busbw": 368.0, "cluster all_reduce busbw": 362.0}


def snap(host: str, gpus: int = 8, gpu: str = H100, nvml_error: str | None = None,
         nvls: bool | None = True) -> dict:
    """A node's topo snapshot: what NVML lists (nothing when nvml_error), and NVLS."""
    out = {"host": host, "boot_id": f"boot-{host}", "nvls": nvls,
           "nvls_why": "CUDA multicast on every GPU" if nvls else "unknown: test",
           "gpus": [] if nvml_error else [{"index": i, "name": gpu} for i in range(gpus)]}
    if nvml_error:
        out["nvml_error"] = nvml_error
    return out


def ranks(*per_node: int, device: str = H100) -> list[dict]:
    """rt.ranks: per_node[i] ranks on node i (host n<i>), each on a device torch names so."""
    out: list[dict] = []
    for node, count in enumerate(per_node):
        out += [{"rank": len(out) + k, "host": f"n{node}", "node": node, "local_rank": k,
                 "device": device} for k in range(count)]
    return out


def runtime(snapshots: list[dict], rank_list: list[dict], backend: str = "nccl",
            rank: int = 0) -> Runtime:
    return fake_runtime(rank, len(rank_list), backend=backend, ranks=rank_list,
                        snapshots=snapshots if rank == 0 else [])


@pytest.fixture
def wire(monkeypatch):
    """broadcast_object_list among ranks played in one process: rank 0's call sends, every
    later call (another rank) receives what it sent."""
    sent: list = []

    def broadcast(objs, src=0):
        assert src == 0
        if sent:
            objs[:] = sent[0]
        else:
            sent.append(list(objs))

    monkeypatch.setattr(profile_choice.dist, "broadcast_object_list", broadcast)
    return sent


def _judge_absolute(profile, per_node: list[int], values=HEALTHY):
    """The profile's absolute checks measured at `values` on each node (per_node[i] ranks)
    and on the cluster, judged."""
    prof = replace(profile, checks=tuple(c for c in profile.checks if c.vs == "absolute"))
    names = [f"n{i}" for i in range(len(per_node))]
    results = []
    for c in prof.checks:
        if c.scope == "node":
            results += [Result(c, names[i], (i,), n, busbw_gbps=values[c.name], wrong=0)
                        for i, n in enumerate(per_node)]
        else:
            results.append(Result(c, "cluster", tuple(range(len(names))), sum(per_node),
                                  busbw_gbps=values[c.name], wrong=0))
    return judge(results, prof, names)


# ---------------------------------------------------------------------------------------------
# What the ranks see picks the profile; NVML is extra evidence only

def test_nvml_gone_under_nccl_the_ranks_gpus_pick_the_profile(wire):
    """A driver mismatch or a container without libnvidia-ml: NVML lists nothing, yet every
    rank runs on an H100. Today's pick read that as no GPU and chose cpu-gloo."""
    snaps = [snap("n0", nvml_error=NVML_GONE), snap("n1", nvml_error=NVML_GONE)]
    profile, why = profile_choice.agree(runtime(snaps, ranks(8, 8)), "auto")
    assert profile.name == "h100-sxm-8"
    assert why.startswith(f"every node has 8 x {H100} (counted from its ranks; NVML: "
                          f"{NVML_GONE}): h100-sxm-8")
    assert [n.gpus for n in profile.nodes] == [((H100, 8),)] * 2


@pytest.mark.parametrize("device", ["NVIDIA L4", "NVIDIA H100 PCIe"])
def test_nccl_never_gets_cpu_gloo(device):
    """GPUs no profile matches, NVML gone: generic-gpu, saying why; never cpu-gloo's
    millisecond floors for a GPU cluster."""
    snaps = [snap("n0", nvml_error=NVML_GONE), snap("n1", nvml_error=NVML_GONE)]
    profile, why = profile_choice.pick_for_nodes(snaps, ranks(4, 4, device=device), "nccl")
    assert profile.name == "generic-gpu"
    assert why.startswith(f"every node has 4 x {device} (counted from its ranks; NVML: ")
    assert "which no profile matches: generic-gpu" in why


def test_nvml_and_the_ranks_agreeing_pick_as_before():
    """The healthy case stays as it was: every node's 8 H100s, named the same both ways."""
    profile, why = profile_choice.pick_for_nodes([snap("n0"), snap("n1")], ranks(8, 8), "nccl")
    assert (profile.name, why) == ("h100-sxm-8", f"every node has 8 x {H100}: h100-sxm-8")


def test_cpu_ranks_get_cpu_gloo_whatever_nvml_lists():
    """Under gloo the ranks measure on the CPU: cpu-gloo, even on a GPU node (the H100
    floors would fail a healthy node measured on the CPU), saying what NVML sees."""
    gpu_nodes = [snap("n0"), snap("n1")]
    profile, why = profile_choice.pick_for_nodes(gpu_nodes, ranks(2, 2, device="cpu"), "gloo")
    assert profile.name == "cpu-gloo"
    assert why == (f"the ranks run on the CPU (backend gloo; NVML sees 8 x {H100} on n0, n1; "
                   "--backend nccl measures them): cpu-gloo")
    cpu_nodes = [snap("n0", nvml_error=NVML_GONE), snap("n1", nvml_error=NVML_GONE)]
    profile, why = profile_choice.pick_for_nodes(cpu_nodes, ranks(2, 2, device="cpu"), "gloo")
    assert (profile.name, why) == ("cpu-gloo", f"no node has a GPU (NVML: {NVML_GONE}): "
                                   "cpu-gloo")


def test_nodes_sharing_a_host_are_told_apart():
    """Several launcher agents on one host (the tests' layout): one snapshot, several nodes."""
    rank_list = [dict(r, host="vm") for r in ranks(2, 2, device="cpu")]
    profile, _ = profile_choice.pick_for_nodes([snap("vm", nvml_error=NVML_GONE)], rank_list,
                                               "gloo")
    assert [n.name for n in profile.nodes] == ["vm#0", "vm#1"]


# ---------------------------------------------------------------------------------------------
# Every rank runs rank 0's profile text

def test_the_text_travels_not_the_path(tmp_path, wire):
    """Rank 0's file need not exist on the other nodes: they parse the text it sent."""
    mine = tmp_path / "mine.toml"
    mine.write_text(profile_files.resolve("h100-sxm-8").path.read_text().replace(
        'name = "h100-sxm-8"', 'name = "mine"'))
    snaps = [snap("n0"), snap("n1")]
    first, why = profile_choice.agree(runtime(snaps, ranks(8, 8)), str(mine))
    mine.unlink()  # another node: no such file there
    other, other_why = profile_choice.agree(runtime([], ranks(8, 8), rank=9), str(mine))
    assert first.name == other.name == "mine" and why == other_why == "named on the command line"
    assert other.checks == first.checks and other.nodes == first.nodes
    assert [n.nvls for n in other.nodes] == [True, True]  # rank 0's snapshots, sent along


def test_a_profile_rank_0_cannot_read_fails_every_rank_alike(tmp_path, wire):
    """No rank waits in a broadcast rank 0 never makes: each raises the same one line."""
    gone = str(tmp_path / "gone.toml")
    with pytest.raises(RunFailure) as first:
        profile_choice.agree(runtime([snap("n0")], ranks(2)), gone)
    with pytest.raises(RunFailure) as other:
        profile_choice.agree(runtime([], ranks(2), rank=1), gone)
    assert str(first.value) == str(other.value) and "no such file" in str(first.value)
    assert first.value.exit_code == other.value.exit_code == EXIT_BAD_INPUT


# ---------------------------------------------------------------------------------------------
# Absolute floors only where the ranks per node are the GPUs the profile is for

def test_four_of_eight_gpus_are_not_judged_by_eight_gpu_floors(wire):
    """--nproc-per-node 4 (or CUDA_VISIBLE_DEVICES=0,1,2,3) on 8-GPU nodes: busbw's factor is 1.5
    at 4 ranks and 1.75 at 8, so a healthy node measured at 4 fails the 8-GPU floors. The
    rows are skipped, saying why, and a run judged on nothing of a scope is no pass."""
    profile, _ = profile_choice.agree(runtime([snap("n0"), snap("n1")], ranks(4, 4)), "auto")
    assert profile.name == "h100-sxm-8"  # NVML counts the 8 GPUs the ranks do not use
    judged = _judge_absolute(profile, [4, 4])
    assert {v.verdict for v in judged.verdicts} == {"SKIP"}
    assert judged.verdicts[0].why == ("not judged: h100-sxm-8's floor is for 8 GPUs per node; "
                                      "n0 has 4 ranks")
    cluster = next(v for v in judged.verdicts if v.result.target == "cluster")
    assert cluster.why == ("not judged: h100-sxm-8's floor is for 8 GPUs per node; the "
                           "cluster has 8 ranks on 2 nodes")
    assert judged.culprits == []  # the GPUs are there: no node is short of one
    assert judged.outcome(strict=False)[1] == EXIT_INCONCLUSIVE
    # a slow 4-rank node is not judged by the 8-GPU floor either way
    slow = _judge_absolute(profile, [4, 4], {k: v / 3 for k, v in HEALTHY.items()})
    assert {v.verdict for v in slow.verdicts} == {"SKIP"}


def test_eight_ranks_on_eight_gpus_are_judged():
    profile, _ = profile_choice.pick_for_nodes([snap("n0"), snap("n1")], ranks(8, 8), "nccl")
    judged = _judge_absolute(profile, [8, 8])
    assert {v.verdict for v in judged.verdicts} == {"PASS"}
    assert judged.outcome(strict=False)[1] == EXIT_OK
    slow = _judge_absolute(profile, [8, 8], {k: v / 3 for k, v in HEALTHY.items()})
    assert {v.verdict for v in slow.verdicts} == {"FAIL"}


# ---------------------------------------------------------------------------------------------
# A node that lost a GPU is named

def test_a_node_that_lost_a_gpu_is_named_and_fails_the_run():
    """8 + 8 + 7: NVML lists 7 GPUs on n2. Today auto fell back to generic-gpu, whose relative
    checks cannot see it (busbw hardly moves from 8 GPUs to 7), and nothing named n2."""
    snaps = [snap("n0"), snap("n1"), snap("n2", gpus=7)]
    profile, why = profile_choice.pick_for_nodes(snaps, ranks(8, 8, 7), "nccl")
    assert profile.name == "h100-sxm-8"
    assert why == f"the nodes have 8 x {H100}, but n2 has 7: h100-sxm-8"
    judged = _judge_absolute(profile, [8, 8, 7])
    assert judged.culprits[0] == (
        f"node n2 has 7 x {H100}, where h100-sxm-8 is for 8 per node: a GPU lost, or not passed "
        "through to it (a container, a VM)")
    status, code, line = judged.outcome(strict=False)
    assert code == EXIT_BELOW and "node n2 has 7" in line
    assert {v.verdict for v in judged.verdicts if v.result.target == "n2"} == {"SKIP"}
    assert {v.verdict for v in judged.verdicts if v.result.target in ("n0", "n1")} == {"PASS"}


def test_eight_gpus_everywhere_names_no_one():
    snaps = [snap("n0"), snap("n1"), snap("n2")]
    profile, _ = profile_choice.pick_for_nodes(snaps, ranks(8, 8, 8), "nccl")
    judged = _judge_absolute(profile, [8, 8, 8])
    assert judged.culprits == [] and judged.notes == []
    assert judged.outcome(strict=False)[1] == EXIT_OK


def test_with_nvml_gone_a_node_short_of_ranks_is_named_not_failed():
    """NVML unreadable: 7 ranks on n2 may be a launch choice as well as a lost GPU. It is
    named in the notes and its absolute rows are not judged, nor the cluster's (23 ranks on 3
    nodes): inconclusive, not a failure."""
    snaps = [snap(f"n{i}", nvml_error=NVML_GONE) for i in range(3)]
    profile, _ = profile_choice.pick_for_nodes(snaps, ranks(8, 8, 7), "nccl")
    judged = _judge_absolute(profile, [8, 8, 7])
    assert judged.culprits == []
    assert judged.notes[0] == (f"node n2 has 7 x {H100} where its peers have 8 (counted from "
                               "its ranks: NVML cannot tell a lost GPU from fewer ranks)")
    assert judged.outcome(strict=False)[1] == EXIT_INCONCLUSIVE
    cluster = next(v for v in judged.verdicts if v.result.target == "cluster")
    assert cluster.verdict == "SKIP" and cluster.why.endswith("the cluster has 23 ranks on 3 nodes")
