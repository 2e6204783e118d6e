"""`distbench report RUN_DIR ...`: report.md, plots and model.json for runs of any command and
for nccl-tests logs; `--predict op:size` prints the fitted model's figures instead."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

HELP = ("Plots, a Markdown summary and the alpha-beta model of runs (distbench run directories "
        "or nccl-tests logs).")
EXAMPLES = (
    "distbench report results/<run> results/<other run>",
    "distbench report results/<run> --predict all_reduce:1G",
)


def default_out(inputs: list[Path]) -> Path:
    """One run directory: its report/ subdirectory. Otherwise a new directory under results/."""
    if len(inputs) == 1 and inputs[0].is_dir():
        return inputs[0] / "report"
    return Path("results") / (datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + "-report")


def command(
    runs: Annotated[list[Path], typer.Argument(
        help="Run directories (results/<run>) or nccl-tests logs (stdout or -J JSON).",
        show_default=False)],
    # the default as show_default, not as "[default: ...]" in the help: rich reads a bracket
    # there as markup and drops it, leaving "go ."
    out: Annotated[Path | None, typer.Option(
        help="Where report.md, model.json and the PNGs go.",
        show_default="RUN_DIR/report for one run directory, else results/<UTC time>-report")
    ] = None,
    predict: Annotated[str | None, typer.Option(
        help="Print the model's time and busbw for OP:SIZE (all_reduce:1G) instead of "
        "writing the report.", show_default=False)] = None,
) -> None:
    from distbench.core.exitcodes import EXIT_FAILED
    from distbench.core.options import OptionError, check_writable_dir
    from distbench.core.tables import plural
    from distbench.kinds.registry import KINDS
    from distbench.results import reader, report
    from distbench.results.alphabeta import parse_predict

    loaded = reader.load_all(runs)  # every input read before anything is written
    if predict is not None:
        # an op is known when distbench measures it or a run read fits it (nccl-tests' sendrecv)
        fits = [f for run in loaded for f in report.fits_of(run, KINDS.values())]
        fitted = {f["op"] for f in fits}
        try:
            op, size = parse_predict(predict, fitted)
        except ValueError as e:
            raise OptionError("--predict", str(e), "--predict all_reduce:1G") from None
    if predict is not None:
        for run in loaded:  # report.md names them too; a prediction has no report.md
            for line in reader.left_out(run):
                print(f"distbench: {run.name}: {line}", file=sys.stderr)
        lines = report.predict(fits, op, size)
        if not lines:
            raise OptionError("--predict", f"no run here has a fitted model for {op}",
                              "--predict all_reduce:1G")
        print("\n".join(lines))
        raise typer.Exit(0)
    target = out or default_out(runs)
    if target.exists() and not target.is_dir():
        raise OptionError("--out", f"{str(target)!r} is a file, not a directory",
                          "--out report")
    check_writable_dir("--out", target, "--out report")
    try:
        lines, files = report.write(loaded, target, KINDS.values())
    except OSError as e:  # a full disk, a directory made read-only since the check
        print(f"distbench: error: cannot write the report in {target}: {e.strerror or e}",
              file=sys.stderr)
        raise typer.Exit(EXIT_FAILED) from None
    print("\n".join(lines))
    print(f"distbench: report in {target}/ ({plural(len(files), 'file')}: "
          f"{', '.join(f.name for f in files)})", file=sys.stderr)
