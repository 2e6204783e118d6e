"""A new command is its folder and one registration (docs/architecture.md, "A new command"): a
throwaway kind written into a temporary folder, outside the package, is registered by its own
entry script, and from that line alone it is a command in --help with its options, runs on two
ranks under torchrun, and its runs are read back by report (its section and its plot) and by
compare (its rows matched, a planted slowdown caught, the same run twice quiet). No file of the
package is touched."""

from __future__ import annotations

import csv
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import clean_env, processes, torchrun_nodes

from distbench.core.exitcodes import EXIT_BELOW, EXIT_OK

FILES = {
    "__init__.py": """
        from throwkind import body, options, output

        from distbench.kinds.kind import Kind

        KIND = Kind("throw", help=options.HELP, options=options.ThrowOptions, run=body.run,
                    examples=options.EXAMPLES, outputs=(output.OUTPUT,),
                    section=output.section, plots=output.draw)
    """,
    "options.py": """
        from dataclasses import dataclass

        from distbench.core.options import RunOptions, at_least, option

        HELP = "Throwaway: time a barrier, once per size of a made-up sweep."
        EXAMPLES = ("distbench throw --width 3",)


        @dataclass(kw_only=True)
        class ThrowOptions(RunOptions):
            width: int = option(2, "Rows to write.", check=at_least(1, "--width 2"))
    """,
    "body.py": """
        import time

        from throwkind.output import OUTPUT


        def run(s):
            import torch.distributed as dist

            sink = s.sink(OUTPUT)
            for i in range(s.opts.width):
                start = time.perf_counter()
                dist.barrier()
                us = (time.perf_counter() - start) * 1e6
                sink.append({"item": f"item{i}", "world_size": s.rt.world, "time_us": us + 100.0,
                            "status": "ok"})
            return 0
    """,
    "output.py": """
        from distbench.core.tables import Output

        OUTPUT = Output("throw.csv", csv=("item", "world_size", "time_us", "status"),
                        identity=("item", "world_size"), read=("time_us", "status"),
                        time="time_us", group=lambda row: "throw")


        def section(run):
            frame = run.table("throw.csv")
            if frame is None:
                return []
            return ["### Throwaway", "", f"{len(frame)} rows, the slowest "
                    f"{frame['time_us'].max():.0f} us", ""]


        def draw(runs, out):
            from distbench.results import plots

            fig, ax = plots.plt.subplots()
            for run in runs:
                frame = run.table("throw.csv")
                if frame is not None:
                    ax.plot(range(len(frame)), frame["time_us"], label=run.name)
            return [plots.save(fig, out / "throw_time.png")]
    """,
}
MAIN = """
import throwkind

from distbench.kinds import register

register(throwkind.KIND)  # the one line: before the command line is built from the registry

from distbench.cli.app import main  # noqa: E402

main()
"""


@pytest.fixture
def kind_dir(tmp_path: Path) -> Path:
    where = tmp_path / "plugin"
    (where / "throwkind").mkdir(parents=True)
    for name, text in FILES.items():
        (where / "throwkind" / name).write_text(textwrap.dedent(text))
    (where / "throw_main.py").write_text(MAIN)
    return where


def _main(kind_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The entry script, here (no launcher): --help, report and compare start no worker."""
    with processes(1):
        return subprocess.run([sys.executable, str(kind_dir / "throw_main.py"), *args],
                              cwd=cwd, env=clean_env(PYTHONPATH=str(kind_dir)),
                              capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


@pytest.mark.multiproc
@pytest.mark.procs(3)
def test_a_kind_in_a_folder_of_its_own_is_a_command_reported_and_compared(kind_dir, tmp_path):
    top = _main(kind_dir, "--help", cwd=tmp_path)
    assert top.returncode == 0, top.stderr
    assert "throw " in top.stdout
    assert "Throwaway: time a barrier" in " ".join(top.stdout.split())
    own = _main(kind_dir, "throw", "--help", cwd=tmp_path)
    assert own.returncode == 0 and "--width" in own.stdout, own.stderr
    bad = _main(kind_dir, "throw", "--width", "0", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.startswith("distbench: error: --width"), bad.stderr

    out = tmp_path / "runs"
    out.mkdir()
    (agent,) = torchrun_nodes(out, 1, 2, [["throw", "--width", "3"]],
                              script=(str(kind_dir / "throw_main.py"),),
                              PYTHONPATH=str(kind_dir))
    assert agent.returncode == 0, agent.stderr
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    with open(run / "throw.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["item"] for r in rows] == ["item0", "item1", "item2"]
    assert {r["world_size"] for r in rows} == {"2"} and all(float(r["time_us"]) > 100
                                                            for r in rows)

    reported = _main(kind_dir, "report", str(run), "--out", str(tmp_path / "report"),
                     cwd=tmp_path)
    assert reported.returncode == 0, reported.stderr
    text = (tmp_path / "report" / "report.md").read_text()
    assert "### Throwaway" in text and "3 rows" in text and "No result rows" not in text
    assert (tmp_path / "report" / "throw_time.png").stat().st_size > 0

    same = _main(kind_dir, "compare", str(run), str(run), cwd=tmp_path)
    assert same.returncode == EXIT_OK, same.stdout + same.stderr
    assert "(0 +, 0 -, 3 ~, 0 x)" in same.stdout and "no row worse" in same.stdout, same.stdout

    slow = tmp_path / "slow"
    shutil.copytree(run, slow)
    (slow / "throw.samples.jsonl").unlink(missing_ok=True)  # the samples of the run, not these
    for r in rows:
        r["time_us"] = str(float(r["time_us"]) * 3)
    with open(slow / "throw.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    worse = _main(kind_dir, "compare", str(run), str(slow), "--metric", "time", cwd=tmp_path)
    assert worse.returncode == EXIT_BELOW, worse.stdout + worse.stderr
    assert "3 rows worse" in worse.stdout, worse.stdout
