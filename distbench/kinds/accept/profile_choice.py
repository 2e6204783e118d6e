"""The profile every rank of `distbench accept` runs. Rank 0 resolves it: `--profile auto` picks
from what the ranks see (their GPUs, as torch names them, and how many per node), NVML's
snapshot counting them (pick_for_nodes); a name or a file is read there (profile_files.resolve).
Rank 0 then sends its text, not its path, with what it knows of every node
(profile_model.NodeFacts: GPUs, NVLS), and every rank parses that same text: a path resolved on
each node reads another file, or none, where the nodes differ. Apart from profile_files.py and
profile_toml.py, which import no torch, so that the options are validated without it."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import torch.distributed as dist

from distbench.core.exitcodes import EXIT_BAD_INPUT
from distbench.kinds.accept.profile_files import builtin, builtin_paths, load, resolve
from distbench.kinds.accept.profile_model import (
    CPU_PROFILE,
    EXAMPLE,
    GENERIC_PROFILE,
    NodeFacts,
    Profile,
    ProfileError,
)
from distbench.kinds.accept.profile_toml import parse
from distbench.run.runtime import RunFailure

NAMED = "named on the command line"


def _gpu_name(gpu: dict) -> str:
    name = gpu.get("name")
    return str(name).strip() if name else "unknown GPU"


def node_facts(snapshots: list[dict], ranks: list[dict] | None = None
               ) -> tuple[NodeFacts, ...]:
    """Each node's facts, by node index: the GPUs its ranks run on (rt.ranks: host, node and
    torch's device name), counted by NVML in its host's topo snapshot. Without ranks, one node
    per snapshot, on NVML's word alone."""
    if not ranks:
        return tuple(_facts(str(s.get("host") or "?"), s, []) for s in snapshots)
    by_host = {str(s.get("host")): s for s in snapshots}
    on: dict[int, list[dict]] = {}
    for r in ranks:
        on.setdefault(r["node"], []).append(r)
    hosts = {i: str(rs[0]["host"]) for i, rs in on.items()}
    # several launcher agents on one host share its snapshot: host#index, as runtime.node_names
    repeated = len(set(hosts.values())) < len(hosts)
    return tuple(_facts(f"{hosts[i]}#{i}" if repeated else hosts[i], by_host.get(hosts[i]), on[i])
                 for i in sorted(on))


def _facts(name: str, snap: dict | None, ranks: list[dict]) -> NodeFacts:
    listed = Counter(_gpu_name(g) for g in (snap or {}).get("gpus") or [])
    used = Counter(str(r["device"]) for r in ranks if r.get("device") not in (None, "cpu"))
    # NVML can fail (driver mismatch, no libnvidia-ml in a container) while the ranks run on
    # their GPUs: those name the model, and count at least as many as NVML lists
    gpus = {m: max(listed[m], n) for m, n in used.items()} if used else dict(listed)
    return NodeFacts(name, tuple(sorted(gpus.items())),
                     counted=all(listed[m] >= n for m, n in used.items()),
                     nvml_error=(snap.get("nvml_error") if snap is not None
                                 else "no topology snapshot from this node"),
                     nvls=(snap or {}).get("nvls"),
                     nvls_why=(snap or {}).get("nvls_why") or "unknown")


def _describe(hardware: tuple[tuple[str, int], ...]) -> str:
    if not hardware:
        return "no GPU"
    return ", ".join(f"{count} x {name}" for name, count in hardware)


def _listed(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _generic(why: str) -> tuple[Profile, str]:
    return (builtin(GENERIC_PROFILE),
            f"{why}: {GENERIC_PROFILE} (judges nodes against their peers, no absolute figures)")



def pick_for_nodes(snapshots: list[dict], ranks: list[dict] | None = None,
                   backend: str | None = None) -> tuple[Profile, str]:
    """--profile auto: the built-in profile for the GPUs the ranks run on and how many each
    node has (node_facts), and one line saying why; the nodes' facts come with it. Backend
    nccl never gets cpu-gloo, whose millisecond floors any GPU passes."""
    if not snapshots and not ranks:
        raise ProfileError("auto: no node's topology snapshot to pick a profile from",
                           EXAMPLE)
    nodes = node_facts(snapshots, ranks)
    profile, why = _choose(nodes, bool(ranks) and all(
        r.get("device") in (None, "cpu") for r in ranks), backend)
    return replace(profile, nodes=nodes), why


def _choose(nodes: tuple[NodeFacts, ...], on_cpu: bool, backend: str | None
            ) -> tuple[Profile, str]:
    every = "every node has" if len(nodes) > 1 else "the node has"
    errors = [n.nvml_error for n in nodes if n.nvml_error]
    if on_cpu and backend != "nccl":
        seen = [n for n in nodes if n.gpus]
        if seen:  # gloo on GPU nodes measures the CPU: the GPU floors would fail it
            return builtin(CPU_PROFILE), (
                f"the ranks run on the CPU (backend {backend}; NVML sees "
                f"{_describe(seen[0].gpus)} on {_listed([n.name for n in seen])}; --backend "
                f"nccl measures them): {CPU_PROFILE}")
    models = {tuple(m for m, _ in n.gpus) for n in nodes}
    if len(models) > 1:
        groups: dict[tuple, list[str]] = {}
        for n in nodes:
            groups.setdefault(n.gpus, []).append(n.name)
        parts = [f"{_describe(hardware)} on {_listed(names)}" for hardware, names in
                 sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1]))]
        return _generic(f"nodes differ ({'; '.join(parts)})")

    (model,) = models
    nvml = f" (NVML: {errors[0]})" if errors else ""
    if not model:
        if backend == "nccl":
            return _generic(f"the ranks report no GPU under nccl{nvml}")
        reason = "no node has a GPU" if len(nodes) > 1 else "the node has no GPU"
        return builtin(CPU_PROFILE), f"{reason}{nvml}: {CPU_PROFILE}"
    if len(model) > 1:
        return _generic(f"{every} {_describe(nodes[0].gpus)}: more than one GPU model in a "
                        "node")

    gpu, count = model[0], max(n.count for n in nodes)
    # a node short of GPUs is no other kind of node: the others' profile, which names it
    short = [f"{n.name} has {n.count}" for n in nodes if n.count < count]
    have = (f"the nodes have {count} x {gpu}, but {_listed(short)}" if short
            else f"{every} {count} x {gpu}")
    counted = all(n.counted for n in nodes)
    if not counted:
        err = next((n.nvml_error for n in nodes if not n.counted and n.nvml_error), None)
        have += f" (counted from its ranks; NVML: {err})" if err else \
            " (counted from its ranks: NVML lists fewer)"
    profiles = [load(p) for n, p in builtin_paths().items()
                if n not in (CPU_PROFILE, GENERIC_PROFILE)]
    # counted from the ranks, a node has at least that many: a profile for more may fit
    fits = [p for p in profiles
            if p.matches(gpu, count if counted else max(count, p.gpus_per_node or 0))]
    if fits:
        # the most specific: a fixed GPU count, then the longest name matched
        best = max(fits, key=lambda p: (p.gpus_per_node is not None, len(p.match_gpu or ""),
                                        p.name))
        return best, f"{have}: {best.name}"
    model_only = [p for p in profiles if p.matches(gpu, p.gpus_per_node or count)]
    if model_only:
        wants = ", ".join(f"{p.name} is for {p.gpus_per_node} per node" for p in model_only)
        return _generic(f"{have} ({wants})")
    return _generic(f"{have}, which no profile matches")


def agree(rt, spec: str) -> tuple[Profile, str]:
    """Every rank: the profile rank 0 chose from `spec` (--profile: auto, a built-in's name or
    a file), with the nodes' facts, and one line saying why. A profile rank 0 cannot read is
    a RunFailure (exit 2) on every rank alike, so that none waits for a broadcast."""
    sent: list = [None]
    if rt.rank == 0:
        try:
            named = resolve(spec)
            profile, why = (pick_for_nodes(rt.snapshots, rt.ranks, rt.backend) if named is None
                            else (named, NAMED))
            nodes = profile.nodes or node_facts(rt.snapshots, rt.ranks)
            sent = [(str(profile.path), profile.path.read_text(encoding="utf-8"), why, nodes)]
        except (ProfileError, OSError) as e:
            sent = [str(e)]
    dist.broadcast_object_list(sent, src=0)
    if isinstance(sent[0], str):
        raise RunFailure(sent[0], status="bad_input", exit_code=EXIT_BAD_INPUT)
    path, text, why, nodes = sent[0]
    try:
        profile = parse(text, Path(path))
    except ProfileError as e:  # changed since rank 0 read it: every rank fails alike
        raise RunFailure(str(e), status="bad_input", exit_code=EXIT_BAD_INPUT) from None
    return replace(profile, nodes=nodes), why
