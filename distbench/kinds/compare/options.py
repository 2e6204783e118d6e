"""`distbench compare BASE NEW`: row by row, with significance, and exit 4 when a row got worse
beyond the threshold: a CI gate."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from distbench.core.exitcodes import EXIT_BELOW, EXIT_OK
from distbench.core.option_checks import completer
from distbench.core.tables import Output

HELP = ("Compare two runs row by row (ratio, Mann-Whitney p-value, + - ~ x); exit 4 when a row "
        "is worse beyond the threshold and the noise.")
EXAMPLES = (
    "distbench compare results/<base> results/<new>",
    "distbench compare results/<base> results/<new> --metric time --format md",
)
FORMATS = ("text", "md", "csv")


def command(
    base: Annotated[Path, typer.Argument(help="The reference run directory (or nccl-tests log).",
                                         show_default=False)],
    new: Annotated[Path, typer.Argument(help="The run to judge against it.",
                                        show_default=False)],
    threshold: Annotated[str, typer.Option(
        help="The smallest change called better or worse; smaller is ~, or x where the "
             "noise is larger (5% or 0.05).")] = "5%",
    metric: Annotated[str, typer.Option(
        help="auto (busbw where a file records one, else its time; a training step's is its "
             "step time), busbw, time or p99.", metavar="<name>",
        autocompletion=completer(lambda: Output.METRICS))] = "auto",
    format: Annotated[str, typer.Option(
        "--format", help="text, md (for a pull request) or csv.", metavar="<name>",
        autocompletion=completer(lambda: FORMATS))] = "text",
) -> None:
    from distbench.core.options import one_of
    from distbench.results import compare, comparison_text, reader

    limit = parse_threshold(threshold)
    metric = one_of(compare.METRICS, "--metric busbw")("--metric", metric)
    format = one_of(FORMATS, "--format md")("--format", format)
    b, n = reader.load(base), reader.load(new)
    c = compare.compare(b, n, metric, limit)
    text = comparison_text
    lines = (text.format_markdown(c, b, n) if format == "md" else
             text.format_csv(c) if format == "csv" else text.format_text(c, b, n))
    print("\n".join(lines))
    raise typer.Exit(EXIT_BELOW if c.worse else EXIT_OK)


def parse_threshold(text: str) -> float:
    """'5%' or '0.05' -> 0.05; one line and exit 2 on anything else."""
    from distbench.core.options import OptionError

    raw = str(text).strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise OptionError("--threshold", f"not a percentage: {raw!r}", "--threshold 5%") \
            from None
    if not 0 <= value < 1:
        raise OptionError("--threshold", f"must be from 0% to below 100%, got {raw}",
                          "--threshold 5%")
    return value
