"""`distbench p2p`: ring and ping-pong over the size sweep, and the pairwise link matrix (every
ordered pair measured alone while the others wait, one-way and bidirectional) with outliers
judged against their own class of link."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from distbench.core.exitcodes import EXIT_BELOW
from distbench.core.options import SweepOptions, at_least_two, fraction, option, pick
from distbench.results.baseline import check_world as baseline_world
from distbench.results.baseline import option_check

if TYPE_CHECKING:
    pass

PATTERNS = ("ring", "pingpong", "matrix")

HELP = "Point-to-point: ring, ping-pong latency, and the pairwise link matrix with outliers."
EXAMPLES = (
    "distbench p2p --pattern ring --sizes 8:128M:x2",
    "distbench p2p --pattern pingpong --sizes 8:64K:x2 --workers 4",
)


@dataclass(kw_only=True)
class P2POptions(SweepOptions):
    patterns: list[str] = option(
        "ring", "ring (send to r+1, receive from r-1), pingpong (pairs i, i+n/2: one-way "
        "latency), matrix (every ordered pair alone); comma list or 'all'.", flag="pattern",
        check=pick(PATTERNS, "--pattern ring,pingpong"), cli_type=str)
    outlier_below: float = option(
        0.8, "matrix: name links below this fraction of what the healthy links of their class "
        "reach (intra-node and inter-node links judged apart).",
        check=fraction("--outlier-below 0.8"))
    fail_below: float | None = option(
        None, f"matrix: exit {EXIT_BELOW} when a link is below this fraction of what the "
        "healthy links of its class reach.",
        check=fraction("--fail-below 0.8", optional=True), show_default=False)
    baseline: str | None = option(
        None, "A previous p2p run directory: print the comparison with it at the end "
        f"(as distbench compare), and exit {EXIT_BELOW} when a row is worse by more than 5% and "
        "beyond the noise the two runs show.", check=option_check("p2p.csv", "p2p_matrix.csv"),
        cli_type=str, show_default=False)

    def check_world(self, world: int) -> None:
        at_least_two("p2p", world)
        baseline_world(self.baseline, ("p2p.csv", "p2p_matrix.csv"), world)


