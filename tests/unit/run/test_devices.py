"""Which GPU each rank takes, and how the physical GPU is named: without a GPU, from the
counts a launcher and CUDA_VISIBLE_DEVICES give and a faked device-properties record."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from distbench.results.links import Link, Outlier, culprits
from distbench.run.peers import start_verdict
from distbench.run.runtime import RunFailure, gpu_identity, pick_gpu


@pytest.mark.parametrize("local_rank,local_world,count,want", [
    (0, 8, 8, 0), (7, 8, 8, 7),  # one GPU per rank
    (1, 2, 8, 1),  # fewer ranks than GPUs
    (3, 8, 1, 0),  # Slurm's per-task binding: each task sees its own one GPU
])
def test_each_rank_takes_its_own_gpu(local_rank, local_world, count, want):
    assert pick_gpu(local_rank, local_world, count, "0,1") == want


@pytest.mark.parametrize("visible,shown", [("0,1", "CUDA_VISIBLE_DEVICES=0,1"),
                                           (None, "CUDA_VISIBLE_DEVICES unset")])
def test_fewer_gpus_than_ranks_is_refused_with_the_counts(visible, shown):
    """local_rank % count would put ranks 2 and 0 on one GPU and NCCL would fail later."""
    with pytest.raises(RunFailure) as e:
        pick_gpu(2, 4, 2, visible)
    assert e.value.exit_code == 2 and e.value.status == "bad_input"
    said = str(e.value)
    # docs/gpu-checklist.md quotes these first words; the advice after them only has to hold
    assert said.startswith(f"local rank 2 has no GPU of its own: 2 GPUs visible ({shown}) for "
                           "4 ranks on this node; "), said
    assert "at most 2 ranks per node" in said and "\n" not in said, said


def _post(rank: int, uuid: str | None, bus: str | None = None) -> dict:
    return {"rank": rank, "host": "gpu3", "local_rank": rank, "options": "same",
            "identity": {}, "gpu_uuid": uuid, "gpu_bus_id": bus}


def test_two_ranks_on_one_gpu_are_refused_at_startup():
    """Per-task binding gone wrong: every task sees one GPU, the same one."""
    everyone = [_post(0, "GPU-a", "00000000:18:00.0"), _post(1, "GPU-b"),
                _post(2, "GPU-a", "00000000:18:00.0")]
    said = start_verdict(everyone)
    assert said.startswith("ranks 0 and 2 (gpu3:0 and gpu3:2) share one GPU"), said
    assert "GPU-a (bus 00000000:18:00.0)" in said and "CUDA_VISIBLE_DEVICES" in said, said
    assert "\n" not in said, said
    assert start_verdict([_post(0, "GPU-a"), _post(1, "GPU-b")]) is None
    assert start_verdict([_post(0, None), _post(1, None)]) is None  # CPU ranks


def test_the_gpu_is_named_by_uuid_and_bus_id(monkeypatch):
    props = SimpleNamespace(uuid="3f1c-77", pci_domain_id=0, pci_bus_id=0x1a, pci_device_id=0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    assert gpu_identity(torch.device("cuda", 0)) == {"gpu_uuid": "GPU-3f1c-77",
                                                     "gpu_bus_id": "00000000:1a:00.0"}
    assert gpu_identity(torch.device("cpu")) == {"gpu_uuid": None, "gpu_bus_id": None}
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: SimpleNamespace(uuid=None))  # an older torch
    assert gpu_identity(torch.device("cuda", 0)) == {"gpu_uuid": None, "gpu_bus_id": None}


def test_a_culprit_gpu_is_named_by_its_bus_id():
    slow = [Outlier(Link(1, dst, "gpu3:1", f"gpu3:{dst}", "intra", "uni", 4096, 1.0), 10.0)
            for dst in (0, 2)]
    (named,) = culprits(slow, {1: "00000000:1a:00.0"})
    assert named.startswith("rank 1 (gpu3:1") and "GPU 00000000:1a:00.0" in named, named
    assert named.endswith(": in 2 of 2 slow links"), named
    # without a bus id, the culprit line docs/commands/p2p.md quotes
    assert culprits(slow) == ["rank 1 (gpu3:1): in 2 of 2 slow links"]


def test_every_rank_is_placed_on_its_gpu_in_topo_json(tmp_path):
    import json

    from distbench.results import writer

    ranks = [{"rank": 0, "host": "gpu3", "node": 0, "local_rank": 0, "device": "H100",
              "pid": 7, "gpu_uuid": "GPU-a", "gpu_bus_id": "00000000:18:00.0"}]
    writer.write_topology(tmp_path, [{"host": "gpu3", "gpus": []}], ranks)
    placed = json.loads((tmp_path / "topo.json").read_text())["ranks"]
    assert placed == [{"rank": 0, "host": "gpu3", "node": 0, "local_rank": 0,
                       "gpu_uuid": "GPU-a", "gpu_bus_id": "00000000:18:00.0"}]
