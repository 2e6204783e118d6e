"""`distbench topo` read back: per node of the topology snapshot, what topo printed. The pandas and
matplotlib parts are imported when report runs, never when the command line is built."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distbench.core.tables import markdown_table

if TYPE_CHECKING:


    from distbench.results.reader import Run

def section(run: Run) -> list[str]:
    """A run of no table (topo's): per node of its topology snapshot, the figures topo
    printed: GPUs, their links, the CPU and the network interfaces up."""
    from distbench.results import reader

    if run.tables:
        return []
    rows = []
    for node in reader.topo_nodes(run):
        gpus = [g for g in node.get("gpus") or [] if isinstance(g, dict)]
        cpu = node.get("cpu") if isinstance(node.get("cpu"), dict) else {}
        links = list(((node.get("gpu_links") or {}).get("links") or {}).values())
        kinds = {str(k): sum(str(v) == str(k) for v in links) for k in links}
        nics = [str(n.get("name")) + (f" {n['speed_mbps']} Mb/s" if n.get("speed_mbps") else "")
                for n in node.get("network") or [] if isinstance(n, dict)
                and n.get("state") == "up"]
        # no GPU found: why, as topo said it (nvidia-smi not found, NVML missing)
        why = node.get("nvidia_smi_error") or node.get("nvml_error") or "none found"
        rows.append([str(node.get("host")), str(len(gpus)),
                     ", ".join(sorted({str(g.get("name")) for g in gpus})) if gpus else
                     f"- ({why})", ", ".join(f"{n} x {k}" for k, n in sorted(kinds.items()))
                     or "-", str(cpu.get("model") or "-"), str(cpu.get("logical_cores") or "-"),
                     ", ".join(nics) or "-"])
    if not rows:
        return []
    return ["### Topology", ""] + markdown_table(
        ["host", "GPUs", "GPU model", "GPU links", "CPU", "cores", "network up"], rows) + [""]


