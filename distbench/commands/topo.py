"""`distbench topo`: the topology snapshot every benchmark run stores, without a benchmark.
Standalone it snapshots this machine; under torchrun, one snapshot per node, gathered."""

from __future__ import annotations

import sys

from distbench import results, topo
from distbench import session as session_mod
from distbench.console import Console


def run(opts) -> int:
    """Under a launcher: the session start has already gathered one snapshot per node."""
    def body(s: session_mod.Session) -> int:
        if s.rt.rank == 0:
            print_summary(s.console, s.rt.snapshots)
        return session_mod.EXIT_OK
    return session_mod.run("topo", opts, body)


def run_local(opts) -> int:
    """No workers needed to look at one machine."""
    snapshots = [topo.node_snapshot()]
    run_dir = results.new_run_dir(opts.out, "topo")
    record = results.RunRecord(run_dir, "topo", opts.to_json(), opts.argv)
    record.update(nnodes=1)
    session_mod.write_topology(run_dir, snapshots)
    console = Console(True)
    print_summary(console, snapshots)
    record.finish("ok", session_mod.EXIT_OK)
    console.log(f"results in {run_dir}/")
    return session_mod.EXIT_OK


def print_summary(console: Console, snapshots: list[dict]) -> None:
    """A readable digest on stdout; the full text is in topo.txt."""
    for snap in snapshots:
        lines = [f"node {snap.get('host')}"]
        gpus = snap.get("gpus") or []
        for g in gpus:
            mem = (g.get("memory_total_bytes") or 0) / 2**30
            lines.append(
                f"  GPU{g.get('index')}  {g.get('name')}  {mem:.0f} GiB  PCIe gen "
                f"{g.get('pcie_gen_current')}/{g.get('pcie_gen_max')} x"
                f"{g.get('pcie_width_current')}/{g.get('pcie_width_max')}  "
                f"NVLinks up {g.get('nvlinks_up')}"
                + (f" v{g['nvlink_version']}" if g.get("nvlink_version") else ""))
        if gpus:
            lines.append(f"  driver {snap.get('driver_version')}, CUDA "
                         f"{snap.get('cuda_driver_version')}")
        links = topo.parse_topo_matrix(snap.get("nvidia_smi_topo") or "")["links"]
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
        if console.enabled:
            print("\n".join(lines), file=sys.stdout, flush=True)
