"""Shared by report's tests: what a drawn plot and a report.md must look like."""

from __future__ import annotations

import struct
from pathlib import Path

from helpers import cli
from runs import write_csv, write_meta

from distbench.kinds.watch import output as watch_output
from distbench.results import plots, reader
from distbench.results.reader import required


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk, after checking the signature."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert data.rstrip(b"\x00")[-8:-4] == b"IEND", f"{path} is cut short"
    return width, height


def _sensible(path: Path) -> None:
    width, height = png_size(path)
    assert 300 <= width <= 4000 and 200 <= height <= 4000, (path.name, width, height)
    assert path.stat().st_size > 5000  # a drawn plot, not an empty canvas


def _gloo_collective(path: Path, alpha_us: float = 200.0, gbps: float = 1.0,
                     ops=("all_reduce",), busbw=None) -> Path:
    """collective.csv of 2 gloo ranks on the line T = alpha + S / beta; `busbw` replaces the
    busbw cell of the third size."""
    path.mkdir(parents=True)
    rows = []
    for op in ops:
        for i, size in enumerate((1024, 65536, 1 << 20, 1 << 24)):
            t = alpha_us + size / (gbps * 1e3)
            rate = size / t / 1e3
            rows.append({"op": op, "dtype": "float32", "redop": "sum", "root": -1,
                         "in_place": 0, "world_size": 2, "nnodes": 1, "size_bytes": size,
                         "time_us": t, "p99_us": t, "algbw_gbps": rate,
                         "busbw_gbps": busbw if busbw is not None and i == 2 else rate,
                         "status": "ok"})
    write_csv(path / "collective.csv", required()["collective.csv"], rows)
    write_meta(path, "collective", schema_version=1)
    return path


def _report(run: Path) -> tuple[str, Path]:
    """`distbench report RUN` in this process: report.md's text and the watch plot."""
    res = cli(run.parent, "report", str(run))
    assert res.returncode == 0, res.stdout + res.stderr
    text = (run / "report" / "report.md").read_text()
    png = run / "report" / f"watch_{run.name}.png"
    _sensible(png)
    assert f"![{png.stem}]({png.name})" in text
    return text, png


def _section(text: str) -> str:
    return text[text.index("### Watch"):text.index("## Plots")]


def _table(section: str, heading: str) -> list[list[str]]:
    """The rows of the table after `heading`, cells stripped."""
    lines = section[section.index(heading):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows[2:]  # past the header and its rule


def _drawn(run: Path) -> dict[str, dict]:
    """Per panel (its probe): the busbw line's points, the cycles marked late, and the
    vertical lines drawn (gid -> (cycle, colour))."""
    fig = watch_output.watch_figure(reader.load(run))
    try:
        out = {}
        for ax in fig.axes:
            if not ax.get_title():
                continue
            (line,) = [x for x in ax.get_lines() if x.get_gid() == "busbw"]
            late = [c for c in ax.collections if c.get_gid() == "late"]
            out[ax.get_title()] = {
                "busbw": list(zip(line.get_xdata(), line.get_ydata(), strict=True)),
                "late": [float(x) for c in late for x, _ in c.get_offsets()],
                "lines": {x.get_gid(): (float(x.get_xdata()[0]), x.get_color())
                          for x in ax.get_lines() if x.get_gid() not in (None, "busbw")},
                "xticks": list(ax.get_xticks())}
        return out
    finally:
        plots.plt.close(fig)
