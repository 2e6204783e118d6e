import json
import os
import subprocess
import sys

import pytest
from fake_nvml import NVMLError_NotSupported, _fake_pynvml, _FakeNVMLError, _no_nvidia_smi
from paths import FIXTURES

from distbench.platform import topo_parse, topo_probe, topo_render

NV18_TEXT = (FIXTURES / "topo_dgx_h100_nv18.txt").read_text()
PCIE_TEXT = (FIXTURES / "topo_pcie_4gpu.txt").read_text()


# ---------------------------------------------------------------------------
# parse_topo_matrix


def test_parse_nvlink_fixture():
    parsed = topo_parse.parse_topo_matrix(NV18_TEXT)
    assert parsed["devices"] == [f"GPU{i}" for i in range(8)]
    assert len(parsed["links"]) == 56
    assert set(parsed["links"].values()) == {"NV18"}
    assert "GPU0-GPU0" not in parsed["links"]
    assert not any("NIC" in key for key in parsed["links"])
    json.dumps(parsed)


def test_parse_pcie_fixture():
    parsed = topo_parse.parse_topo_matrix(PCIE_TEXT)
    assert parsed["devices"] == ["GPU0", "GPU1", "GPU2", "GPU3"]
    expected_pairs = {
        ("GPU0", "GPU1"): "PIX",
        ("GPU2", "GPU3"): "PXB",
        ("GPU0", "GPU2"): "SYS",
        ("GPU0", "GPU3"): "SYS",
        ("GPU1", "GPU2"): "SYS",
        ("GPU1", "GPU3"): "SYS",
    }
    expected = {}
    for (a, b), kind in expected_pairs.items():
        expected[f"{a}-{b}"] = kind
        expected[f"{b}-{a}"] = kind
    assert parsed["links"] == expected
    # NIC0's NODE entries must not leak into the GPU matrix.
    assert "NODE" not in parsed["links"].values()


def test_parse_space_padded_and_ansi_header():
    # Some drivers underline the header with ANSI codes; copies often turn tabs into spaces.
    text = (
        "        \x1b[4mGPU0    GPU1    mlx5_0  CPU Affinity    NUMA Affinity\x1b[0m\n"
        "GPU0     X      NV4     SYS     0-31    0\n"
        "GPU1    NV4      X      SYS     0-31    0\n"
        "mlx5_0  SYS     SYS      X\n"
        "\n"
        "Legend:\n\n  X    = Self\n  NV#  = Connection traversing a bonded set of # NVLinks\n"
    )
    parsed = topo_parse.parse_topo_matrix(text)
    assert parsed == {
        "devices": ["GPU0", "GPU1"],
        "links": {"GPU0-GPU1": "NV4", "GPU1-GPU0": "NV4"},
    }


@pytest.mark.parametrize("text", ["", "garbage\nmore garbage\n", "No devices were found\n"])
def test_parse_garbage_is_empty(text):
    assert topo_parse.parse_topo_matrix(text) == {"devices": [], "links": {}}


# ---------------------------------------------------------------------------
# render_text


def _cpu_only_snapshot():
    return {
        "host": "cpu-node-1",
        "boot_id": "0123456789abcdef",
        "nvidia_smi_topo": None,
        "nvidia_smi_error": "nvidia-smi not found on PATH",
        "gpus": [],
        "driver_version": None,
        "cuda_driver_version": None,
        "nvml_error": "nvmlInit failed: NVMLError_LibraryNotFound: NVML Shared Library Not Found",
        "cpu": {
            "model": "AMD EPYC 9654 96-Core Processor",
            "logical_cores": 384,
            "numa_nodes": [{"node": 0, "cpus": "0-95,192-287"}, {"node": 1, "cpus": "96-191"}],
        },
    }


def _gpu_snapshot():
    return {
        "host": "dgx-07",
        "boot_id": "fedcba9876543210",
        "nvidia_smi_topo": NV18_TEXT,
        "gpus": [
            {
                "index": 0,
                "name": "NVIDIA H100 80GB HBM3",
                "uuid": "GPU-11111111-2222-3333-4444-555555555555",
                "memory_total_bytes": 80 * 2**30,
                "pcie_gen_current": 5,
                "pcie_gen_max": 5,
                "pcie_width_current": 16,
                "pcie_width_max": 16,
                "nvlinks_up": 18,
            }
        ],
        "driver_version": "550.54.15",
        "cuda_driver_version": "12.4",
        "cpu": {
            "model": "Intel(R) Xeon(R) Platinum 8480C",
            "logical_cores": 224,
            "numa_nodes": [],
        },
    }


def test_render_cpu_only():
    text = topo_render.render_text([_cpu_only_snapshot()])
    lines = text.splitlines()
    # each node opens on a header naming it and the start of its boot id
    assert lines[0].startswith("==== node cpu-node-1 ") and "boot 01234567" in lines[0]
    (smi,) = [line for line in lines if line.startswith("nvidia-smi not available")]
    assert "nvidia-smi not found on PATH" in smi and "CPU-only node" in smi
    assert "AMD EPYC 9654 96-Core Processor" in text
    assert "384" in text
    assert "NUMA node0: cpus 0-95,192-287" in lines
    assert "NUMA node1: cpus 96-191" in lines


def test_render_gpu_snapshot_contains_matrix_verbatim():
    text = topo_render.render_text([_gpu_snapshot()])
    head = text.splitlines()[0]
    assert head.startswith("==== node dgx-07 ") and "boot fedcba98" in head
    assert NV18_TEXT in text
    assert "not available" not in text.split("Legend")[0]
    gpu_line = next(line for line in text.splitlines() if line.startswith("GPU0: "))
    assert "NVIDIA H100 80GB HBM3" in gpu_line
    assert "80.0 GiB" in gpu_line
    assert "gen5 x16" in gpu_line
    assert "NVLinks up 18" in gpu_line
    assert "550.54.15" in text


def test_render_multiple_nodes_and_sparse_snapshot():
    text = topo_render.render_text([_gpu_snapshot(), _cpu_only_snapshot(), {}])
    assert text.count("==== node ") == 3
    assert text.index("dgx-07") < text.index("cpu-node-1")
    assert topo_render.render_text([]) == ""


def test_render_gpus_without_nvidia_smi_is_not_called_cpu_only():
    snap = _gpu_snapshot()
    snap["nvidia_smi_topo"] = None
    snap["nvidia_smi_error"] = "nvidia-smi topo -m exited 9: Failed to initialize NVML"
    text = topo_render.render_text([snap])
    assert "nvidia-smi not available: nvidia-smi topo -m exited 9" in text
    assert "CPU-only" not in text
    assert "NVIDIA H100 80GB HBM3" in text


# ---------------------------------------------------------------------------
# node_snapshot


def test_node_snapshot_on_this_machine():
    snap = topo_probe.node_snapshot()
    json.dumps(snap)
    assert snap["host"]
    assert isinstance(snap["boot_id"], str)
    assert snap["cpu"]["logical_cores"] == os.cpu_count()
    assert isinstance(snap["cpu"]["numa_nodes"], list)
    if topo_probe.shutil.which("nvidia-smi") is None:
        assert snap["nvidia_smi_topo"] is None
        assert snap["nvidia_smi_error"]
        assert "\n" not in snap["nvidia_smi_error"]
        assert snap["gpus"] == []
        assert "CPU-only node" in topo_render.render_text([snap])
    for node in snap["cpu"]["numa_nodes"]:
        assert isinstance(node["node"], int) and isinstance(node["cpus"], str)


def _no_nvml(monkeypatch):
    # Keep the real pynvml (and a real GPU, if any) out of tests that fake nvidia-smi.
    monkeypatch.setitem(sys.modules, "pynvml", None)


def test_node_snapshot_with_mocked_nvidia_smi(monkeypatch):
    calls = []

    def fake_run(args, **kwargs):
        calls.append((args, kwargs))
        return subprocess.CompletedProcess(args, 0, stdout=NV18_TEXT, stderr="")

    monkeypatch.setattr(topo_probe.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(topo_probe.subprocess, "run", fake_run)
    _no_nvml(monkeypatch)
    snap = topo_probe.node_snapshot()

    assert snap["nvidia_smi_topo"] == NV18_TEXT
    assert "nvidia_smi_error" not in snap
    assert len(calls) == 1
    args, kwargs = calls[0]
    assert isinstance(args, list)
    assert args == ["/usr/bin/nvidia-smi", "topo", "-m"]
    assert not kwargs.get("shell", False)
    assert kwargs.get("timeout") == 20
    assert topo_parse.parse_topo_matrix(snap["nvidia_smi_topo"])["devices"][-1] == "GPU7"
    json.dumps(snap)


@pytest.mark.parametrize(
    "outcome, reason_part",
    [
        (subprocess.CompletedProcess([], 9, stdout="", stderr="Failed to initialize NVML\n"), "9"),
        (subprocess.TimeoutExpired(["nvidia-smi"], 20), "timed out"),
        (FileNotFoundError(2, "No such file or directory"), "FileNotFoundError"),
        (subprocess.CompletedProcess([], 0, stdout="  \n", stderr=""), "no output"),
    ],
)
def test_node_snapshot_nvidia_smi_failures(monkeypatch, outcome, reason_part):
    def fake_run(args, **kwargs):
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    monkeypatch.setattr(topo_probe.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(topo_probe.subprocess, "run", fake_run)
    _no_nvml(monkeypatch)
    snap = topo_probe.node_snapshot()
    assert snap["nvidia_smi_topo"] is None
    assert reason_part in snap["nvidia_smi_error"]
    assert "\n" not in snap["nvidia_smi_error"]


def test_node_snapshot_missing_proc_and_sys(monkeypatch, tmp_path):
    monkeypatch.setattr(topo_probe, "_BOOT_ID_PATH", tmp_path / "nope" / "boot_id")
    monkeypatch.setattr(topo_probe, "_CPUINFO_PATH", tmp_path / "nope" / "cpuinfo")
    monkeypatch.setattr(topo_probe, "_NUMA_DIR", tmp_path / "nope" / "node")
    monkeypatch.setattr(topo_probe.platform, "processor", lambda: "fallback-cpu")
    monkeypatch.setattr(topo_probe.shutil, "which", lambda name: None)
    _no_nvml(monkeypatch)
    snap = topo_probe.node_snapshot()
    assert snap["boot_id"] == ""
    assert snap["cpu"]["model"] == "fallback-cpu"
    assert snap["cpu"]["numa_nodes"] == []
    assert snap["nvidia_smi_error"] == "nvidia-smi not found on PATH"
    assert "pynvml" in snap["nvml_error"]
    json.dumps(snap)


def test_node_snapshot_reads_fake_sysfs(monkeypatch, tmp_path):
    (tmp_path / "boot_id").write_text("abcdef01-2345-6789-abcd-ef0123456789\n")
    (tmp_path / "cpuinfo").write_text(
        "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Gold 6338\n"
    )
    for node, cpus in [(1, "32-63,96-127"), (0, "0-31,64-95"), (10, "")]:
        (tmp_path / "node" / f"node{node}").mkdir(parents=True)
        (tmp_path / "node" / f"node{node}" / "cpulist").write_text(cpus + "\n")
    (tmp_path / "node" / "possible").write_text("0-1\n")
    monkeypatch.setattr(topo_probe, "_BOOT_ID_PATH", tmp_path / "boot_id")
    monkeypatch.setattr(topo_probe, "_CPUINFO_PATH", tmp_path / "cpuinfo")
    monkeypatch.setattr(topo_probe, "_NUMA_DIR", tmp_path / "node")
    monkeypatch.setattr(topo_probe.shutil, "which", lambda name: None)
    _no_nvml(monkeypatch)
    snap = topo_probe.node_snapshot()
    assert snap["boot_id"] == "abcdef01-2345-6789-abcd-ef0123456789"
    assert snap["cpu"]["model"] == "Intel(R) Xeon(R) Gold 6338"
    assert snap["cpu"]["numa_nodes"] == [
        {"node": 0, "cpus": "0-31,64-95"},
        {"node": 1, "cpus": "32-63,96-127"},
        {"node": 10, "cpus": ""},
    ]
    text = topo_render.render_text([snap])
    assert "(boot abcdef01)" in text
    assert "NUMA node1: cpus 32-63,96-127" in text


# ---------------------------------------------------------------------------
# NVML


class NVMLError_NoPermission(_FakeNVMLError):
    def __init__(self):
        super().__init__("Insufficient Permissions")


def _nvml_snapshot(monkeypatch, fake):
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    _no_nvidia_smi(monkeypatch)
    snap = topo_probe.node_snapshot()
    json.dumps(snap)
    return snap


def _text_line(text, prefix):
    (line,) = [line for line in text.splitlines() if line.startswith(prefix)]
    return line


# GPU 0 of the fake pynvml's node, as the snapshot should hold it
H100_GPU0 = {
    "index": 0,
    "name": "NVIDIA H100 80GB HBM3",
    "uuid": "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd",
    "pci_bus_id": "00000000:18:00.0",
    "memory_total_bytes": 85520809984,
    "pcie_gen_current": 4,
    "pcie_gen_max": 5,
    "pcie_width_current": 16,
    "pcie_width_max": 16,
    "nvlinks_up": 18,
    "nvlink_version": "4.0",  # nvmlNvlinkVersion_t 6, not "v6"
    "nvlink_version_enum": 6,  # what NVML said, beside what it means
}


def test_nvml_two_gpus(monkeypatch):
    fake = _fake_pynvml()
    snap = _nvml_snapshot(monkeypatch, fake)
    assert "nvml_error" not in snap
    assert snap["driver_version"] == "550.54.15"
    assert snap["cuda_driver_version"] == "12.4"
    gpus = snap["gpus"]
    assert [g["index"] for g in gpus] == [0, 1]
    assert gpus[0] == H100_GPU0
    assert gpus[1]["name"] == "NVIDIA L40S"
    assert gpus[1]["pci_bus_id"] == "00000000:2A:00.0"
    assert gpus[1]["nvlinks_up"] == 0
    assert gpus[1]["nvlink_version"] is None  # no link up, no version to ask
    assert "errors" not in gpus[1]  # a PCIe-only GPU's missing NVLink is not an error
    assert fake.state["shutdown"] == 1

    text = topo_render.render_text([snap])
    assert "GiB" in text and "NVIDIA L40S" in text
    gpu0 = _text_line(text, "GPU0: ")
    assert "NVLinks up 18, NVLink 4.0, bus 00000000:18:00.0," in gpu0
    assert "NVLink v" not in text and "NVLink 6" not in text
    assert "NVLink" not in _text_line(text, "GPU1: ").replace("NVLinks up 0", "")
    assert "nvidia-smi not available: nvidia-smi not found on PATH" in text
    assert "CPU-only" not in text
    summary = "\n".join(topo_render.summary_lines([snap]))
    assert "NVLinks up 18  NVLink 4.0" in summary and " v6" not in summary


@pytest.mark.parametrize(
    "raw, version",
    [(1, "1.0"), (3, "2.2"), (4, "3.0"), (6, "4.0"), (7, "5.0"),
     (0, "unknown (enum 0)"), (9, "unknown (enum 9)")],
)
def test_nvml_nvlink_version_enum(monkeypatch, raw, version):
    snap = _nvml_snapshot(monkeypatch, _fake_pynvml(nvlink_version=raw))
    assert snap["gpus"][0]["nvlink_version"] == version
    assert f"NVLinks up 18, NVLink {version}, " in topo_render.render_text([snap])
    assert f"NVLinks up 18  NVLink {version}" in "\n".join(topo_render.summary_lines([snap]))


def test_nvml_nvlink_version_query_failure_is_recorded(monkeypatch):
    fake = _fake_pynvml(field_errors={"nvmlDeviceGetNvLinkVersion": NVMLError_NotSupported()})
    gpu = _nvml_snapshot(monkeypatch, fake)["gpus"][0]
    assert gpu["nvlinks_up"] == 18 and gpu["nvlink_version"] is None
    assert gpu["errors"] == {"nvlink_version": "NVMLError_NotSupported: Not Supported"}


HOPPER, AMPERE = 9, 7  # nvmlDeviceArchitecture_t


@pytest.mark.parametrize("raw", [6, 7])
def test_nvml_nvlink_version_of_an_h100_is_4_whatever_enum_it_reports(monkeypatch, raw):
    """nvml.h names enum 7 NVLINK_VERSION_5_0, and Hopper drivers report 7 for NVLink 4 (as
    A100s report 5, "3.1", for NVLink 3): the architecture says which NVLink a GPU has. Today
    an H100 read as NVLink 5.0."""
    gpu = _nvml_snapshot(monkeypatch, _fake_pynvml(nvlink_version=raw, arch=HOPPER))["gpus"][0]
    assert (gpu["nvlink_version"], gpu["nvlink_version_enum"]) == ("4.0", raw)


def test_nvml_nvlink_version_by_architecture_and_enum_when_unknown(monkeypatch):
    gpu = _nvml_snapshot(monkeypatch, _fake_pynvml(nvlink_version=5, arch=AMPERE))["gpus"][0]
    assert gpu["nvlink_version"] == "3.0"
    # an architecture this table does not know (a newer one): the enum's name stands
    gpu = _nvml_snapshot(monkeypatch, _fake_pynvml(nvlink_version=7, arch=12))["gpus"][0]
    assert gpu["nvlink_version"] == "5.0"
    fake = _fake_pynvml(nvlink_version=6, arch=HOPPER,
                        field_errors={"nvmlDeviceGetArchitecture": NVMLError_NotSupported()})
    assert _nvml_snapshot(monkeypatch, fake)["gpus"][0]["nvlink_version"] == "4.0"


def test_nvml_links_after_one_that_errs_are_counted(monkeypatch):
    """A link NVML cannot read (link 6 here) is not the last link: today the count stopped
    there and an H100 with 17 links up read as 6. The error is kept."""
    fake = _fake_pynvml(link_errors={6: _FakeNVMLError("Unknown Error")})
    gpu0, gpu1 = _nvml_snapshot(monkeypatch, fake)["gpus"]
    assert gpu0["nvlinks_up"] == 17 and gpu0["nvlink_version"] == "4.0"
    assert gpu0["errors"] == {"nvlinks": "link 6: _FakeNVMLError: Unknown Error"}
    # a PCIe-only GPU refuses every link: no link up, and no error to report
    assert gpu1["nvlinks_up"] == 0 and "errors" not in gpu1


def test_nvml_partial_nvlinks_counted(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(nvlinks=(12, 0)))
    _no_nvidia_smi(monkeypatch)
    assert topo_probe.node_snapshot()["gpus"][0]["nvlinks_up"] == 12


def test_nvml_unsupported_pcie_fields_are_none(monkeypatch):
    snap = _nvml_snapshot(monkeypatch, _fake_pynvml(fail_pcie=True))
    assert len(snap["gpus"]) == 2
    assert snap["gpus"][0]["pcie_gen_max"] is None
    assert set(snap["gpus"][0]["errors"]) == {
        "pcie_gen_current", "pcie_gen_max", "pcie_width_current", "pcie_width_max"
    }
    assert "gen? x?" in topo_render.render_text([snap])


def test_nvml_not_supported_field_keeps_the_rest(monkeypatch):
    fake = _fake_pynvml(
        field_errors={"nvmlDeviceGetCurrPcieLinkWidth": NVMLError_NotSupported()}
    )
    snap = _nvml_snapshot(monkeypatch, fake)
    assert "nvml_error" not in snap
    gpu0, gpu1 = snap["gpus"]
    assert gpu0 == {**H100_GPU0, "pcie_width_current": None,
                    "errors": {"pcie_width_current": "NVMLError_NotSupported: Not Supported"}}
    assert gpu1["name"] == "NVIDIA L40S" and gpu1["pcie_width_current"] is None
    assert gpu1["errors"] == gpu0["errors"]

    text = topo_render.render_text([snap])
    assert "PCIe gen4 x? (max gen5 x16)" in _text_line(text, "GPU0: ")
    assert ("GPU0 pcie_width_current unknown: NVMLError_NotSupported: Not Supported"
            in text.splitlines())
    summary = "\n".join(topo_render.summary_lines([snap]))
    assert "PCIe gen 4/5 x?/16" in summary
    assert "(unreadable: pcie_width_current; see topo.txt)" in summary


def test_nvml_one_gpu_without_permission_keeps_the_others(monkeypatch):
    fake = _fake_pynvml(nvlinks=(18, 0, 18), bad_handles={1: NVMLError_NoPermission()})
    snap = _nvml_snapshot(monkeypatch, fake)
    assert "nvml_error" not in snap
    assert snap["driver_version"] == "550.54.15"
    gpus = snap["gpus"]
    assert [g["index"] for g in gpus] == [0, 1, 2]
    assert gpus[1] == {"index": 1, "error": "NVMLError_NoPermission: Insufficient Permissions"}
    for gpu, bus in ((gpus[0], "00000000:18:00.0"), (gpus[2], "00000000:3A:00.0")):
        assert gpu["name"] == "NVIDIA H100 80GB HBM3"
        assert gpu["uuid"] == f"GPU-0000000{gpu['index']}-aaaa-bbbb-cccc-dddddddddddd"
        assert gpu["pci_bus_id"] == bus
        assert gpu["memory_total_bytes"] == 85520809984
        assert (gpu["pcie_gen_current"], gpu["pcie_width_max"]) == (4, 16)
        assert (gpu["nvlinks_up"], gpu["nvlink_version"]) == (18, "4.0")
        assert "errors" not in gpu
    assert fake.state["shutdown"] == 1

    text = topo_render.render_text([snap])
    assert "GPU1: not readable: NVMLError_NoPermission: Insufficient Permissions" in text
    assert "NVLink 4.0, bus 00000000:3A:00.0" in _text_line(text, "GPU2: ")
    assert "NVML not available" not in text
    summary = topo_render.summary_lines([snap])
    assert "  GPU1  not readable: NVMLError_NoPermission: Insufficient Permissions" in summary
    assert sum("NVIDIA H100 80GB HBM3  80 GiB" in line for line in summary) == 2


def test_nvml_init_failure(monkeypatch):
    fake = _fake_pynvml(init_error=_FakeNVMLError("Driver Not Loaded\nsecond line"))
    snap = _nvml_snapshot(monkeypatch, fake)
    assert snap["gpus"] == []
    assert "Driver Not Loaded" in snap["nvml_error"]
    assert "\n" not in snap["nvml_error"]
    assert fake.state["shutdown"] == 0


def test_nvml_required_field_failure_keeps_the_gpu(monkeypatch):
    # A lost UUID (or name, or memory) used to drop every GPU on the node.
    fake = _fake_pynvml(field_errors={"nvmlDeviceGetUUID": _FakeNVMLError("GPU is lost\nmore")})
    snap = _nvml_snapshot(monkeypatch, fake)
    assert "nvml_error" not in snap
    assert [g["name"] for g in snap["gpus"]] == ["NVIDIA H100 80GB HBM3", "NVIDIA L40S"]
    assert snap["gpus"][0]["uuid"] is None
    assert snap["gpus"][0]["errors"] == {"uuid": "_FakeNVMLError: GPU is lost more"}
    assert _text_line(topo_render.render_text([snap]), "GPU0: ").endswith(", ?")
    assert fake.state["shutdown"] == 1


def test_nvml_count_failure_loses_the_inventory(monkeypatch):
    fake = _fake_pynvml(field_errors={"nvmlDeviceGetCount": _FakeNVMLError("Unknown Error")})
    snap = _nvml_snapshot(monkeypatch, fake)
    assert snap["gpus"] == []
    assert "Unknown Error" in snap["nvml_error"]
    assert snap["driver_version"] == "550.54.15"
    assert fake.state["shutdown"] == 1


# ---------------------------------------------------------------------------
# dedupe_by_node


def test_dedupe_by_node():
    a0 = {"host": "a", "boot_id": "1", "rank": 0}
    a1 = {"host": "a", "boot_id": "1", "rank": 1}
    b2 = {"host": "b", "boot_id": "2", "rank": 2}
    a_rebooted = {"host": "a", "boot_id": "3", "rank": 3}
    b4 = {"host": "b", "boot_id": "2", "rank": 4}
    out = topo_probe.dedupe_by_node([a0, a1, b2, a_rebooted, b4])
    assert [s["rank"] for s in out] == [0, 2, 3]
    assert topo_probe.dedupe_by_node([]) == []


def test_network_interfaces_from_sysfs(monkeypatch, tmp_path):
    for name, state, speed, mtu in (("eth0", "up", "25000", "9000"), ("lo", "unknown", "", "")):
        d = tmp_path / name
        d.mkdir()
        (d / "operstate").write_text(state + "\n")
        (d / "speed").write_text(speed + "\n")
        (d / "mtu").write_text(mtu + "\n")
    monkeypatch.setattr(topo_probe, "_NET_DIR", tmp_path)
    _no_nvidia_smi(monkeypatch)
    snap = topo_probe.node_snapshot()
    nics = {n["name"]: n for n in snap["network"]}
    assert nics["eth0"]["speed_mbps"] == 25000 and nics["eth0"]["mtu"] == 9000
    assert nics["eth0"]["state"] == "up"
    assert nics["lo"]["speed_mbps"] is None and nics["lo"]["mtu"] is None
    assert "network eth0: up, 25000 Mb/s, mtu 9000" in topo_render.render_text([snap])


def test_network_interfaces_absent_sysfs(monkeypatch, tmp_path):
    monkeypatch.setattr(topo_probe, "_NET_DIR", tmp_path / "missing")
    assert topo_probe.node_snapshot()["network"] == []


# ---------------------------------------------------------------------------
# NVLS: whether NCCL can use NVLink SHARP (the 8-GPU all_reduce floors depend on it)


def _nvls_snapshot(monkeypatch, multicast):
    """A node snapshot whose CUDA multicast query answers `multicast` (a list per GPU, or an
    exception to raise)."""
    def ask():
        if isinstance(multicast, Exception):
            raise multicast
        return multicast

    monkeypatch.setattr(topo_probe, "_multicast_support", ask)
    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)
    monkeypatch.delenv("NCCL_ALGO", raising=False)
    return _nvml_snapshot(monkeypatch, _fake_pynvml())


def test_nvls_on_where_every_gpu_has_multicast(monkeypatch):
    snap = _nvls_snapshot(monkeypatch, [True] * 8)
    assert (snap["nvls"], snap["nvls_why"]) == (True, "CUDA multicast on all 8 GPUs")
    assert ("NVLS (NVLink SHARP): yes, CUDA multicast on all 8 GPUs"
            in topo_render.render_text([snap]))
    (said,) = [line for line in topo_render.summary_lines([snap]) if "NVLS" in line]
    assert said.strip().startswith("NVLS: yes") and snap["nvls_why"] in said


@pytest.mark.parametrize("multicast,env,facts", [
    ([True, False], {}, ("no CUDA multicast", "GPU 1")),
    ([True] * 8, {"NCCL_NVLS_ENABLE": "0"}, ("NCCL_NVLS_ENABLE=0",)),
    ([True] * 8, {"NCCL_ALGO": "Ring,Tree"}, ("NCCL_ALGO=Ring,Tree", "leaves NVLS out")),
    ([True] * 8, {"NCCL_ALGO": "^NVLS"}, ("NCCL_ALGO=^NVLS", "leaves NVLS out")),
])
def test_nvls_off(monkeypatch, multicast, env, facts):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(topo_probe, "_multicast_support", lambda: multicast)
    monkeypatch.setattr(topo_probe.shutil, "which", lambda name: None)
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml())
    if "NCCL_ALGO" not in env:
        monkeypatch.delenv("NCCL_ALGO", raising=False)
    snap = topo_probe.node_snapshot()
    why = snap["nvls_why"]
    assert snap["nvls"] is False and all(fact in why for fact in facts) and "\n" not in why, why
    if "NCCL_NVLS_ENABLE" in env:  # results.md gives this one as nvls_why's value, verbatim
        assert why == "NCCL_NVLS_ENABLE=0"
    assert f"NVLS (NVLink SHARP): no, {why}" in topo_render.render_text([snap])


def test_nvls_on_with_nccl_algo_naming_it(monkeypatch):
    monkeypatch.setenv("NCCL_ALGO", "NVLS,Ring")
    monkeypatch.setattr(topo_probe, "_multicast_support", lambda: [True])
    nvls, why = topo_probe._nvls_probe()
    assert nvls is True and "CUDA multicast" in why and "its GPU" in why, why


def test_nvls_unknown_says_why(monkeypatch):
    snap = _nvls_snapshot(monkeypatch, RuntimeError("CUDA driver error: initialization error"))
    assert snap["nvls"] is None
    why = snap["nvls_why"]
    assert why.startswith("unknown: ") and "RuntimeError" in why, why
    assert "initialization error" in why and "\n" not in why, why
    assert "NVLS (NVLink SHARP): unknown: RuntimeError" in topo_render.render_text([snap])
    snap = _nvls_snapshot(monkeypatch, [])
    assert snap["nvls"] is None and snap["nvls_why"].startswith("unknown: ")
    assert "no CUDA device" in snap["nvls_why"]


def test_nvls_in_this_process_is_unknown_without_cuda():
    """The test suite runs torch without CUDA initialised: unknown, not a guess."""
    nvls, why = topo_probe._nvls_probe()
    assert nvls is None and why.startswith("unknown: ")


def test_nvls_is_shown_where_nvml_fails_but_torch_sees_gpus(monkeypatch):
    """A container without libnvidia-ml: no GPU inventory, yet NVLS was asked through torch."""
    monkeypatch.setattr(topo_probe, "_multicast_support", lambda: [True] * 8)
    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)
    monkeypatch.delenv("NCCL_ALGO", raising=False)
    snap = _nvml_snapshot(monkeypatch, _fake_pynvml(init_error=_FakeNVMLError("not found")))
    assert snap["gpus"] == [] and snap["nvls"] is True
    assert ("NVLS (NVLink SHARP): yes, CUDA multicast on all 8 GPUs"
            in topo_render.render_text([snap]))
    # a CPU node whose NVLS is unknown says nothing of it
    cpu = {**snap, "nvls": None, "nvls_why": "unknown: torch not loaded"}
    assert "NVLS" not in (topo_render.render_text([cpu])
                          + "\n".join(topo_render.summary_lines([cpu])))
