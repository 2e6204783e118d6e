"""p2p's command line where only a process of its own shows it: the launcher's environment. The
rest, in-process: test_cli_p2p.py."""

from __future__ import annotations

import helpers
import pytest
from cli_helpers import _assert_nothing_written
from helpers import assert_one_line_error


@pytest.mark.multiproc  # the launcher's environment, as a process of its own gets it
def test_p2p_needs_two_ranks_under_a_launcher(tmp_path):
    """Under torchrun the world size comes from the environment."""
    out = tmp_path / "results"
    proc = helpers.distbench(out, "p2p", cwd=tmp_path, procs=1, WORLD_SIZE="1")
    line = assert_one_line_error(proc, proc.secs, "--workers", ours=True)
    assert "2 ranks" in line
    _assert_nothing_written(tmp_path, out)
