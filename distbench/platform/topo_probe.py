"""Per-node topology snapshot: what this machine is (GPUs and their links, NVLS, CPU, NUMA,
network), as a JSON-serialisable dict that run.json's nodes and topo.txt are made from
(topo_render.py writes it as text, topo_parse.py reads nvidia-smi's matrix in it).

This runs at the start of every benchmark on every node, so every probe is
failure-proof: a missing file, command or library degrades to an empty value
plus a one-line reason instead of raising.  Deliberately torch-free so it can
run before (or without) the process group being set up.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from distbench.core.errors import one_line

# Module-level so tests can point them at fake sysfs/procfs trees.
_BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
_CPUINFO_PATH = Path("/proc/cpuinfo")
_NUMA_DIR = Path("/sys/devices/system/node")
_NET_DIR = Path("/sys/class/net")

_NVIDIA_SMI_TIMEOUT_S = 20
# NVML_NVLINK_MAX_LINKS was 18 up to Hopper; probing stops at the first error anyway.
_MAX_NVLINKS = 18
_ERR_MAX_CHARS = 300


def _error(what: BaseException | str) -> str:
    """An error as the snapshot records it: all it says on one bounded line (a tool's output
    may span lines), an exception named by its type."""
    return one_line(what, _ERR_MAX_CHARS, whole=True, named=True)


def _text(value: Any) -> str:
    # Older pynvml releases return bytes, newer ones str.
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except Exception:
        return None



def _boot_id() -> str:
    text = _read_text(_BOOT_ID_PATH)
    return text.strip() if text else ""


def _hostname() -> str:
    try:
        return socket.gethostname()
    except Exception:
        return "unknown"


def _nvidia_smi_topo() -> tuple[str | None, str | None]:
    """Return (stdout, None) on success or (None, reason)."""
    try:
        exe = shutil.which("nvidia-smi")
    except Exception as exc:
        return None, _error(exc)
    if not exe:
        return None, "nvidia-smi not found on PATH"
    try:
        proc = subprocess.run(
            [exe, "topo", "-m"],
            capture_output=True,
            text=True,
            timeout=_NVIDIA_SMI_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None, f"nvidia-smi topo -m timed out after {_NVIDIA_SMI_TIMEOUT_S} s"
    except Exception as exc:
        return None, _error(exc)
    stdout = proc.stdout or ""
    if proc.returncode != 0:
        detail = (proc.stderr or "").strip() or stdout.strip()
        detail_line = detail.splitlines()[0] if detail else "no output"
        return None, _error(f"nvidia-smi topo -m exited {proc.returncode}: {detail_line}")
    if not stdout.strip():
        return None, "nvidia-smi topo -m produced no output"
    return stdout, None


def _cuda_version_str(raw: Any) -> str:
    # NVML encodes CUDA driver versions as 1000 * major + 10 * minor (12040 -> 12.4).
    if isinstance(raw, int):
        return f"{raw // 1000}.{(raw % 1000) // 10}"
    return _text(raw)


def _optional(fn: Any, *args: Any) -> Any:
    # Driver and CUDA versions are extras: a node without them is still worth describing.
    try:
        return fn(*args)
    except Exception:
        return None


def _field(errors: dict[str, str], name: str, getter: Any, *args: Any) -> Any:
    """getter(*args), or None with the reason kept in errors[name].

    PCIe, bus id and even name queries fail on some parts (vGPU, MIG parents
    without privileges, some SXM/Grace boards): one field must not cost the GPU,
    and a None must say why it is None.
    """
    try:
        return getter(*args)
    except Exception as exc:
        errors[name] = _error(exc)
        return None


# nvmlNvlinkVersion_t is an enum, not a version number: 6 is NVLink 4.0. 8 (6.0) comes from
# NVIDIA's newest nvml.h.
_NVLINK_VERSIONS = {1: "1.0", 2: "2.0", 3: "2.2", 4: "3.0", 5: "3.1", 6: "4.0", 7: "5.0", 8: "6.0"}
# Drivers do not report the enum the header documents: Hopper reports 7 ("5.0") for NVLink 4
# (TensorRT-LLM's auto_parallel maps 7 to NVLink 4, other tools carry a workaround for H100's
# "5.0") and A100s report 5 ("3.1", open-mpi/hwloc#658). The architecture fixes the NVLink
# generation, so it names the version where it is known (nvmlDeviceArchitecture_t: Pascal 4,
# Volta 5, Turing 6, Ampere 7, Hopper 9, Blackwell 10); the enum only where it is not.
_NVLINK_BY_ARCH = {4: "1.0", 5: "2.0", 6: "2.0", 7: "3.0", 9: "4.0", 10: "5.0"}


def _nvlink_version_str(raw: Any, arch: Any = None) -> str:
    # 0 (INVALID) or a value newer than this table: say so rather than guess a version.
    try:
        known = _NVLINK_VERSIONS.get(int(raw))
    except (TypeError, ValueError):
        known = None
    return _NVLINK_BY_ARCH.get(arch) or known or f"unknown (enum {raw})"


def _nvlink_links(nvml: Any, handle: Any) -> tuple[list[int], str | None]:
    """(the links up, the first link before the last one up that NVML would not read)."""
    enabled = getattr(nvml, "NVML_FEATURE_ENABLED", 1)
    up: list[int] = []
    failed: list[tuple[int, str]] = []
    # Every link is asked: one NVML cannot read (a link in error) is not the last one, and
    # stopping there undercounted the links after it. Past a GPU's last link (12 on an A100)
    # and on every link of a PCIe-only GPU NVML refuses too, which is no error to report.
    for link in range(_MAX_NVLINKS):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except Exception as exc:
            failed.append((link, f"link {link}: {_error(exc)}"))
            continue
        if state == enabled:
            up.append(link)
    inside = [line for link, line in failed if up and link < up[-1]]
    return up, inside[0] if inside else None


def _nvlink_probe(nvml: Any, handle: Any, errors: dict[str, str],
                  gpu: dict[str, Any]) -> None:
    """nvlinks_up, nvlink_version (None when no link is up) and the enum NVML gave for it."""
    up, failed = _nvlink_links(nvml, handle)
    gpu["nvlinks_up"], gpu["nvlink_version"] = len(up), None
    if failed:
        errors["nvlinks"] = failed
    if not up:
        return
    raw = _field(errors, "nvlink_version",
                 lambda: nvml.nvmlDeviceGetNvLinkVersion(handle, up[0]))
    if raw is not None:
        arch = _optional(lambda: nvml.nvmlDeviceGetArchitecture(handle))
        gpu["nvlink_version"] = _nvlink_version_str(raw, arch)
        gpu["nvlink_version_enum"] = raw if isinstance(raw, int) else _text(raw)


# (snapshot key, query); attribute lookups stay inside the query so an old
# pynvml that lacks a function costs that field only.
_GPU_FIELDS: tuple[tuple[str, Any], ...] = (
    ("name", lambda nvml, h: _text(nvml.nvmlDeviceGetName(h))),
    ("uuid", lambda nvml, h: _text(nvml.nvmlDeviceGetUUID(h))),
    ("pci_bus_id", lambda nvml, h: _text(nvml.nvmlDeviceGetPciInfo(h).busId)),
    ("memory_total_bytes", lambda nvml, h: int(nvml.nvmlDeviceGetMemoryInfo(h).total)),
    ("pcie_gen_current", lambda nvml, h: nvml.nvmlDeviceGetCurrPcieLinkGeneration(h)),
    ("pcie_gen_max", lambda nvml, h: nvml.nvmlDeviceGetMaxPcieLinkGeneration(h)),
    ("pcie_width_current", lambda nvml, h: nvml.nvmlDeviceGetCurrPcieLinkWidth(h)),
    ("pcie_width_max", lambda nvml, h: nvml.nvmlDeviceGetMaxPcieLinkWidth(h)),
)


def _gpu_entry(nvml: Any, index: int) -> dict[str, Any]:
    """One GPU's inventory; a GPU NVML will not open (cgroups, permissions) keeps its index."""
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
    except Exception as exc:
        return {"index": index, "error": _error(exc)}
    gpu: dict[str, Any] = {"index": index}
    errors: dict[str, str] = {}
    for name, query in _GPU_FIELDS:
        gpu[name] = _field(errors, name, query, nvml, handle)
    _nvlink_probe(nvml, handle, errors, gpu)
    if errors:
        gpu["errors"] = errors
    return gpu


def _nvml_probe() -> dict[str, Any]:
    out: dict[str, Any] = {"gpus": [], "driver_version": None, "cuda_driver_version": None}
    try:
        import pynvml as nvml
    except Exception as exc:
        out["nvml_error"] = _error(f"pynvml not importable: {exc}")
        return out
    try:
        nvml.nvmlInit()
    except Exception as exc:
        out["nvml_error"] = _error(f"nvmlInit failed: {_error(exc)}")
        return out
    try:
        driver = _optional(lambda: nvml.nvmlSystemGetDriverVersion())
        cuda = _optional(lambda: nvml.nvmlSystemGetCudaDriverVersion())
        out["driver_version"] = _text(driver) if driver is not None else None
        out["cuda_driver_version"] = _cuda_version_str(cuda) if cuda is not None else None
        # Only the count is all-or-nothing; _gpu_entry keeps each GPU's own failures.
        out["gpus"] = [_gpu_entry(nvml, i) for i in range(int(nvml.nvmlDeviceGetCount()))]
    except Exception as exc:
        out["gpus"] = []
        out["nvml_error"] = _error(f"NVML query failed: {_error(exc)}")
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
    return out


def _multicast_support() -> list[bool]:
    """Whether each visible GPU supports CUDA multicast, which NVLink SHARP needs (NVSwitch
    with its fabric manager; not passed through to some VMs). Asked through torch when the
    caller has loaded it and initialised CUDA: this module imports no torch, and a probe must
    not create a CUDA context in a run that uses none. Raises LookupError saying why not."""
    torch = sys.modules.get("torch")
    if torch is None:
        raise LookupError("torch not loaded")
    if not torch.cuda.is_initialized():
        raise LookupError("CUDA not initialised in this process (not an nccl run)")
    symm = torch._C._distributed_c10d._SymmetricMemory  # torch >= 2.5; AttributeError before
    cuda = torch._C._autograd.DeviceType.CUDA
    return [bool(symm.has_multicast_support(cuda, i)) for i in range(torch.cuda.device_count())]


def _nvls_probe() -> tuple[bool | None, str]:
    """Whether NCCL can run all_reduce as NVLink SHARP (NVLS) here, and why: the 8-GPU
    all_reduce figures of the H100 and H200 profiles are NVLS's, and a healthy node without
    it reaches the ring's. None: unknown (judged as without, so a healthy node never fails
    for want of evidence)."""
    if os.environ.get("NCCL_NVLS_ENABLE", "").strip() == "0":
        return False, "NCCL_NVLS_ENABLE=0"
    algo = os.environ.get("NCCL_ALGO", "").strip()
    # "Ring,Tree" leaves NVLS out, "^NVLS" excludes it; any "^" list is taken as leaving it
    # out, which at worst judges a node by the lower figure
    if algo and ("nvls" not in algo.lower() or "^" in algo):
        return False, f"NCCL_ALGO={algo} leaves NVLS out"
    try:
        support = _multicast_support()
    except LookupError as exc:
        return None, f"unknown: {exc}"
    except Exception as exc:
        return None, f"unknown: {_error(exc)}"
    if not support:
        return None, "unknown: no CUDA device"
    without = [str(i) for i, ok in enumerate(support) if not ok]
    if without:
        return False, f"no CUDA multicast on GPU {', '.join(without)}"
    return True, ("CUDA multicast on its GPU" if len(support) == 1 else
                  f"CUDA multicast on all {len(support)} GPUs")


def _cpu_model() -> str:
    text = _read_text(_CPUINFO_PATH) or ""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "model name" and value.strip():
            return value.strip()
    try:
        return platform.processor() or ""
    except Exception:
        return ""


def _numa_nodes() -> list[dict[str, Any]]:
    nodes = []
    try:
        entries = list(_NUMA_DIR.glob("node*"))
    except Exception:
        return []
    for entry in entries:
        match = re.fullmatch(r"node(\d+)", entry.name)
        if not match:
            continue
        cpus = _read_text(entry / "cpulist")
        if cpus is None:
            continue
        nodes.append({"node": int(match.group(1)), "cpus": cpus.strip()})
    nodes.sort(key=lambda n: n["node"])
    return nodes


def _network_interfaces() -> list[dict[str, Any]]:
    """Interfaces from sysfs: what a multi-node run's traffic can take (speed in Mb/s)."""
    out = []
    try:
        entries = sorted(_NET_DIR.iterdir())
    except Exception:
        return []
    for entry in entries:
        speed = _read_text(entry / "speed")
        out.append({
            "name": entry.name,
            "state": (_read_text(entry / "operstate") or "").strip() or None,
            "speed_mbps": int(speed) if speed and speed.strip().lstrip("-").isdigit()
            and int(speed) > 0 else None,
            "mtu": int(m) if (m := (_read_text(entry / "mtu") or "").strip()).isdigit() else None,
            "address": (_read_text(entry / "address") or "").strip() or None,
        })
    return out


def _cpu_probe() -> dict[str, Any]:
    try:
        cores = os.cpu_count()
    except Exception:
        cores = None
    return {"model": _cpu_model(), "logical_cores": cores, "numa_nodes": _numa_nodes()}


def node_snapshot() -> dict:
    """Describe this machine as a JSON-serialisable dict (never raises).

    Keys: host, boot_id, nvidia_smi_topo (+ nvidia_smi_error when None), gpus,
    driver_version, cuda_driver_version (+ nvml_error on NVML failure), nvls (whether NCCL
    can use NVLink SHARP: True, False or None for unknown) with nvls_why, cpu, network.
    A GPU NVML will not open is {"index", "error"}; a field it will not give is None,
    with the reason under that GPU's "errors".
    """
    snap: dict[str, Any] = {"host": _hostname(), "boot_id": _boot_id()}

    try:
        topo_text, topo_err = _nvidia_smi_topo()
    except Exception as exc:  # belt and braces: the probe itself should not raise
        topo_text, topo_err = None, _error(exc)
    snap["nvidia_smi_topo"] = topo_text
    if topo_text is None:
        snap["nvidia_smi_error"] = topo_err or "unknown error"

    try:
        snap.update(_nvml_probe())
    except Exception as exc:
        snap.update(gpus=[], driver_version=None, cuda_driver_version=None)
        snap["nvml_error"] = _error(exc)

    try:
        snap["nvls"], snap["nvls_why"] = _nvls_probe()
    except Exception as exc:
        snap["nvls"], snap["nvls_why"] = None, f"unknown: {_error(exc)}"

    try:
        snap["cpu"] = _cpu_probe()
    except Exception:
        snap["cpu"] = {"model": "", "logical_cores": None, "numa_nodes": []}
    try:
        snap["network"] = _network_interfaces()
    except Exception:
        snap["network"] = []
    return snap


def dedupe_by_node(snapshots: list[dict]) -> list[dict]:
    """Keep the first snapshot per (host, boot_id), preserving order.

    Every rank on a node sends the same snapshot; boot_id keeps two distinct
    machines apart even when they share a hostname (containers, reused names).
    """
    seen: set[tuple[str, str]] = set()
    out = []
    for snap in snapshots:
        key = (str(snap.get("host", "")), str(snap.get("boot_id", "")))
        if key in seen:
            continue
        seen.add(key)
        out.append(snap)
    return out
