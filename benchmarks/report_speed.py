"""How long `distbench report` takes, whole process (interpreter start, pandas, matplotlib, the
plots), on a collective run of 100 rows. Issue 11 asks for under 3 s. The run is written here
from synthetic timings in collective.csv's exact columns, so this needs no workers and
measures the report alone.

    python benchmarks/report_speed.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from distbench.kinds.collective.output import OUTPUT
from distbench.ops.collectives import OPS, names
from distbench.results import samples

ROWS = 100


def write_run(path: Path) -> int:
    """A run of ROWS rows: the collectives over a sweep from 1 KiB up, with samples."""
    path.mkdir(parents=True)
    lines, kept, n = [",".join(OUTPUT.csv)], [], 0
    sizes = [1024 << (2 * i) for i in range(ROWS // len(names()) + 1)]
    for op in names():
        for size in sizes:
            if n == ROWS:
                break
            t = 20.0 + size / 50e3  # alpha 20 us, beta 50 GB/s
            algbw = size / t / 1e3
            cells = {"op": op, "dtype": "float32", "redop": "sum", "root": -1, "in_place": 0,
                     "world_size": 8, "nnodes": 1, "size_bytes": size, "count": size // 4,
                     "iters": 100, "time_us": t, "p99_us": t * 1.1, "algbw_gbps": algbw,
                     "busbw_gbps": algbw * OPS[op].accounting.factor(8), "status": "ok"}
            lines.append(",".join(str(cells.get(c, "")) for c in OUTPUT.csv))
            kept.append(samples.encode(n, [t * (1 + 0.01 * (i % 7)) for i in range(100)]))
            n += 1
    (path / "collective.csv").write_text("\n".join(lines) + "\n")
    (path / "collective.samples.jsonl").write_text("".join(kept))
    (path / "run.json").write_text('{"command": "collective", "status": "ok", "exit_code": 0}')
    return n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        rows = write_run(run)
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "distbench", "report", str(run), "--out",
                            str(Path(tmp) / "report")], check=True, capture_output=True)
            times.append(time.perf_counter() - start)
        pngs = sorted(p.name for p in (Path(tmp) / "report").glob("*.png"))
    print(f"distbench report, {rows} rows, {len(pngs)} plots ({', '.join(pngs)}):")
    print(f"  whole process: median {statistics.median(times):.2f} s, "
          f"min {min(times):.2f} s, max {max(times):.2f} s over {len(times)} runs "
          f"(target: under 3 s)")


if __name__ == "__main__":
    main()
