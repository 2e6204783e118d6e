"""The refactor's guard: a fixed small collective sweep and a p2p sweep at world size 3 with
--iters fixed write the same CSV headers and the same non-timing cells as the recorded run in
tests/golden/ (recorded before the sweep engine replaced the per-command loops). Timing cells
must be present exactly where the recording has them. The collective sweep is run once, in
test_collective_multiproc.py (its world-size-3 run, checked there by both this recording and
the accounting rules); the p2p sweep here. The recording, and how to make it again:
tests/golden_runs.py.
"""

from __future__ import annotations

import pytest
from golden_runs import RECORDED, assert_matches_recording
from helpers import distbench

pytestmark = pytest.mark.multiproc


def test_p2p_csv_matches_the_recorded_run(tmp_path):
    assert_matches_recording("p2p", distbench(tmp_path, *RECORDED["p2p"]))

