"""Reading ``nvidia-smi topo -m``, as a node's topology snapshot (topo_probe.py) holds it: the
GPU-to-GPU link of each ordered pair of GPUs. Torch-free.
"""

from __future__ import annotations

import re

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Matrix column names: GPU0, NIC3, and older drivers' raw HCA names like mlx5_0;
# NV# is a link cell, never a device name.
_DEVICE_RE = re.compile(r"^(?!NV\d+$)[A-Za-z][\w.:\-]*\d$")
_GPU_RE = re.compile(r"^GPU\d+$")


def _find_header(lines: list[str]) -> tuple[int, list[str]] | None:
    for i, line in enumerate(lines):
        tokens = line.split()
        if not tokens or not _DEVICE_RE.match(tokens[0]):
            continue
        # A data row has a link cell (" X ", "NV18", "SYS") right after its
        # name; the header has another device name or the affinity columns.
        if "Affinity" in tokens or (len(tokens) > 1 and _DEVICE_RE.match(tokens[1])):
            devices = []
            for tok in tokens:
                if not _DEVICE_RE.match(tok):
                    break
                devices.append(tok)
            return i, devices
    return None


def parse_topo_matrix(text: str) -> dict:
    """Parse ``nvidia-smi topo -m`` into its GPU-to-GPU part.

    Returns {"devices": ["GPU0", ...], "links": {"GPU0-GPU1": "NV18", ...}} with
    one entry per ordered pair of distinct GPUs; NIC rows/columns, affinity
    columns and the legend are ignored.  Unparseable input gives empty results.
    """
    lines = _ANSI_RE.sub("", text or "").splitlines()
    found = _find_header(lines)
    if found is None:
        return {"devices": [], "links": {}}
    header_idx, columns = found
    gpu_cols = [(j, name) for j, name in enumerate(columns) if _GPU_RE.match(name)]

    devices: list[str] = []
    links: dict[str, str] = {}
    for line in lines[header_idx + 1 :]:
        tokens = line.split()
        if not tokens:
            continue
        if tokens[0].rstrip(":") == "Legend":
            break
        row = tokens[0]
        if not _GPU_RE.match(row) or row not in columns:
            continue
        cells = tokens[1:]
        if len(cells) < len(columns):
            continue
        devices.append(row)
        for j, col in gpu_cols:
            if col != row:
                links[f"{row}-{col}"] = cells[j]
    return {"devices": devices, "links": links}
