"""`distbench topo`: standalone it snapshots this machine without starting workers; the summary
on stdout digests the snapshot; writer.write_topology stores topo.txt for people, topo.json for
tools. The tests that start processes: test_topo_command_multiproc.py."""

from __future__ import annotations

import json

from paths import FIXTURES

from distbench.platform.topo_render import summary_lines
from distbench.results import writer
from distbench.run.console import Console

NV18_TEXT = (FIXTURES / "topo_dgx_h100_nv18.txt").read_text()
PCIE_TEXT = (FIXTURES / "topo_pcie_4gpu.txt").read_text()

GIB = 2**30
FAKE_GPUS = [
    {"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-aaaa",
     "memory_total_bytes": 80 * GIB, "pcie_gen_current": 5, "pcie_gen_max": 5,
     "pcie_width_current": 16, "pcie_width_max": 16, "nvlinks_up": 18},
    {"index": 1, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-bbbb",
     "memory_total_bytes": 80 * GIB, "pcie_gen_current": 4, "pcie_gen_max": 5,
     "pcie_width_current": 8, "pcie_width_max": 16, "nvlinks_up": 17},
]
CPU = {"model": "Fake CPU 9000", "logical_cores": 224,
       "numa_nodes": [{"node": 0, "cpus": "0-55,112-167"}, {"node": 1, "cpus": "56-111,168-223"}]}


def _snap(host: str, topo_text: str | None, gpus: list[dict] | None = None, **extra) -> dict:
    snap = {"host": host, "boot_id": f"boot-{host}", "nvidia_smi_topo": topo_text,
            "gpus": gpus or [], "driver_version": "550.54.15" if gpus else None,
            "cuda_driver_version": "12.4" if gpus else None, "cpu": CPU}
    if topo_text is None:
        snap["nvidia_smi_error"] = "nvidia-smi not found on PATH"
    snap.update(extra)
    return snap


# --------------------------------------------------------------------------------------------
# standalone `distbench topo`
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# summary_lines, printed by the console
# --------------------------------------------------------------------------------------------

def _summary(capsys, snapshots: list[dict]) -> str:
    Console(True).lines(summary_lines(snapshots))
    captured = capsys.readouterr()
    assert captured.err == ""
    assert captured.out.splitlines() == summary_lines(snapshots)
    return captured.out


def test_summary_nvlink_node(capsys):
    out = _summary(capsys, [_snap("dgx1", NV18_TEXT, FAKE_GPUS)])
    lines = out.splitlines()
    assert lines[0] == "node dgx1"
    assert "GPU-GPU links (ordered pairs): 56 x NV18" in out
    # one line per GPU with its name, memory, PCIe and NVLinks
    gpu_lines = [line for line in lines if line.strip().startswith("GPU") and "H100" in line]
    assert len(gpu_lines) == 2
    assert gpu_lines[0].strip().startswith("GPU0  NVIDIA H100 80GB HBM3  80 GiB")
    assert "PCIe gen 5/5 x16/16" in gpu_lines[0] and "NVLinks up 18" in gpu_lines[0]
    assert "PCIe gen 4/5 x8/16" in gpu_lines[1] and "NVLinks up 17" in gpu_lines[1]
    assert "driver 550.54.15, CUDA 12.4" in out
    assert "CPU-only" not in out
    assert "CPU Fake CPU 9000, 224 logical cores" in out
    assert "NUMA node0: cpus 0-55,112-167" in out
    assert "NUMA node1: cpus 56-111,168-223" in out


def test_summary_pcie_node(capsys):
    out = _summary(capsys, [_snap("pcie1", PCIE_TEXT, FAKE_GPUS)])
    (links_line,) = [line for line in out.splitlines() if "GPU-GPU links" in line]
    # 4 GPUs: 12 ordered pairs; the NIC's NODE cells are not GPU links
    counts = links_line.split(":", 1)[1].split(",")
    assert sorted(c.strip() for c in counts) == ["2 x PIX", "2 x PXB", "8 x SYS"], links_line
    assert "NV" not in links_line
    assert "NODE" not in links_line


def test_summary_cpu_only_node(capsys):
    out = _summary(capsys, [_snap("laptop", None)])
    assert out.splitlines()[0] == "node laptop"
    assert "no nvidia-smi (nvidia-smi not found on PATH): CPU-only node" in out
    assert "GPU-GPU links" not in out
    assert "driver" not in out
    assert "GPU0" not in out


def test_summary_gpus_without_nvidia_smi_are_not_called_cpu_only(capsys):
    # NVML found GPUs but nvidia-smi is missing or broken: the node is not CPU-only.
    out = _summary(capsys, [_snap("odd", None, FAKE_GPUS)])
    assert "GPU0  NVIDIA H100" in out
    assert "no nvidia-smi (nvidia-smi not found on PATH): GPUs from NVML above" in out
    assert "CPU-only" not in out


def test_summary_one_block_per_node(capsys):
    out = _summary(capsys, [_snap("n1", NV18_TEXT, FAKE_GPUS), _snap("n2", PCIE_TEXT, FAKE_GPUS)])
    nodes = [line for line in out.splitlines() if line.startswith("node ")]
    assert nodes == ["node n1", "node n2"]
    assert out.index("56 x NV18") < out.index("node n2") < out.index("8 x SYS")


def test_summary_silent_when_console_disabled(capsys):
    Console(False).lines(summary_lines([_snap("n1", NV18_TEXT, FAKE_GPUS)]))
    assert capsys.readouterr().out == ""


# --------------------------------------------------------------------------------------------
# writer.write_topology
# --------------------------------------------------------------------------------------------

def test_write_topology(tmp_path):
    snaps = [_snap("dgx1", NV18_TEXT, FAKE_GPUS), _snap("cpu1", None)]
    writer.write_topology(tmp_path, snaps)
    assert {p.name for p in tmp_path.iterdir()} == {"topo.txt", "topo.json"}

    text = (tmp_path / "topo.txt").read_text()
    assert "==== node dgx1 (boot boot-dgx" in text
    assert "==== node cpu1 (boot boot-cpu" in text
    assert "NV18" in text  # the matrix verbatim
    assert text.index("node dgx1") < text.index("node cpu1")

    data = json.loads((tmp_path / "topo.json").read_text())
    assert data["schema_version"] == 1
    nv, cpu = data["nodes"]
    assert nv["host"] == "dgx1" and cpu["host"] == "cpu1"
    assert nv["gpu_links"]["devices"] == [f"GPU{i}" for i in range(8)]
    assert len(nv["gpu_links"]["links"]) == 56
    assert set(nv["gpu_links"]["links"].values()) == {"NV18"}
    assert nv["gpus"] == FAKE_GPUS
    assert nv["nvidia_smi_topo"] == NV18_TEXT
    assert cpu["gpu_links"] == {"devices": [], "links": {}}
    assert cpu["nvidia_smi_error"] == "nvidia-smi not found on PATH"
    assert not list(tmp_path.glob("*.tmp"))  # written atomically, nothing left over


def test_write_topology_pcie(tmp_path):
    writer.write_topology(tmp_path, [_snap("pcie1", PCIE_TEXT, FAKE_GPUS[:1])])
    (node,) = json.loads((tmp_path / "topo.json").read_text())["nodes"]
    links = node["gpu_links"]["links"]
    assert len(links) == 12
    assert links["GPU0-GPU1"] == "PIX" and links["GPU3-GPU2"] == "PXB"
    assert links["GPU1-GPU3"] == "SYS"
