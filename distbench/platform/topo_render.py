"""The nodes' topology snapshots (topo_probe.py) as text: topo.txt in the run directory, one
block per node (render_text), and the digest the console prints (summary_lines). Torch-free.
"""

from __future__ import annotations

from typing import Any

from distbench.platform.topo_parse import parse_topo_matrix


def _fmt_gib(nbytes: Any) -> str:
    try:
        return f"{int(nbytes) / 2**30:.1f} GiB"
    except (TypeError, ValueError):
        return "? GiB"


def _fmt(value: Any) -> str:
    return "?" if value is None else str(value)


def _nvlink_text(gpu: dict, sep: str) -> str:
    version = gpu.get("nvlink_version")
    return f"{sep}NVLink {version}" if version else ""


def _gpu_lines(gpu: dict) -> list[str]:
    """The GPU's inventory line, then one line per field NVML would not give."""
    label = f"GPU{_fmt(gpu.get('index'))}"
    if gpu.get("error"):
        return [f"{label}: not readable: {gpu['error']}"]
    pcie = (
        f"PCIe gen{_fmt(gpu.get('pcie_gen_current'))} x{_fmt(gpu.get('pcie_width_current'))}"
        f" (max gen{_fmt(gpu.get('pcie_gen_max'))} x{_fmt(gpu.get('pcie_width_max'))})"
    )
    line = (
        f"{label}: {gpu.get('name') or '?'}, "
        f"{_fmt_gib(gpu.get('memory_total_bytes'))}, {pcie}, "
        f"NVLinks up {_fmt(gpu.get('nvlinks_up'))}{_nvlink_text(gpu, ', ')}, "
        f"bus {gpu.get('pci_bus_id') or '?'}, {gpu.get('uuid') or '?'}"
    )
    errors = gpu.get("errors") or {}
    return [line] + [f"{label} {field} unknown: {err}" for field, err in errors.items()]


def _nvls_text(snap: dict) -> str:
    """"yes, why", "no, why" or "unknown: why"."""
    nvls, why = snap.get("nvls"), snap.get("nvls_why") or "unknown"
    if nvls is None:
        return why if why.startswith("unknown") else f"unknown: {why}"
    return f"{'yes' if nvls else 'no'}, {why}"


def _render_one(snap: dict) -> list[str]:
    boot = str(snap.get("boot_id") or "")[:8] or "?"
    out = [f"==== node {snap.get('host') or '?'} (boot {boot}) ===="]
    gpus = snap.get("gpus") or []

    topo_text = snap.get("nvidia_smi_topo")
    if topo_text:
        out.extend(str(topo_text).rstrip("\n").split("\n"))
    else:
        reason = snap.get("nvidia_smi_error") or "unknown reason"
        # "CPU-only" would be wrong if NVML still found GPUs (e.g. a broken nvidia-smi).
        suffix = "GPU inventory from NVML below" if gpus else "CPU-only node"
        out.append(f"nvidia-smi not available: {reason}; {suffix}")

    cpu = snap.get("cpu") or {}
    out.append(f"CPU: {cpu.get('model') or 'unknown'}")
    out.append(f"logical cores: {_fmt(cpu.get('logical_cores'))}")
    numa = cpu.get("numa_nodes") or []
    if numa:
        for node in numa:
            out.append(f"NUMA node{_fmt(node.get('node'))}: cpus {node.get('cpus') or '?'}")
    else:
        out.append("NUMA: no /sys/devices/system/node information")

    for gpu in gpus:
        out.extend(_gpu_lines(gpu))
    if gpus or snap.get("driver_version"):
        out.append(
            f"driver version: {_fmt(snap.get('driver_version'))}, "
            f"CUDA driver version: {_fmt(snap.get('cuda_driver_version'))}"
        )
    if gpus or snap.get("nvls") is not None:  # NVML may fail where torch still sees GPUs
        out.append(f"NVLS (NVLink SHARP): {_nvls_text(snap)}")
    if snap.get("nvml_error"):
        out.append(f"NVML not available: {snap['nvml_error']}")
    for nic in snap.get("network") or []:
        speed = f"{nic['speed_mbps']} Mb/s" if nic.get("speed_mbps") else "speed ?"
        out.append(f"network {nic.get('name')}: {nic.get('state') or '?'}, {speed}, "
                   f"mtu {_fmt(nic.get('mtu'))}")
    return out


def render_text(snapshots: list[dict]) -> str:
    """Render snapshots as the content of topo.txt, one block per node."""
    blocks = ["\n".join(_render_one(snap)) for snap in snapshots]
    return "\n\n".join(blocks) + "\n" if blocks else ""

def _gpu_summary(g: dict) -> str:
    if g.get("error"):
        return f"  GPU{g.get('index')}  not readable: {g['error']}"
    mem = g.get("memory_total_bytes")
    # A failed query is None: "0 GiB" or "xNone" would read as a measurement.
    mem_text = "?" if mem is None else f"{mem / 2**30:.0f}"
    unreadable = ", ".join(g.get("errors") or {})
    return (
        f"  GPU{g.get('index')}  {g.get('name') or '?'}  {mem_text} GiB  PCIe gen "
        f"{_fmt(g.get('pcie_gen_current'))}/{_fmt(g.get('pcie_gen_max'))} x"
        f"{_fmt(g.get('pcie_width_current'))}/{_fmt(g.get('pcie_width_max'))}  "
        f"NVLinks up {_fmt(g.get('nvlinks_up'))}{_nvlink_text(g, '  ')}"
        + (f"  (unreadable: {unreadable}; see topo.txt)" if unreadable else "")
    )


def summary_lines(snapshots: list[dict]) -> list[str]:
    """A readable digest for stdout; the full text is in topo.txt."""
    out: list[str] = []
    for snap in snapshots:
        lines = [f"node {snap.get('host')}"]
        gpus = snap.get("gpus") or []
        lines.extend(_gpu_summary(g) for g in gpus)
        if gpus:
            lines.append(f"  driver {snap.get('driver_version')}, CUDA "
                         f"{snap.get('cuda_driver_version')}")
        if gpus or snap.get("nvls") is not None:
            lines.append(f"  NVLS: {_nvls_text(snap)}")
        links = parse_topo_matrix(snap.get("nvidia_smi_topo") or "")["links"]
        if links:
            kinds: dict[str, int] = {}
            for kind in links.values():
                kinds[kind] = kinds.get(kind, 0) + 1
            lines.append("  GPU-GPU links (ordered pairs): " + ", ".join(
                f"{count} x {kind}" for kind, count in sorted(kinds.items())))
        elif snap.get("nvidia_smi_topo") is None:
            # NVML may still have found GPUs (nvidia-smi missing or broken): not CPU-only then.
            what = "GPUs from NVML above" if gpus else "CPU-only node"
            lines.append(f"  no nvidia-smi ({snap.get('nvidia_smi_error')}): {what}")
        cpu = snap.get("cpu") or {}
        lines.append(f"  CPU {cpu.get('model')}, {cpu.get('logical_cores')} logical cores")
        for numa in cpu.get("numa_nodes") or []:
            lines.append(f"  NUMA node{numa['node']}: cpus {numa['cpus']}")
        nics = [f"{n['name']} ({n.get('state')}"
                + (f", {n['speed_mbps']} Mb/s)" if n.get("speed_mbps") else ")")
                for n in snap.get("network") or []]
        if nics:
            lines.append("  network: " + ", ".join(nics))
        out.extend(lines)
    return out
